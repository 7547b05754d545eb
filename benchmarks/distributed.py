"""Exact top-K on Ray: wall time on 1 and 2 workers (speed-up), and the overhead on a small instance.

    .venv/bin/python benchmarks/distributed.py                      # defaults: synthetic (70, 13), small (24, 6)
    .venv/bin/python benchmarks/distributed.py --n 60 --m 14 --out results/distributed

What is timed:
* ``local``: ``solve(..., "enumerate", threads=1)`` in this process (the reference result);
* ``ray-W``: ``solve(..., backend="ray")`` with W workers of one thread each, on a local Ray
  instance. ``warm`` = the workers were started before (``keep_workers=True``: what a session
  issuing many solves sees); ``cold`` = the solve starts its workers and removes them after
  (the default), which adds process start-up and kernel loading.
Every Ray result is checked to equal the local one (energies exactly, states too).
Numba kernels are compiled (or loaded from the cache) before any timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from cbo.distributed import RayBackend, init_ray, shutdown
from cbo.distributed.ray_enumerate import release_workers
from cbo.instances import random_block_qubo
from cbo.solvers import solve


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def check_same(ref, got, what: str) -> None:
    if not np.array_equal(ref.energies, got.energies):
        raise SystemExit(f"{what}: energies differ from the local search:\n{ref.energies}\n{got.energies}")
    if not np.array_equal(ref.states, got.states):
        print(f"note: {what}: states differ from the local search (ties).", file=sys.stderr)


def ray_solve(q, m, k, workers, keep, bound):
    backend = RayBackend(workers=workers, worker_threads=1, keep_workers=keep)
    return solve(q, m, "enumerate", k=k, backend=backend, bound=bound)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=70, help="blocks of the large synthetic instance")
    p.add_argument("--m", type=int, default=13, help="blocks removed (large instance)")
    p.add_argument("--seed", type=int, default=1, help="instance seed")
    p.add_argument("--k", type=int, default=10, help="top-K")
    p.add_argument("--no-bound", action="store_true", help="switch the lower bound off (plain enumeration)")
    p.add_argument("--small-n", type=int, default=24)
    p.add_argument("--small-m", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3, help="repeats of the small-instance timings (median)")
    p.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    p.add_argument("--out", type=Path, default=None, help="folder for distributed.json and distributed.md")
    args = p.parse_args(argv)
    bound = not args.no_bound

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average {load[0]:.1f}")
    t_init, _ = timed(lambda: init_ray(num_cpus=args.cpus, include_dashboard=False))
    print(f"ray.init (local instance, {args.cpus} CPUs): {t_init:.1f} s")

    big = random_block_qubo(args.n, seed=args.seed)
    small = random_block_qubo(args.small_n, seed=args.seed)
    # compile / load the kernels in this process
    solve(random_block_qubo(12, 0), 5, "enumerate", k=3, threads=1)
    solve(random_block_qubo(12, 0), 2, "enumerate", k=3, threads=1)

    rows = []

    # ---------------------------------------------------------------- large instance
    t_local, ref = timed(lambda: solve(big, args.m, "enumerate", k=args.k, threads=1, bound=bound))
    print(f"local, 1 thread: C({args.n},{args.m}) top-{args.k} in {t_local:.2f} s ({ref.info['states']:.3g} states)")
    rows.append(("large", "local 1 thread", t_local, ref.info["states"]))
    large = {}
    for workers in (1, 2):
        release_workers()
        ray_solve(small, args.small_m, args.k, workers, True, bound)  # start and warm the workers
        t, got = timed(lambda w=workers: ray_solve(big, args.m, args.k, w, True, bound))
        check_same(ref, got, f"ray {workers} workers")
        large[workers] = t
        info = got.info
        print(
            f"ray, {workers} worker(s), warm: {t:.2f} s (search {info['search_s']:.2f} s, {info['chunks']} chunks, "
            f"{info['states']:.3g} states, {info['board_offers']} threshold offers)"
        )
        rows.append(("large", f"ray {workers} worker(s), warm", t, info["states"]))
    release_workers()
    speedup = large[1] / large[2]
    print(f"speed-up 2 vs 1 worker: {speedup:.2f}x; vs local 1 thread: {t_local / large[2]:.2f}x")
    if large[1] < 20:
        print(f"note: the 1-worker run took {large[1]:.1f} s (< 20 s); pick a larger --n/--m for a firmer ratio.")

    # ---------------------------------------------------------------- small instance: overhead
    def median(fn):
        ts = []
        for _ in range(args.repeats):
            t, out = fn()
            ts.append(t)
        return float(np.median(ts)), out

    t_small, ref_s = median(lambda: timed(lambda: solve(small, args.small_m, "enumerate", k=args.k, threads=1)))
    rows.append(("small", "local 1 thread", t_small, ref_s.info["states"]))
    ray_solve(small, args.small_m, args.k, 2, True, bound)
    t_warm, got = median(lambda: timed(lambda: ray_solve(small, args.small_m, args.k, 2, True, bound)))
    check_same(ref_s, got, "small, warm")
    rows.append(("small", "ray 2 workers, warm", t_warm, got.info["states"]))
    release_workers()
    time.sleep(2)  # let the cluster see the released CPUs
    t_cold, got = median(lambda: timed(lambda: ray_solve(small, args.small_m, args.k, 2, False, bound)))
    check_same(ref_s, got, "small, cold")
    rows.append(("small", "ray 2 workers, cold", t_cold, got.info["states"]))
    print(
        f"small C({args.small_n},{args.small_m}): local {t_small * 1e3:.0f} ms, ray warm {t_warm * 1e3:.0f} ms "
        f"(overhead {1e3 * (t_warm - t_small):.0f} ms), ray cold {t_cold:.2f} s (start-up included)"
    )

    result = {
        "instance": {"n": args.n, "m": args.m, "seed": args.seed, "k": args.k, "bound": bound},
        "small": {"n": args.small_n, "m": args.small_m},
        "ray_init_s": t_init,
        "local_s": t_local,
        "ray_s": {str(w): t for w, t in large.items()},
        "speedup_2_vs_1": speedup,
        "small_local_s": t_small,
        "small_ray_warm_s": t_warm,
        "small_ray_cold_s": t_cold,
        "cpus": os.cpu_count(),
        "load_average": load,
        "rows": rows,
    }
    md = [
        f"Exact top-{args.k}, synthetic instances (seed {args.seed}), bound {'on' if bound else 'off'}; "
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} at start.",
        "",
        "| instance | run | wall s | states scored |",
        "|---|---|---|---|",
    ]
    for inst, run, t, states in rows:
        name = f"C({args.n},{args.m})" if inst == "large" else f"C({args.small_n},{args.small_m})"
        md.append(f"| {name} | {run} | {t:.3f} | {states:.3g} |")
    md.append("")
    md.append(f"Speed-up 2 vs 1 worker: {speedup:.2f}x. ray.init: {t_init:.1f} s.")
    print("\n".join(md))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "distributed.json").write_text(json.dumps(result, indent=1))
        (args.out / "distributed.md").write_text("\n".join(md) + "\n")
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
