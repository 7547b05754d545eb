"""One self-contained check of the GPU enumerator on a CUDA machine (finishes in well under 4 minutes).

    python3 -m benchmarks.gpu_check                 # from the repository root
    python3 -m benchmarks.gpu_check --out "$OUT"    # also write gpu_check.json there

(a) CuPy and the device; (b) enumerate-gpu against the CPU enumerator and a numpy brute force on
random instances (PASS/FAIL per case); (c) throughput of full (80, 8) enumeration in states/s
(target >= 5e10 on an H200) with a sweep over the launch size, and the exact top-10 wall time.
Prints everything; also writes gpu_check.json to ``--out`` (default: $OUT when that variable is set).
"""

from __future__ import annotations

import itertools
import math
import os
import platform
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks import harness as C

T0 = time.perf_counter()
BUDGET_S = 200.0  # stop optional steps past this, so the whole run stays under 4 minutes

REPORT: dict[str, Any] = {"cases": [], "throughput": [], "errors": []}


def say(*args: Any) -> None:
    print(*args, flush=True)


def elapsed() -> float:
    return time.perf_counter() - T0


def section(title: str) -> None:
    say(f"\n=== {title} [{elapsed():.1f} s] ===")


def environment() -> bool:
    section("(a) environment")
    import numpy as np

    say(f"python {platform.python_version()} on {platform.platform()}, numpy {np.__version__}")
    REPORT["python"] = platform.python_version()
    try:
        import cupy as cp
    except Exception as exc:
        say(f"CuPy is not importable: {type(exc).__name__}: {exc}")
        say(
            "Install hints: pip install cupy-cuda12x  (CUDA 12 driver)  or  pip install cupy-cuda13x  (CUDA 13); "
            "without internet, carry the wheel (python3 -m pip download --no-deps cupy-cuda13x ...) and install it "
            "with --no-index. `nvidia-smi` shows the driver's CUDA version."
        )
        REPORT["cupy"] = None
        return False
    REPORT["cupy"] = cp.__version__
    try:
        rt = cp.cuda.runtime.runtimeGetVersion()
        drv = cp.cuda.runtime.driverGetVersion()
        n = cp.cuda.runtime.getDeviceCount()
        props = cp.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        info = {
            "device": name,
            "devices": n,
            "multiprocessors": int(props["multiProcessorCount"]),
            "memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
            "compute_capability": f"{props['major']}.{props['minor']}",
            "cuda_runtime": rt,
            "cuda_driver": drv,
        }
    except Exception as exc:
        say(f"CuPy imports but the device is not usable: {type(exc).__name__}: {exc}")
        return False
    REPORT.update(info)
    say(f"CuPy {cp.__version__}; " + ", ".join(f"{k}={v}" for k, v in info.items()))
    from cbo.solvers.enumerate.gpu import EnumerateGPU

    ok, reason = EnumerateGPU.availability()
    say(f"enumerate-gpu availability: {ok} ({reason})")
    REPORT["availability"] = [ok, reason]
    return bool(ok)


def brute_force(q: Any, M: int, k: int) -> Any:
    import numpy as np

    n = q.n
    combos = np.array(list(itertools.combinations(range(n), M)), dtype=np.int64).reshape(-1, M)
    X = np.zeros((len(combos), n), dtype=np.uint8)
    np.put_along_axis(X, combos, 1, axis=1)
    X = X[q.feasible(X, M)]
    E = q.energy(X)
    return np.sort(E)[:k]


def correctness() -> bool:
    section("(b) enumerate-gpu vs CPU enumerate and brute force")
    import numpy as np

    from cbo import solve
    from cbo.qubo.instances import random_block_qubo

    cases = [
        # (n, M, k, seed, constraints)
        (10, 1, 5, 0, {}),
        (16, 1, 3, 1, {}),
        (20, 5, 10, 2, {}),
        (24, 12, 10, 3, {}),
        (24, 17, 10, 4, {}),  # complement
        (32, 4, 10, 5, {}),
        (33, 4, 10, 6, {}),  # two register slots
        (40, 3, 20, 7, {}),
        (64, 4, 10, 8, {}),
        (65, 3, 10, 9, {}),  # three slots
        (100, 2, 10, 10, {}),  # four slots
        (128, 3, 5, 11, {}),
        (30, 6, 10, 12, {"keep": [0, 29], "force": [3]}),
        (20, 4, 1, 13, {}),
        (20, 4, 200, 14, {}),
        (48, 6, 10, 15, {}),
    ]
    all_ok = True
    for n, M, k, seed, cons in cases:
        rec: dict[str, Any] = {"n": n, "M": M, "k": k, "seed": seed, "constraints": cons}
        try:
            q = random_block_qubo(n, seed)
            if cons:
                q = q.with_constraints(**cons)
            t = time.perf_counter()
            gpu = solve(q, M, "enumerate-gpu", k=k)
            rec["gpu_s"] = time.perf_counter() - t
            rec["gpu_exact"] = gpu.exact
            refs = {}
            try:
                cpu = solve(q, M, "enumerate", k=k)
                refs["cpu"] = cpu.energies
            except Exception as exc:  # the CPU enumerator needs numba; report and use brute force
                rec["cpu_error"] = f"{type(exc).__name__}: {exc}"
            if math.comb(n, M) <= 3_000_000:
                refs["brute"] = brute_force(q, M, k)
            diffs = {}
            ok = gpu.exact and bool(refs)
            for key, E in refs.items():
                same = len(E) == len(gpu.energies) and np.allclose(gpu.energies, E, rtol=0, atol=1e-9)
                diffs[key] = float(np.max(np.abs(gpu.energies - E))) if len(E) == len(gpu.energies) else None
                ok = ok and same
            rec.update({"pass": bool(ok), "max_diff": diffs})
        except Exception as exc:
            rec.update({"pass": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
        all_ok = all_ok and rec["pass"]
        REPORT["cases"].append(rec)
        extra = rec.get("error") or rec.get("cpu_error") or ""
        say(
            f"  ({n:3d},{M:2d}) k={k:3d} {str(cons):38s} {'PASS' if rec['pass'] else 'FAIL'}  "
            f"max|ΔE| {rec.get('max_diff')}  gpu {rec.get('gpu_s', float('nan')):.3f} s  {extra[:200]}"
        )
        if rec.get("trace"):
            say(rec["trace"])
    say(f"correctness: {'ALL PASS' if all_ok else 'SOME FAILED'}")
    REPORT["all_pass"] = all_ok
    return all_ok


def throughput() -> None:
    section("(c) throughput: full enumeration of (80, 8)")
    import numpy as np

    from cbo import solve
    from cbo.qubo.instances import random_block_qubo
    from cbo.solvers.base import Problem
    from cbo.solvers.enumerate.gpu import EnumerateGPU, enumerate_on_device

    q = random_block_qubo(80, 0)
    states = math.comb(80, 8)
    t = time.perf_counter()
    first = solve(q, 8, "enumerate-gpu", k=10)
    say(f"first call (includes kernel compile {first.info['compile_seconds']:.2f} s): {time.perf_counter() - t:.3f} s")
    walls = []
    for _ in range(3):
        t = time.perf_counter()
        res = solve(q, 8, "enumerate-gpu", k=10)
        walls.append(time.perf_counter() - t)
        rate = res.info["states_per_second"]
        say(
            f"  top-10 of (80,8): wall {walls[-1]:.3f} s, kernel {res.info['kernel_seconds']:.3f} s, "
            f"{rate:.3g} states/s, launches {res.info['launches']}, warps {res.info['warps']}, chunk {res.info['chunk']}"
        )
        REPORT["throughput"].append({"instance": "(80,8)", "wall_s": walls[-1], **_pick(res.info)})
    REPORT["top10_80_8_wall_s"] = min(walls)
    try:
        cpu = solve(q, 8, "enumerate", k=10)
        same = np.allclose(cpu.energies, res.energies, atol=1e-9) and {tuple(cpu.removed(i)) for i in range(10)} == {
            tuple(res.removed(i)) for i in range(10)
        }
        say(f"  same top-10 as the CPU enumerator ({cpu.wall_time:.2f} s there): {same}")
        REPORT["top10_80_8_matches_cpu"] = bool(same)
    except Exception as exc:
        say(f"  CPU enumerator failed: {exc}")
    best = max(r.get("states_per_second") or 0 for r in REPORT["throughput"])
    say(f"best (80,8) rate {best:.3g} states/s; target 5e10: {'MET' if best >= 5e10 else 'NOT MET'}")
    REPORT["best_rate_80_8"] = best

    say("launch-size sweep on (80,8) (blocks of 256 threads):")
    p = Problem(q, 8, 10, 0, None)
    sms = REPORT.get("multiprocessors", 132)
    for per_sm in (2, 4, 8, 16, 32):
        if elapsed() > BUDGET_S:
            say("  (skipped: time budget)")
            break
        try:
            out = enumerate_on_device(p, EnumerateGPU.Options(blocks=sms * per_sm))
            rate = states / out.info["kernel_seconds"]
            say(f"  {per_sm:2d} blocks/SM: kernel {out.info['kernel_seconds']:.3f} s, {rate:.3g} states/s")
            REPORT["throughput"].append({"instance": "(80,8)", "blocks_per_sm": per_sm, **_pick(out.info)})
        except Exception as exc:
            say(f"  {per_sm} blocks/SM failed: {exc}")

    for n, M in ((80, 9), (64, 10), (80, 10)):
        projected = math.comb(n, M) / max(best, 1e9)
        if elapsed() + projected > BUDGET_S or projected > 60:
            say(f"  ({n},{M}): projected {projected:.1f} s, skipped")
            continue
        try:
            res = solve(random_block_qubo(n, 0), M, "enumerate-gpu", k=10)
            say(
                f"  ({n},{M}): C = {math.comb(n, M):.3g} states, wall {res.wall_time:.3f} s, "
                f"{res.info['states_per_second']:.3g} states/s"
            )
            REPORT["throughput"].append({"instance": f"({n},{M})", "wall_s": res.wall_time, **_pick(res.info)})
        except Exception as exc:
            say(f"  ({n},{M}) failed: {exc}")


def _pick(info: dict[str, Any]) -> dict[str, Any]:
    keys = ("kernel_seconds", "states_per_second", "launches", "warps", "chunk", "compile_seconds", "states")
    return {k: info.get(k) for k in keys}


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__, threads=False)
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder for gpu_check.json (default: $OUT, if set)")
    return C.main("gpu_check", p, run, argv=argv, torch=False)


def run(job: C.Run) -> int:
    args = job.args
    REPORT["command"] = C.command_line()
    REPORT["machine"] = C.machine(torch_info=False)
    code = 0
    try:
        if not environment():
            code = 2
        else:
            if not correctness():
                code = 1
            if elapsed() < BUDGET_S:
                throughput()
    except Exception as exc:
        say(traceback.format_exc())
        REPORT["errors"].append(f"{type(exc).__name__}: {exc}")
        code = 3
    REPORT["elapsed_s"] = elapsed()
    section(f"done, exit code {code}")
    if args.out:
        C.write_json(Path(args.out) / "gpu_check.json", REPORT)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
