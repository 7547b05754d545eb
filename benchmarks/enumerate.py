"""Benchmark the exact CPU enumerator on synthetic block QUBOs.

Two measurements per instance (``cbo.qubo.instances.random_block_qubo(n, seed=0)``), with 1 and 2 threads:

* plain enumeration: every one of the C(n, M) states visited (``bound=False``), reported as states/s;
* exact top-10 by each strategy of the enumerator (``--strategies``): ``lexicographic`` (per-row bound +
  convex relaxation + seeded threshold) and ``relaxation`` (the shifted least-squares branch and bound), wall
  time; ``auto`` picks between them from the size of the space.

Then the stretch cases (40,20) and (80,16): exact top-10 with a time limit (default 60 s) by each strategy,
and whether the result was proven.

    python -m benchmarks.enumerate                 # full run (a few minutes on 2 cores)
    python -m benchmarks.enumerate --quick         # small instances, seconds
    python -m benchmarks.enumerate --no-plain      # skip the full enumerations

Kernels are loaded (or compiled) on a tiny instance first; the first-call time is printed separately
and excluded from every figure. The load average at start is printed: other processes on the machine
slow wall times down. Writes ``enumerate.json`` to ``--out`` (default ``benchmarks/out``).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from benchmarks import harness as C
from cbo import solve
from cbo.qubo.instances import random_block_qubo

CASES = [(32, 16), (40, 12), (80, 8)]
STRETCH = [(40, 20), (80, 16)]
QUICK_CASES = [(24, 8), (28, 10)]
QUICK_STRETCH = [(32, 12)]


def _warm(threads: int) -> float:
    t0 = time.perf_counter()
    q = random_block_qubo(12, 0)
    for M in (2, 6):  # generic and fused kernels
        solve(q, M, "enumerate", k=3, threads=threads)
    solve(q.with_constraints(caps={"layer": 5}), 4, "enumerate", k=3, threads=threads)
    return time.perf_counter() - t0


def _run(n: int, M: int, threads: int, time_limit: float | None, **options: Any) -> dict[str, Any]:
    q = random_block_qubo(n, 0)
    t0, c0 = time.perf_counter(), time.process_time()
    res = solve(q, M, "enumerate", k=10, threads=threads, time_limit=time_limit, **options)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    info = res.info
    return {
        "n": n,
        "M": M,
        "threads": threads,
        "wall_s": wall,
        "cpu_s": cpu,
        "exact": res.exact,
        "strategy": info.get("strategy"),
        "states": info.get("states", 0),
        "total_states": math.comb(n, M),
        "states_per_s": info.get("states", 0) / wall if wall > 0 else float("nan"),
        "states_per_cpu_s": info.get("states", 0) / cpu if cpu > 0 else float("nan"),
        "nodes": info["nodes"],
        "pruned": info.get("pruned", 0),
        "relaxations": info.get("relaxations", 0),
        "ground": float(res.energies[0]),
        "tenth": float(res.energies[-1]),
        "options": options,
    }


def strategy_header(exact: str) -> str:
    return (
        f"{'instance':>10} {'strategy':>13} {'threads':>7} {'wall s':>8} {'cpu s':>8} {exact:>6} {'nodes':>9} "
        f"{'E0':>8} {'E9':>8}"
    )


def strategy_line(n: int, M: int, strategy: str, th: int, row: dict[str, Any], *, wall_digits: int) -> str:
    """One row of a strategy table: time, whether the top-10 is proven, nodes, the first and tenth energy."""
    w = wall_digits
    return (
        f"{f'({n},{M})':>10} {strategy:>13} {th:>7} {row['wall_s']:>8.{w}f} {row['cpu_s']:>8.{w}f} "
        f"{str(row['exact']):>6} {row['nodes']:>9.3g} {row['ground']:>8.4f} {row['tenth']:>8.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = C.parser(__doc__, out="", quick="small instances (a smoke run)", threads=False)
    ap.add_argument("--no-plain", action="store_true", help="skip the full enumerations")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default 1 2)")
    ap.add_argument("--stretch-limit", type=float, default=60.0, help="time limit of the stretch cases (s)")
    ap.add_argument("--strategies", nargs="+", default=["lexicographic", "relaxation"], help="search strategies")
    return C.main("enumerate", ap, run, argv=argv, torch=False)


def run(job: C.Run) -> int:
    args, clock = job.args, job.clock
    machine = C.machine(torch_info=False)
    cases = QUICK_CASES if args.quick else CASES
    stretch = QUICK_STRETCH if args.quick else STRETCH
    print(C.machine_line(machine))
    print("cpu s: process CPU time (all threads); under load, states per cpu-s is the figure to trust")
    print(f"kernel load/compile (first calls, excluded): {_warm(max(args.threads)):.2f} s")
    rows: list[dict[str, Any]] = []

    if not args.no_plain:
        print("\nplain enumeration (bound off, every state visited, top-10 kept)")
        print(
            f"{'instance':>10} {'threads':>7} {'states':>10} {'wall s':>8} {'cpu s':>8} {'states/s':>10} {'per cpu-s':>10}"
        )
        for n, M in cases:
            for th in args.threads:
                row = _run(n, M, th, None, bound=False)
                row["kind"] = "plain"
                rows.append(row)
                print(
                    f"{f'({n},{M})':>10} {th:>7} {row['states']:>10.3g} {row['wall_s']:>8.2f} {row['cpu_s']:>8.2f} "
                    f"{row['states_per_s']:>10.3g} {row['states_per_cpu_s']:>10.3g}",
                    flush=True,
                )

    print("\nexact top-10 by each strategy")
    print(strategy_header("exact"))
    for n, M in cases:
        for strategy in args.strategies:
            for th in args.threads:
                row = _run(n, M, th, None, strategy=strategy)
                rows.append(row | {"kind": "top10"})
                print(strategy_line(n, M, strategy, th, row, wall_digits=3), flush=True)

    print(f"\nstretch: exact top-10 within {args.stretch_limit:g} s")
    print(strategy_header("proven"))
    for n, M in stretch:
        th = max(args.threads)
        for strategy in args.strategies:
            row = _run(n, M, th, args.stretch_limit, strategy=strategy)
            rows.append(row | {"kind": "stretch"})
            print(strategy_line(n, M, strategy, th, row, wall_digits=2), flush=True)

    result = {
        "benchmark": "enumerate",
        "command": C.command_line(),
        "machine": machine,
        "load_average_at_end": list(os.getloadavg()),
        "wall_time_s": round(clock(), 1),
        "rows": rows,
    }
    path = job.save(result)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
