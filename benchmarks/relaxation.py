"""Proof times of the exact enumerator's relaxation search (``cbo.solve(q, M, "enumerate")``) on Fisher-type QUBOs.

Grids (``--grid``, comma-separated):

* ``real``: the committed SmolLM2 sublayer Fisher QUBO (N = 60, 32 samples) at M = 8, 16, 24, 30;
* ``n80``: the 80-block Fisher-shaped instances of ``benchmarks/fisher_instances.py`` (32, 128 and 2048
  gradient samples) at M = 32 and 40;
* ``scaling``: ``fisher_block_qubo(n, seed=0, samples=s)`` for n = 30..80 and s = 32, 2048 at M = n/4 and 2n/5
  (how the proof time grows with N and M).

Every proof attempt is ``cbo.solve(q, M, "enumerate", k, strategy="relaxation", threads=1, time_limit=...)``: the
enumerator as users call it, seeded with ``auto``'s heuristic when its race does not prove the answer.
``--compare auto,cpsat`` also runs those solvers (``--compare-limit`` seconds each; ``auto`` without a limit, as
users call it) and records their energies against the proven ones. Every run is one JSON line in
``--out/results.jsonl``; a rerun skips the runs already recorded, so an interrupted measurement loses nothing.
The Markdown table goes to stdout and ``--out/table.md``; ``--plot`` draws the scaling grid's proof times (needs
matplotlib). One thread; report CPU seconds beside wall time::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 .venv/bin/python -m benchmarks.relaxation --grid real,n80
    NUMBA_NUM_THREADS=1 .venv/bin/python -m benchmarks.relaxation --grid real,n80 --compare auto,cpsat
    NUMBA_NUM_THREADS=1 .venv/bin/python -m benchmarks.relaxation --grid scaling --time-limit 120 --plot
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

import cbo
from benchmarks import harness as C
from cbo.qubo.block_qubo import BlockQUBO
from cbo.qubo.instances import fisher_block_qubo

INSTANCES = C.INSTANCES
REAL = "smollm2-135m_sublayer_fisher-kl"


def instances(grids: list[str]) -> Iterator[tuple[str, BlockQUBO, int]]:
    """(name, qubo, M) of every run in the grids."""
    if "real" in grids:
        q = BlockQUBO.load(INSTANCES / f"{REAL}.cboq")
        for m in (8, 16, 24, 30):
            yield REAL, q, m
    if "n80" in grids:
        for s in (2048, 128, 32):
            name = f"synthetic-fisher_layer_n80_s{s}"
            path = INSTANCES / f"{name}.cboq"
            q = BlockQUBO.load(path) if path.exists() else fisher_block_qubo(80, 0, samples=s)
            for m in (32, 40):
                yield name, q, m
    if "scaling" in grids:
        for s in (2048, 32):
            for n in (30, 40, 50, 60, 64, 70, 80):
                q = fisher_block_qubo(n, 0, samples=s)
                for m in sorted({n // 4, 2 * n // 5}):
                    yield f"fisher_block_qubo({n}, samples={s})", q, m


def run_relaxation(q: BlockQUBO, m: int, k: int, time_limit: float) -> dict[str, Any]:
    """One proof attempt by the enumerator's relaxation search (one thread)."""
    rec = run_solver(q, m, k, "enumerate", time_limit, strategy="relaxation", threads=1)
    info = rec.pop("info")
    rec.update({k: info[k] for k in ("nodes", "covered", "alpha", "root_bound", "shor_bound", "heuristic_seeds")})
    return rec


def run_solver(q: BlockQUBO, m: int, k: int, solver: str, limit: float | None, **options: Any) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    rs = cbo.solve(q, m, solver, k=k, seed=0, time_limit=limit, **options)
    return {
        "exact": bool(rs.exact),
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
        "energies": [float(e) for e in rs.energies],
        "states": [np.flatnonzero(x).tolist() for x in np.asarray(rs.states)],
        "solver_name": rs.solver,
        "info": rs.info,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = C.parser(__doc__, out="relaxation", threads=False)
    p.add_argument("--grid", default="real,n80", help="real, n80, scaling (comma-separated)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds per proof attempt")
    p.add_argument("--compare", default="", help="solvers to run beside it through cbo.solve, e.g. auto,cpsat")
    p.add_argument("--compare-limit", type=float, default=60.0, help="time limit of the compared solvers (not auto)")
    p.add_argument("--plot", action="store_true", help="plot the scaling grid's proof times")
    return C.main("relaxation", p, run, argv=argv, torch=False)


def run(job: C.Run) -> list[dict[str, Any]]:
    args, out = job.args, job.out
    log = C.RecordLog(out / "results.jsonl", ("instance", "M", "solver", "k"))
    grids = [g.strip() for g in args.grid.split(",") if g.strip()]
    solvers = ["relaxation"] + [s.strip() for s in args.compare.split(",") if s.strip()]
    machine = C.machine(torch_info=False)
    records = []
    # compile (or load from numba's cache) the kernels before timing anything
    run_relaxation(fisher_block_qubo(16, 0), 5, 2, 60.0)
    for name, q, m in instances(grids):
        for solver in solvers:
            done = log.get(instance=name, M=m, solver=solver, k=args.k)
            if done is not None:
                records.append(done)
                continue
            if solver == "relaxation":
                rec = run_relaxation(q, m, args.k, args.time_limit)
            else:
                rec = run_solver(q, m, args.k, solver, None if solver == "auto" else args.compare_limit)
                rec.pop("info")
            rec.update({"instance": name, "n": q.n, "M": m, "solver": solver, "k": args.k, "machine": machine})
            records.append(log.add(rec))
            print(
                f"{name} M={m} {solver}: exact={rec['exact']} {rec['seconds']:.1f} s (CPU {rec['cpu_seconds']:.1f} s) "
                f"E0={rec['energies'][0]:.6g}",
                flush=True,
            )
    table = markdown(records, args.k)
    print(table)
    (out / "table.md").write_text(table + "\n")
    if args.plot:
        plot(records, out / "proof_time.png")
    return records


def markdown(records: list[dict[str, Any]], k: int) -> str:
    """One row per (instance, M, solver): proven?, times, best energy, recall of the proven top-k, gap."""
    proven = {(r["instance"], r["M"]): r for r in records if r["solver"] == "relaxation" and r["exact"]}
    lines = [
        f"| instance | N | M | solver | proven | wall s | CPU s | nodes | E0 | E{k} | recall@{k} | gap E0 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        ref = proven.get((r["instance"], r["M"]))
        recall = gap = "–"
        if ref is not None:
            truth = {tuple(s) for s in ref["states"]}
            recall = f"{len(truth & {tuple(s) for s in r['states']}) / len(truth):.1f}"
            gap = f"{(r['energies'][0] - ref['energies'][0]) / abs(ref['energies'][0]):+.1%}"
        lines.append(
            f"| {r['instance']} | {r['n']} | {r['M']} | {r.get('solver_name', r['solver'])} | "
            f"{'yes' if r['exact'] else 'no'} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | "
            f"{_nodes(r)} | "
            f"{r['energies'][0]:.5g} | {r['energies'][-1]:.5g} | {recall} | {gap} |"
        )
    return "\n".join(lines)


def _nodes(r: dict[str, Any]) -> str:
    return f"{r['nodes']:.2g}" if isinstance(r.get("nodes"), int) else "–"


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    series: dict[str, list[tuple[int, float, bool]]] = {}
    for r in records:
        if r["solver"] != "relaxation" or not r["instance"].startswith("fisher_block_qubo("):
            continue
        samples = r["instance"].split("samples=")[1].rstrip(")")
        frac = "M=n/4" if r["M"] == r["n"] // 4 else "M=2n/5"
        series.setdefault(f"{samples} samples, {frac}", []).append((r["n"], r["cpu_seconds"], r["exact"]))
    for i, (label, pts) in enumerate(sorted(series.items())):
        pts.sort()
        proven = [p for p in pts if p[2]]
        ax.plot([p[0] for p in proven], [p[1] for p in proven], marker="o", color=f"C{i}", label=label)
        stopped = [p for p in pts if not p[2]]
        if stopped:  # the CPU time spent when the time limit stopped an unfinished proof
            ax.plot([p[0] for p in stopped], [p[1] for p in stopped], "x", ms=9, mew=2, color=f"C{i}")
    ax.plot([], [], "x", color="gray", label="not proven within the time limit (CPU s spent)")
    ax.set_yscale("log")
    ax.set_xlabel("N (blocks)")
    ax.set_ylabel("CPU seconds to prove the top-10")
    ax.set_title("Exact top-10 of fisher_block_qubo(N, samples) by the enumerator", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(path)


if __name__ == "__main__":
    main()
