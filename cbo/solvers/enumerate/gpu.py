"""Exact top-K enumeration on an NVIDIA GPU with a CuPy raw kernel.

Work split: a state is a prefix (its first r−1 removed blocks, an (r−1)-combination of
{0..n−2} in lexicographic order) plus a last block j after the prefix. One warp owns a chunk of
consecutive prefix ranks at a time (handed out by an atomic counter, so warps stay busy whatever
their chunks cost). Lane ℓ of the warp holds the field ``F_j = Q_jj + Σ_{i∈prefix} Q_ij`` of the
candidates j = ℓ, ℓ+32, … in registers, so the warp evaluates the leaves of a prefix 32 at a time,
each leaf costing one add and one compare: ``E = E_prefix + F_j``. Moving to the next prefix in
lexicographic order changes a few of its elements; each change updates the fields with one
coalesced row of Q (read through the L1 cache) and the prefix energy with one shuffle. Fields are
recomputed from scratch at the start of every chunk, which bounds rounding drift.

Every warp keeps its own top-K list (lane 0 inserts; the warp's threshold is the K-th energy of its
list, or a seeded ``warm_start`` bound) in global memory; the host merges the lists and returns
the best states, which ``solve`` re-scores exactly in float64. For r > n/2 the complement (the
kept blocks) is enumerated instead, with the energy rewritten for it.

No lower bound prunes the search: at these speeds full enumeration of C(80, 8) ≈ 2.9e10 states
takes a fraction of a second, and a pruned search would break the regular, branch-free inner loop.
The kernel source and its CPU emulator are in :mod:`cbo.solvers.enumerate.gpu_kernel`. This is both
the ``enumerate-gpu`` solver and the ``"gpu"`` backend of the ``enumerate`` solver
(``backend_options`` are the fields of :class:`GPUOptions`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from cbo.errors import SolverError, SolverOptionError, SolverUnavailableError
from cbo.solvers.base import Problem, Solver, SolverOutput, register
from cbo.solvers.enumerate.gpu_kernel import WARPS_PER_BLOCK, EmulatedDevice, binomial_table, cuda_source

MAX_FREE = 128  # 4 register slots of 32 lanes
MAX_PREFIX = 64  # r − 1 after taking the complement, so r ≤ 65 with r ≤ n/2
MAX_K = 4096


def unrank(rank: int, n_alphabet: int, m: int) -> list[int]:
    """The m-combination of {0..n_alphabet−1} of lexicographic ``rank`` (the kernel's unranking)."""
    out = []
    x = 0
    for q in range(m):
        k = m - q
        while True:
            c = math.comb(n_alphabet - x - 1, k - 1)
            if rank < c:
                break
            rank -= c
            x += 1
        out.append(x)
        x += 1
    return out


def complement_energy(D: np.ndarray, Qoff: np.ndarray) -> np.ndarray:
    """Diagonal of the energy over z = 1 − y (off-diagonal unchanged, constant dropped)."""
    return -D - Qoff.sum(1)


@dataclass
class Plan:
    """What one enumeration launches: the (possibly complemented) reduced energy and the split."""

    D: np.ndarray
    Qoff: np.ndarray
    r: int
    complemented: bool
    m: int
    total_prefixes: int
    total_states: int

    @classmethod
    def from_problem(cls, problem: Problem) -> Plan:
        Q = np.ascontiguousarray(problem.Q, dtype=np.float64)
        n, r = Q.shape[0], int(problem.r)
        D = np.diag(Q).copy()
        Qoff = Q.copy()
        np.fill_diagonal(Qoff, 0.0)
        comp = r > n - r
        if comp:
            D = complement_energy(D, Qoff)
            r = n - r
        m = r - 1
        total = math.comb(n - 1, m) if r >= 1 else 0
        return cls(D, np.ascontiguousarray(Qoff), r, comp, m, total, math.comb(n, r))

    @property
    def n(self) -> int:
        return self.D.shape[0]

    def states(self, S: np.ndarray) -> np.ndarray:
        """(B, n) 0/1 sub-states over the free blocks from (B, r) index rows of the kernel."""
        Y = np.zeros((S.shape[0], self.n), dtype=np.uint8)
        if S.shape[0] and self.r:
            np.put_along_axis(Y, S.astype(np.int64), 1, axis=1)
        return 1 - Y if self.complemented else Y


def merge(outE: np.ndarray, outS: np.ndarray, outN: np.ndarray, K: int, R: int, keep: int) -> tuple:
    """The ``keep`` best (energy, index row) over every warp's list."""
    W = outN.shape[0]
    E = outE.reshape(W, K)
    S = outS.reshape(W, K, R)
    valid = np.arange(K)[None, :] < outN[:, None]
    e = E[valid]
    s = S[valid]
    order = np.argsort(e, kind="stable")[:keep]
    return e[order], s[order]


def _choose_chunk(total: int, warps: int) -> int:
    # ~32 chunks per warp for balance, but long enough to amortize the unranking
    return int(min(65536, max(64, total // max(1, warps * 32))))


# ----------------------------------------------------------------------------- devices
class _CupyDevice:
    """Runs the kernel on the current CUDA device through CuPy."""

    def __init__(self, plan: Plan, K: int, blocks: int | None, device: int) -> None:
        import cupy as cp

        self.cp = cp
        self.dev = cp.cuda.Device(device)
        self.dev.use()
        props = cp.cuda.runtime.getDeviceProperties(device)
        self.sm_count = int(props["multiProcessorCount"])
        self.name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        self.blocks = int(blocks) if blocks else self.sm_count * 8
        self.warps = self.blocks * WARPS_PER_BLOCK
        t = time.perf_counter()
        self.kernel = cp.RawKernel(cuda_source(plan.n, plan.m), "cbo_enum", options=("-std=c++17",))
        self.kernel.compile()
        self.compile_seconds = time.perf_counter() - t
        R = plan.m + 1
        self.D = cp.asarray(plan.D)
        self.Qoff = cp.asarray(plan.Qoff)
        self.binom = cp.asarray(binomial_table(plan.n, plan.m))
        self.outE = cp.full(self.warps * K, np.inf, dtype=cp.float64)
        self.outS = cp.zeros(self.warps * K * R, dtype=cp.uint8)
        self.outN = cp.zeros(self.warps, dtype=cp.int32)
        self.counter = cp.zeros(1, dtype=cp.uint64)
        self.args = (plan, K)

    def launch(self, p_begin: int, p_count: int, chunk: int, thr0: float) -> None:
        cp = self.cp
        plan, K = self.args
        self.counter.fill(0)
        self.kernel(
            (self.blocks,),
            (32 * WARPS_PER_BLOCK,),
            (
                self.D,
                self.Qoff,
                self.binom,
                np.int32(plan.n),
                np.int32(plan.m),
                np.int32(K),
                np.uint64(p_begin),
                np.uint64(p_count),
                np.uint64(chunk),
                self.counter,
                np.float64(thr0),
                self.outE,
                self.outS,
                self.outN,
            ),
        )
        cp.cuda.Device().synchronize()

    def results(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.outE.get(), self.outS.get(), self.outN.get()


def cuda_device_status() -> tuple[bool, str]:
    """(usable, reason): CuPy importable and a CUDA device that runs a tiny kernel."""
    try:
        import cupy as cp
    except Exception as exc:  # ImportError, or a CUDA library error raised at import
        return False, f"CuPy is not importable ({type(exc).__name__}: {exc}); install it with: pip install 'cbo[gpu]'"
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"no usable CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return False, "CuPy sees no CUDA device"
    try:
        a = cp.arange(4, dtype=cp.float64)
        if float((a * 2).sum()) != 12.0:
            return False, "the CUDA device returned a wrong result for a test computation"
        props = cp.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception as exc:
        return False, f"the CUDA device is not usable ({type(exc).__name__}: {exc})"
    return True, f"ok ({name})"


@dataclass
class GPUOptions:
    """Settings of GPU enumeration (the ``backend_options`` of ``enumerate`` with ``backend="gpu"``).

    Attributes:
        blocks: CUDA blocks of 256 threads (default 8 per multiprocessor).
        device: CUDA device index.
        batch_seconds: target seconds per kernel launch; the time limit is checked in between.
        emulate: run the kernel source on the CPU emulator instead (testing without a GPU).
        emulate_warps: warps the emulator runs at once.
    """

    blocks: int | None = None
    device: int = 0
    batch_seconds: float = 1.0
    emulate: bool = False
    emulate_warps: int = 2

    def validate(self) -> None:
        if self.batch_seconds is None or not self.batch_seconds > 0:
            raise SolverOptionError(f"batch_seconds must be > 0, got {self.batch_seconds!r}.")
        if self.blocks is not None and (not isinstance(self.blocks, (int, np.integer)) or self.blocks < 1):
            raise SolverOptionError(f"blocks must be an integer >= 1, got {self.blocks!r}.")


@register
class EnumerateGPU(Solver):
    """Exact top-K by full enumeration on an NVIDIA GPU (CuPy raw kernel).

    Usable where CuPy imports (the ``gpu`` extra) and a CUDA device runs a test computation
    (:func:`cuda_device_status`); the same search is the ``"gpu"`` backend of the ``enumerate`` solver.
    """

    name = "enumerate-gpu"
    aliases = ("gpu", "exact-gpu")
    exact = True
    description = "exact top-K by full enumeration on a CUDA GPU (CuPy raw kernel)"

    @dataclass
    class Options(GPUOptions):
        """Settings of GPU enumeration: those of :class:`GPUOptions`, and

        Attributes:
            warm_start: an upper bound on the K-th best energy (e.g. from a heuristic); states above
                it are never stored. Must be a true bound, or states are lost.
        """

        warm_start: float | None = None

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return cuda_device_status()

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        return enumerate_on_device(problem, options)


#: What the ``enumerate`` solver's ``backend_options`` build with ``backend="gpu"``.
BACKEND_OPTIONS = GPUOptions


def run_backend(problem: Problem, options: Any, config: GPUOptions) -> SolverOutput:
    """The ``enumerate`` solver on the GPU: full enumeration with its ``warm_start`` (its search settings,
    bounds and threads, are those of the CPU search and do not apply)."""
    settings = {f.name: getattr(config, f.name) for f in fields(GPUOptions)}
    out = enumerate_on_device(problem, EnumerateGPU.Options(warm_start=options.warm_start, **settings))
    out.info["backend"] = "gpu"
    return out


def enumerate_on_device(problem: Problem, options: EnumerateGPU.Options) -> SolverOutput:
    """Run the GPU (or emulated) enumeration of ``problem``; the body of ``EnumerateGPU.run``."""
    n, r, k = problem.n_free, problem.r, problem.k
    if k > MAX_K:
        raise SolverError(f"enumerate-gpu keeps at most k={MAX_K} states per warp; got k={k}.")
    if r == 0 or r == n:
        Y = np.full((1, n), 1 if r == n else 0, dtype=np.uint8)
        return SolverOutput(problem.expand(Y), exact=True, info={"states": 1, "feasible_fraction": 1.0})
    if problem.has_side_constraints:
        raise SolverError(
            "enumerate-gpu does not handle per-kind caps or a parameter budget; use solver='enumerate' "
            "(CPU) or 'cpsat'."
        )
    if n > MAX_FREE:
        raise SolverError(f"enumerate-gpu supports at most {MAX_FREE} free blocks, got {n}; use 'swap-sa'.")
    plan = Plan.from_problem(problem)
    if plan.m > MAX_PREFIX:
        raise SolverError(f"enumerate-gpu supports min(M, n−M) ≤ {MAX_PREFIX + 1}, got {plan.r}.")
    if plan.total_prefixes >= 2**62:
        raise SolverError(f"C({n}, {r}) is far too large to enumerate; use solver='swap-sa'.")
    thr0 = float(options.warm_start) if options.warm_start is not None else np.inf
    if plan.complemented and options.warm_start is not None:
        # the kernel sees energies of the complement without its constant
        Qoff = plan.Qoff
        const = float(np.diag(problem.Q).sum() + 0.5 * Qoff.sum())
        thr0 = thr0 - problem.const - const
    elif options.warm_start is not None:
        thr0 = thr0 - problem.const
    if np.isfinite(thr0):
        thr0 += 1e-9 * max(1.0, abs(thr0))
    if options.emulate:
        device: Any = EmulatedDevice(plan, k, options.emulate_warps)
    else:
        ok, reason = cuda_device_status()
        if not ok:
            raise SolverUnavailableError(f"solver 'enumerate-gpu' cannot run here: {reason}")
        device = _CupyDevice(plan, k, options.blocks, int(options.device))
    chunk = _choose_chunk(plan.total_prefixes, device.warps)
    done = 0
    launches = 0
    timed_out = interrupted = False
    t_kernel = 0.0
    # the first launch calibrates the rate; later ones aim at batch_seconds each
    batch = max(chunk * device.warps, plan.total_prefixes // 256)
    try:
        while done < plan.total_prefixes:
            count = min(batch, plan.total_prefixes - done)
            t = time.perf_counter()
            device.launch(done, count, chunk, thr0)
            dt = time.perf_counter() - t
            t_kernel += dt
            done += count
            launches += 1
            rate = count / max(dt, 1e-6)
            batch = max(chunk * device.warps, int(rate * float(options.batch_seconds)))
            if done < plan.total_prefixes and problem.time_left() <= 0:
                timed_out = True
                break
    except KeyboardInterrupt:
        interrupted = True
    outE, outS, outN = device.results()
    e, s = merge(outE, outS, outN, k, plan.m + 1, keep=max(4 * k, k + 64))
    Y = plan.states(s)
    finished = done >= plan.total_prefixes
    states_done = plan.total_states if finished else states_before(plan, done)
    info: dict[str, Any] = {
        "device": device.name,
        "multiprocessors": device.sm_count,
        "warps": device.warps,
        "chunk": chunk,
        "launches": launches,
        "kernel_seconds": t_kernel,
        "compile_seconds": device.compile_seconds,
        "states": int(states_done),
        "states_per_second": float(states_done / t_kernel) if t_kernel > 0 else None,
        "complemented": plan.complemented,
        "fraction_done": done / plan.total_prefixes if plan.total_prefixes else 1.0,
        "timed_out": timed_out,
        "interrupted": interrupted,
        "feasible_fraction": 1.0,
    }
    return SolverOutput(problem.expand(Y), exact=finished, info=info)


def states_before(plan: Plan, rank: int) -> int:
    """States whose prefix has lexicographic rank < ``rank`` (= lexicographic rank of the first state
    of prefix ``rank`` among r-combinations of {0..n−1})."""
    if rank >= plan.total_prefixes:
        return plan.total_states
    prefix = unrank(rank, plan.n - 1, plan.m)
    return lex_rank(prefix + [(prefix[-1] if prefix else -1) + 1], plan.n)


def lex_rank(comb: list[int], n: int) -> int:
    """Lexicographic rank of a combination of {0..n−1}."""
    k = len(comb)
    rank = 0
    prev = -1
    for q, c in enumerate(comb):
        for x in range(prev + 1, c):
            rank += math.comb(n - x - 1, k - q - 1)
        prev = c
    return rank
