"""Proof times of the relaxation branch and bound (``cbo.solvers.enumerate.relaxation_search``) on Fisher-type QUBOs.

Grids (``--grid``, comma-separated):

* ``real``: the committed SmolLM2 sublayer Fisher QUBO (N = 60, 32 samples) at M = 8, 16, 24, 30;
* ``n80``: the 80-block Fisher-shaped instances of ``benchmarks/fisher_instances.py`` (32, 128 and 2048
  gradient samples) at M = 32 and 40;
* ``scaling``: ``fisher_block_qubo(n, seed=0, samples=s)`` for n = 30..80 and s = 32, 2048 at M = n/4 and 2n/5
  (how the proof time grows with N and M).

``--compare auto,cpsat,enumerate`` also runs those solvers through ``cbo.solve`` (``--compare-limit`` seconds
each; ``auto`` without a limit, as users call it) and records their energies against the proven ones;
``relaxation+auto`` (after ``auto`` in the list) is the relaxation search seeded with auto's states (its threshold
starts at auto's k-th best and auto's states join the answer, so it is never worse than auto). Every
run is one JSON line in ``--out/results.jsonl``; a rerun skips the runs already recorded, so an interrupted
measurement loses nothing. The Markdown table goes to stdout and ``--out/table.md``; ``--plot`` draws the
scaling grid's proof times (needs matplotlib). One thread; report CPU seconds beside wall time::

    PYTHONPATH=. OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/relaxation.py --grid real,n80
    PYTHONPATH=. NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/relaxation.py --grid real,n80 --compare auto,cpsat
    PYTHONPATH=. NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/relaxation.py --grid scaling --time-limit 300 --plot
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from cbo.instances import fisher_block_qubo
from cbo.qubo import BlockQUBO
from cbo.solvers.base import Problem
from cbo.solvers.enumerate.relaxation_search import search_top_k

HERE = Path(__file__).resolve().parent
INSTANCES = HERE / "instances"
OUT = HERE / "out" / "relaxation"
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


def run_relaxation(q: BlockQUBO, m: int, k: int, time_limit: float, seed: dict | None = None) -> dict[str, Any]:
    """The relaxation search; ``seed``: a recorded run whose states start the threshold and join the answer."""
    problem = Problem(q, m, k, 0, None)
    seeds = None
    if seed is not None:
        seeds = np.zeros((len(seed["states"]), q.n), dtype=np.uint8)
        for row, removed in enumerate(seed["states"]):
            seeds[row, removed] = 1
        seeds = seeds[:, problem.free]
    res = search_top_k(problem.Q, problem.r, k, time_limit=time_limit, seed_states=seeds)
    return {
        "exact": res.exact,
        "seconds": res.seconds,
        "cpu_seconds": res.cpu_seconds,
        "nodes": res.nodes,
        "covered": res.covered,
        "alpha": res.alpha,
        "root_bound": res.root_bound + problem.const,
        "shor_bound": None if res.info["shor_bound"] is None else res.info["shor_bound"] + problem.const,
        "energies": [float(e) + problem.const for e in res.energies],
        "states": [np.flatnonzero(problem.expand(s[None])[0]).tolist() for s in res.states],
    }


def run_solver(q: BlockQUBO, m: int, k: int, solver: str, limit: float | None) -> dict[str, Any]:
    import cbo

    t0, c0 = time.perf_counter(), time.process_time()
    rs = cbo.solve(q, m, solver, k=k, seed=0, time_limit=limit)
    return {
        "exact": bool(rs.exact),
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
        "energies": [float(e) for e in rs.energies],
        "states": [np.flatnonzero(x).tolist() for x in np.asarray(rs.states)],
        "solver_name": rs.solver,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", default="real,n80", help="real, n80, scaling (comma-separated)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds per proof attempt")
    p.add_argument("--compare", default="", help="solvers to run beside it through cbo.solve, e.g. auto,cpsat")
    p.add_argument("--compare-limit", type=float, default=60.0, help="time limit of the compared solvers (not auto)")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--plot", action="store_true", help="plot the scaling grid's proof times")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "results.jsonl"
    done = {}
    if log.exists():
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            done[(rec["instance"], rec["M"], rec["solver"], rec["k"])] = rec
    grids = [g.strip() for g in args.grid.split(",") if g.strip()]
    solvers = ["relaxation"] + [s.strip() for s in args.compare.split(",") if s.strip()]
    machine = {"cpu_count": os.cpu_count(), "load_average": list(os.getloadavg()), "python": platform.python_version()}
    records = []
    # compile (or load from numba's cache) the search kernel before timing anything
    search_top_k(fisher_block_qubo(12, 0).qubo_matrix(), 4, 2)
    for name, q, m in instances(grids):
        for solver in solvers:
            key = (name, m, solver, args.k)
            if key in done:
                records.append(done[key])
                continue
            if solver == "relaxation":
                rec = run_relaxation(q, m, args.k, args.time_limit)
            elif solver == "relaxation+auto":
                auto = done.get((name, m, "auto", args.k)) or next(
                    (r for r in records if (r["instance"], r["M"], r["solver"]) == (name, m, "auto")), None
                )
                if auto is None:
                    raise SystemExit("relaxation+auto needs an auto run first: list auto before it in --compare")
                rec = run_relaxation(q, m, args.k, args.time_limit, seed=auto)
            else:
                rec = run_solver(q, m, args.k, solver, None if solver == "auto" else args.compare_limit)
            rec.update({"instance": name, "n": q.n, "M": m, "solver": solver, "k": args.k, "machine": machine})
            with log.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            records.append(rec)
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
    for label, pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        for n, t, exact in pts:
            if not exact:
                ax.annotate("limit", (n, t), fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("N (blocks)")
    ax.set_ylabel("CPU seconds to prove the top-10")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(path)


if __name__ == "__main__":
    main()
