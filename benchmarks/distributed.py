"""Exact top-K on Ray: wall time on 1 and 2 workers (speed-up), and the overhead on a small instance.

    .venv/bin/python -m benchmarks.distributed                  # C(80,28) bounded, C(54,10) plain, small C(24,6)
    .venv/bin/python -m benchmarks.distributed --large 70:20 --out benchmarks/out/distributed-70

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
import sys
import time

import numpy as np

from benchmarks import harness as C
from cbo.qubo.instances import random_block_qubo
from cbo.solvers import solve
from cbo.solvers.enumerate.ray import RayBackend, init_ray, release_workers, shutdown


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


def parse_large(text: str) -> tuple[int, int, bool]:
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "nobound"):
        raise argparse.ArgumentTypeError(f"write N:M or N:M:nobound, got {text!r}")
    return int(parts[0]), int(parts[1]), len(parts) == 2


def main(argv=None) -> int:
    p = C.parser(__doc__, out="distributed", threads=False, seed=1)
    p.add_argument(
        "--large",
        type=parse_large,
        action="append",
        help="large instance N:M (bound on) or N:M:nobound (plain enumeration); repeatable "
        "(default: 80:28 and 54:10:nobound, each ≥ 20 s on one worker of a busy 2-core machine)",
    )
    p.add_argument("--k", type=int, default=10, help="top-K")
    p.add_argument("--small-n", type=int, default=24)
    p.add_argument("--small-m", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3, help="repeats of the small-instance timings (median)")
    p.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    return C.main("distributed", p, run, argv=argv, torch=False)


def run(job: C.Run) -> int:
    args, clock = job.args, job.clock
    args.large = args.large or [(80, 28, True), (54, 10, False)]
    machine = C.machine(torch_info=False)
    print(C.machine_line(machine))
    t_init, _ = timed(lambda: init_ray(num_cpus=args.cpus, include_dashboard=False))
    print(f"ray.init (local instance, {args.cpus} CPUs): {t_init:.1f} s")

    small = random_block_qubo(args.small_n, seed=args.seed)
    # compile / load the kernels in this process
    solve(random_block_qubo(12, 0), 5, "enumerate", k=3, threads=1)
    solve(random_block_qubo(12, 0), 2, "enumerate", k=3, threads=1)

    rows = []

    # ---------------------------------------------------------------- large instances
    large = {}
    for spec in args.large:
        n, m, bound = spec
        name = f"C({n},{m}), bound {'on' if bound else 'off'}"
        q = random_block_qubo(n, seed=args.seed)
        t_local, ref = timed(lambda q=q, m=m, b=bound: solve(q, m, "enumerate", k=args.k, threads=1, bound=b))
        print(f"{name}: local, 1 thread: top-{args.k} in {t_local:.2f} s ({ref.info['states']:.3g} states)")
        rows.append((name, "local 1 thread", t_local, ref.info["states"]))
        times, cpus = {}, {}
        for workers in (1, 2):
            release_workers()
            ray_solve(small, args.small_m, args.k, workers, True, bound)  # start and warm the workers
            t, got = timed(lambda q=q, m=m, w=workers, b=bound: ray_solve(q, m, args.k, w, True, b))
            check_same(ref, got, f"{name}, ray {workers} workers")
            times[workers] = t
            info = got.info
            cpus[workers] = info["worker_cpu_s"]
            print(
                f"{name}: ray, {workers} worker(s), warm: {t:.2f} s (search {info['search_s']:.2f} s, "
                f"{info['chunks']} chunks, {info['states']:.3g} states, {info['board_offers']} threshold offers, "
                f"worker CPU s {info['worker_cpu_s']})"
            )
            rows.append((name, f"ray {workers} worker(s), warm", t, info["states"]))
        release_workers()
        speedup = times[1] / times[2]
        # CPU time of the busiest worker: the wall time the split would take on otherwise idle cores
        cpu_speedup = sum(cpus[1]) / max(cpus[2])
        print(
            f"{name}: speed-up 2 vs 1 worker {speedup:.2f}x (wall), {cpu_speedup:.2f}x (busiest worker's CPU time); "
            f"2 workers vs local 1 thread {t_local / times[2]:.2f}x"
        )
        if times[1] < 20:
            print(f"note: the 1-worker run took {times[1]:.1f} s (< 20 s); pick a larger instance for a firmer ratio.")
        large[name] = {
            "local_s": t_local,
            "ray_1_s": times[1],
            "ray_2_s": times[2],
            "speedup_2_vs_1": speedup,
            "worker_cpu_s": {str(w): c for w, c in cpus.items()},
            "cpu_speedup_2_vs_1": cpu_speedup,
        }

    # ---------------------------------------------------------------- small instance: overhead
    def median(fn):
        ts = []
        for _ in range(args.repeats):
            t, out = fn()
            ts.append(t)
        return float(np.median(ts)), out

    t_small, ref_s = median(lambda: timed(lambda: solve(small, args.small_m, "enumerate", k=args.k, threads=1)))
    small_name = f"C({args.small_n},{args.small_m}), bound on"
    rows.append((small_name, "local 1 thread", t_small, ref_s.info["states"]))
    ray_solve(small, args.small_m, args.k, 2, True, True)
    t_warm, got = median(lambda: timed(lambda: ray_solve(small, args.small_m, args.k, 2, True, True)))
    check_same(ref_s, got, "small, warm")
    rows.append((small_name, "ray 2 workers, warm", t_warm, got.info["states"]))
    release_workers()
    time.sleep(2)  # let the cluster see the released CPUs
    t_cold, got = median(lambda: timed(lambda: ray_solve(small, args.small_m, args.k, 2, False, True)))
    check_same(ref_s, got, "small, cold")
    rows.append((small_name, "ray 2 workers, cold", t_cold, got.info["states"]))
    print(
        f"small C({args.small_n},{args.small_m}): local {t_small * 1e3:.0f} ms, ray warm {t_warm * 1e3:.0f} ms "
        f"(overhead {1e3 * (t_warm - t_small):.0f} ms), ray cold {t_cold:.2f} s (start-up included)"
    )

    result = {
        "seed": args.seed,
        "k": args.k,
        "large": large,
        "small": {"n": args.small_n, "m": args.small_m},
        "ray_init_s": t_init,
        "small_local_s": t_small,
        "small_ray_warm_s": t_warm,
        "small_ray_cold_s": t_cold,
        "command": C.command_line(),
        "machine": machine,
        "wall_time_s": round(clock(), 1),
        "rows": rows,
    }
    md = [
        f"Exact top-{args.k}, synthetic instances (seed {args.seed}); {C.machine_line(machine)}.",
        "",
        f"Command: `{result['command']}`",
        "",
        "| instance | run | wall s | states scored |",
        "|---|---|---|---|",
    ]
    for name, run, t, states in rows:
        md.append(f"| {name} | {run} | {t:.3f} | {states:.3g} |")
    md.append("")
    for name, r in large.items():
        md.append(
            f"{name}: speed-up 2 vs 1 worker {r['speedup_2_vs_1']:.2f}x in wall time, "
            f"{r['cpu_speedup_2_vs_1']:.2f}x in the busiest worker's CPU time "
            f"(1 worker: {sum(r['worker_cpu_s']['1']):.1f} s; 2 workers: {r['worker_cpu_s']['2']} s)."
        )
    md.append(f"ray.init: {t_init:.1f} s.")
    print("\n".join(md))
    C.write_outputs(job.out, "distributed", result, "\n".join(md))
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
