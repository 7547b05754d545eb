"""Benchmark every available solver against proven optima: synthetic, real and Fisher-shaped QUBOs, one table.

Instances (``--instances``, comma-separated groups):

* ``synthetic``: ``random_block_qubo(n, seed)`` at (12, 4) (small enough for QAOA), (32, 8), (32, 16), (40, 12),
  (80, 8), (80, 32);
* ``real``: the default model's QUBOs in ``benchmarks/instances/`` (layer granularity, N = 30, at M = 8 and 15;
  the sublayer Fisher QUBO, N = 60, at M = 16 and 30);
* ``fisher``: the Fisher-shaped instances of ``benchmarks/fisher_instances.py`` (``cbo.qubo.instances.fisher_block_qubo``)
  with 32, 128 and 2048 gradient samples: 60 sublayers at M = 16 and 30, 80 layers at M = 32 and 40.

The reference of each (instance, M) is the exact enumerator's top-10 (``cbo.solve(q, M, "enumerate")``, which
takes its relaxation search on large spaces) under ``--reference-limit`` seconds: **proven** when it finishes,
else the best known (the 10 best distinct states of every run on that instance, the unfinished search
included), marked so. Per solver: wall time, the gap of its best energy to the reference ground energy (also
relative), and top-10 recall (its states with energy at or below the reference's 10th, so ties count; from
``cbo.solvers.sweep.solver_row``). Every solver runs with ``--time-limit`` seconds except ``auto``, which runs as
users call it (its own 10 s budget); the table checks that the time-limited ``enumerate`` is never worse than
``auto``, state by state.

    python -m benchmarks.solvers                               # every group (an hour or more on 2 cores)
    python -m benchmarks.solvers --instances real,fisher       # the model's and the Fisher-shaped instances
    python -m benchmarks.solvers --quick                       # a fast smoke run (small synthetic instances)
    python -m benchmarks.solvers my.qubo:8 other.qubo          # QUBO files (":M" or ":M1,M2", default M = N // 4)

Every run is one JSON line in ``--out/solvers.jsonl`` (default ``benchmarks/out``), written as it finishes: a
rerun skips what is recorded, so an interrupted benchmark loses nothing. Writes ``solvers.md`` (the per-instance
table and a summary by group) and ``solvers.json``. Numba solvers are compiled on a tiny instance first, so
wall times exclude JIT compilation. Use one thread (``NUMBA_NUM_THREADS=1``) for reproducible searches.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import harness as C
from cbo import BlockQUBO, solve
from cbo.errors import CBOError
from cbo.qubo.instances import fisher_block_qubo, random_block_qubo
from cbo.solvers import available
from cbo.solvers.sweep import solver_row

GROUPS = ("synthetic", "real", "fisher")
SYNTHETIC = [(12, 4), (32, 8), (32, 16), (40, 12), (80, 8), (80, 32)]
QUICK = [(10, 3), (14, 5), (18, 6)]
# (granularity, n, values of M) of the Fisher-shaped instances, each with 32, 128 and 2048 samples
FISHER = (("sublayer", 60, (16, 30)), ("layer", 80, (32, 40)))
FISHER_SAMPLES = (32, 128, 2048)
REAL_M = {"sublayer": (16, 30), "layer": (8, 15)}
K = 10
# solvers that are not run on their own: "dimod" needs a user's sampler (its SA is "sa")
SKIP = {"dimod"}
# QAOA simulates 2^n amplitudes: only up to this many blocks (in the quick run: 10)
QAOA_MAX_N = 12
QUICK_QAOA_MAX_N = 10
# extra rows: (label, solver, options) — SA with the provably safe λ shows why the default adapts λ
VARIANTS = [("sa[λ=safe]", "sa", {"penalty": "safe"})]
QUICK_OPTIONS: dict[str, dict[str, Any]] = {
    "qaoa": {"reps": 1, "maxiter": 10, "shots": 512},
    "sa": {"num_reads": 30, "num_sweeps": 300, "max_rounds": 6},
    "tabu": {"num_reads": 4, "num_restarts": 1},
}
HEURISTICS = ("swap-sa", "swap-tabu", "sa", "sa[λ=safe]", "tabu", "qaoa")


def instances(groups: list[str], quick: bool, seed: int, files: list[str]) -> list[dict[str, Any]]:
    """(name, group, qubo, M) of every case."""
    out = []

    def add(name: str, group: str, q: BlockQUBO, ms: Any) -> None:
        for m in ms:
            out.append({"name": name, "group": group, "qubo": q, "M": int(m)})

    if quick:
        for n, m in QUICK:
            add(f"random_block_qubo({n}, {seed})", "synthetic", random_block_qubo(n, seed), [m])
    elif "synthetic" in groups:
        for n, m in SYNTHETIC:
            add(f"random_block_qubo({n}, {seed})", "synthetic", random_block_qubo(n, seed), [m])
    if not quick and "real" in groups:
        for path in sorted(C.INSTANCES.glob("smollm2-135m_*.cboq")):
            granularity = "sublayer" if "_sublayer_" in path.name else "layer"
            add(path.stem, f"real {granularity}", BlockQUBO.load(path), REAL_M[granularity])
    if not quick and "fisher" in groups:
        for granularity, n, ms in FISHER:
            for samples in FISHER_SAMPLES:
                stem = f"synthetic-fisher_{granularity}_n{n}_s{samples}"
                path = C.INSTANCES / f"{stem}.cboq"
                q = BlockQUBO.load(path) if path.exists() else fisher_block_qubo(n, 0, samples=samples,
                                                                                  granularity=granularity)  # fmt: skip
                add(stem, f"Fisher-shaped N={n}", q, ms)
    for spec in files:
        path, _, m = spec.partition(":")
        q = BlockQUBO.load(path)
        add(Path(path).name, "files", q, [int(v) for v in m.split(",")] if m else [q.n // 4])
    return out


def warm_up() -> None:
    """Compile the numba kernels once so that timings exclude JIT compilation."""
    q = random_block_qubo(10, 0)
    for name, opts in (
        ("swap-sa", {}),
        ("swap-tabu", {}),
        ("enumerate", {}),
        ("enumerate", {"strategy": "relaxation"}),
    ):
        try:
            solve(q, 3, name, k=3, seed=0, **opts)
        except CBOError:
            pass


def run_one(q: BlockQUBO, M: int, name: str, options: dict[str, Any], time_limit: float | None) -> dict[str, Any]:
    """One solve: energies, states, wall and CPU seconds, or the reason it did not run."""
    t, c = time.perf_counter(), time.process_time()
    try:
        res = solve(q, M, name, k=K, seed=0, time_limit=time_limit, **options)
    except CBOError as exc:
        return {"status": f"skipped: {str(exc).split(';')[0].splitlines()[0][:100]}"}
    info = res.info
    return {
        "status": "ok",
        "result_solver": res.solver,
        "wall_s": time.perf_counter() - t,
        "cpu_s": time.process_time() - c,
        "exact": res.exact,
        "energies": [float(e) for e in res.energies],
        "removed": [res.removed(i) for i in range(len(res))],
        "feasible_fraction": info.get("feasible_fraction"),
        "strategy": info.get("strategy"),
        "timed_out": bool(info.get("timed_out")),
        "options": options,
        "time_limit": time_limit,
    }


def reference(rows: list[dict[str, Any]], proof: dict[str, Any]) -> dict[str, Any]:
    """The proven top-10 when the reference search finished, else the best known over every run."""
    if proof.get("status") == "ok" and proof["exact"]:
        return {"kind": "proven", "energies": proof["energies"], "seconds": proof["wall_s"], "cpu_s": proof["cpu_s"]}
    pool: dict[tuple, float] = {}
    for row in [proof, *rows]:
        if row.get("status") == "ok":
            for rem, e in zip(row["removed"], row["energies"]):
                pool[tuple(rem)] = e
    best = sorted(pool.values())[:K]
    seconds = proof.get("wall_s")
    return {"kind": "best-known", "energies": best, "seconds": seconds, "cpu_s": proof.get("cpu_s")}


def score(row: dict[str, Any], ref: dict[str, Any]) -> None:
    if row.get("status") != "ok" or not row["energies"] or not ref["energies"]:
        return
    scored = solver_row(row["energies"], ref["energies"], reference=ref["kind"])
    row.update(gap=scored["gap"], rel_gap=scored["rel_gap"], recall=scored["top10_recall"])


def never_worse(rows: dict[str, dict[str, Any]]) -> bool | None:
    """Whether the time-limited enumerate's states are at least as good as auto's, state by state."""
    e, a = rows.get("enumerate"), rows.get("auto")
    if not (e and a and e.get("status") == "ok" and a.get("status") == "ok"):
        return None
    if len(e["energies"]) < len(a["energies"]):
        return False
    tol = 1e-9 * max(1.0, abs(a["energies"][-1]))
    return all(x <= y + tol for x, y in zip(e["energies"], a["energies"]))


def _fmt(v: Any, spec: str = ".3g") -> str:
    return "–" if v is None else format(v, spec)


def markdown(table: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Solver benchmark",
        "",
        f"{meta['date']}, {C.machine_line(meta['machine'])}, NUMBA_NUM_THREADS={meta['numba_threads']}; "
        f"k = {K}; time limit {meta['time_limit']} s per run (auto: its own budget); reference: the exact "
        f"enumerator, up to {meta['reference_limit']} s; whole run {meta.get('wall_time_s', 0):.0f} s. "
        "Wall times exclude numba compilation.",
        "",
        f"Command: `{meta['command']}`",
        "",
        "## By group (mean top-10 recall, minimum in brackets; worst relative gap; median wall time)",
        "",
    ]
    lines += summary(table)
    lines += [
        "",
        "## Every instance",
        "",
        "| instance | M | reference (s) | solver | wall (s) | gap | rel. gap | recall | exact |",
        "|---|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for inst in table:
        ref = inst["reference"]
        refcell = f"{ref['kind']} ({_fmt(ref['seconds'])})"
        for row in inst["rows"]:
            if row.get("status") != "ok":
                lines.append(f"| {inst['name']} | {inst['M']} | {refcell} | {row['label']} | – | – | – | – | "
                             f"{row.get('status')} |")  # fmt: skip
                continue
            label = row["label"] if row["label"] != row["solver"] else row.get("result_solver", row["label"])
            lines.append(
                f"| {inst['name']} | {inst['M']} | {refcell} | {label} | {row['wall_s']:.3g} | {_fmt(row.get('gap'))} "
                f"| {_fmt(row.get('rel_gap'), '.2%')} | {_fmt(row.get('recall'), '.1f')} | "
                f"{'yes' if row['exact'] else 'no'} |"
            )
    checks = [(inst["name"], inst["M"], inst["enumerate_never_worse"]) for inst in table]
    bad = [f"{n} M={m}" for n, m, ok in checks if ok is False]
    done = [c for c in checks if c[2] is not None]
    lines += ["", f"Time-limited `enumerate` at least as good as `auto`, state by state: {len(done) - len(bad)} of "
              f"{len(done)} instances" + (f"; not on {', '.join(bad)}" if bad else "") + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def summary(table: list[dict[str, Any]]) -> list[str]:
    """One row per solver: per group, mean recall (min), worst relative gap, median wall, proven references."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for inst in table:
        groups.setdefault(inst["group"], []).append(inst)
    head = "| solver | " + " | ".join(
        f"{g} ({sum(i['reference']['kind'] == 'proven' for i in insts)}/{len(insts)} proven)"
        for g, insts in groups.items()
    )
    lines = [head + " |", "|---|" + "---|" * len(groups)]
    labels: list[str] = []
    for inst in table:
        for row in inst["rows"]:
            if row["label"] not in labels:
                labels.append(row["label"])
    for label in labels:
        cells = []
        for insts in groups.values():
            rows = [r for i in insts for r in i["rows"] if r["label"] == label and r.get("recall") is not None]
            if not rows:
                cells.append("–")
                continue
            rec = [r["recall"] for r in rows]
            gaps = [r["rel_gap"] for r in rows if r.get("rel_gap") is not None]
            wall = statistics.median(r["wall_s"] for r in rows)
            cells.append(f"{statistics.mean(rec):.2f} ({min(rec):.1f}), {_fmt(max(gaps), '.1%')}, {wall:.2g} s")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = C.parser(
        __doc__, out="", quick="small synthetic instances and short settings (smoke test)", threads=False, seed=0
    )
    ap.add_argument("files", nargs="*", help="QUBO files (BlockQUBO.save), optionally with ':M' or ':M1,M2'")
    ap.add_argument("--instances", default=",".join(GROUPS), help=f"groups: {', '.join(GROUPS)} (or none)")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per solver run (default 30; quick 5)")
    ap.add_argument("--reference-limit", type=float, default=600.0, help="seconds for each exact reference")
    ap.add_argument("--solvers", default=None, help="comma-separated subset of solvers (and variant labels)")
    ap.add_argument("--fresh", action="store_true", help="forget the recorded runs and start again")
    return C.main("solvers", ap, run, argv=argv, torch=False)


def run(job: C.Run) -> int:
    args, out, clock = job.args, job.out, job.clock
    machine = C.machine(torch_info=False)
    time_limit = args.time_limit or (5.0 if args.quick else 30.0)
    groups = [g for g in args.instances.split(",") if g in GROUPS]
    avail = available()
    entries = [(name, name, {}) for name in avail if name not in SKIP]
    entries += [(label, name, opts) for label, name, opts in VARIANTS if name in avail]
    if args.solvers:
        wanted = set(args.solvers.split(","))
        entries = [e for e in entries if e[0] in wanted or e[1] in wanted]
    records = C.RecordLog(out / "solvers.jsonl", ("instance", "M", "label", "limit"), fresh=args.fresh)
    warm_up()
    table = []
    for inst in instances(groups, args.quick, args.seed, args.files):
        q, M = inst["qubo"], inst["M"]
        key = {"instance": inst["name"], "M": M}
        proof = records.get(**key, label="reference", limit=args.reference_limit)
        if proof is None:
            rec = run_one(q, M, "enumerate", {}, args.reference_limit)
            proof = records.add({**key, "label": "reference", "limit": args.reference_limit, **rec})
        rows = []
        for label, name, extra in entries:
            limit = None if name == "auto" else time_limit
            rec = records.get(**key, label=label, limit=limit)
            if rec is None:
                opts = {**(QUICK_OPTIONS.get(name, {}) if args.quick else {}), **extra}
                if not avail[name].ok:
                    rec = {"status": f"unavailable: {avail[name].reason.split(';')[0].split(' (')[0]}"}
                elif name == "qaoa" and q.n > (QUICK_QAOA_MAX_N if args.quick else QAOA_MAX_N):
                    rec = {"status": f"skipped: QAOA is simulated only for n <= {QAOA_MAX_N}"}
                else:
                    rec = run_one(q, M, name, opts, limit)
                rec = records.add({**key, "label": label, "limit": limit, "solver": name, **rec})
            rows.append(rec)
            print(f"{inst['name']:<42} M={M:<3} {label:<12} {rec['status']:<8} {rec.get('wall_s', math.nan):8.3f} s",
                  flush=True)  # fmt: skip
        ref = reference(rows, proof)
        for row in rows:
            score(row, ref)
        table.append(
            {
                "name": inst["name"],
                "group": inst["group"],
                "n": q.n,
                "M": M,
                "reference": ref,
                "proof": proof,
                "rows": rows,
                "enumerate_never_worse": never_worse({r["label"]: r for r in rows}),
            }
        )
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": C.command_line(),
        "machine": machine,
        "numba_threads": os.environ.get("NUMBA_NUM_THREADS", "default"),
        "wall_time_s": round(clock(), 1),
        "time_limit": time_limit,
        "reference_limit": args.reference_limit,
        "seed": args.seed,
        "quick": args.quick,
        "k": K,
    }
    report = markdown(table, meta)
    C.write_outputs(out, "solvers", {"meta": meta, "instances": table}, report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
