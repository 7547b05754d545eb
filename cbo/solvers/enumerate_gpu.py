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

Testing without a GPU: the kernel is written against a handful of macros (shuffle, ballot, atomic
add), so the same source also compiles with a C++ compiler into a CPU emulator that runs every warp
as 32 threads meeting at barriers (``Options(emulate=True)``, used by the test suite).
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from cbo.errors import SolverError, SolverUnavailableError
from cbo.solvers.base import Problem, Solver, SolverOutput, register

MAX_FREE = 128  # 4 register slots of 32 lanes
MAX_PREFIX = 64  # r − 1 after taking the complement, so r ≤ 65 with r ≤ n/2
MAX_K = 4096
_WARPS_PER_BLOCK = 8

KERNEL_SOURCE = r"""
// Exact top-K enumeration of states with r removed blocks; one warp per chunk of prefixes.
// Compile-time: NSLOT (ceil(n/32)), MMAX (largest prefix length, >= 1).

DEVFN double cbo_slot_value(const double (&F)[NSLOT], int slot) {
    double v = 0.0;
#pragma unroll
    for (int s = 0; s < NSLOT; s++) {
        if (s == slot) v = F[s];
    }
    return v;
}

// lane 0 only: put (ev, prefix + jv) into the warp's list; returns the new threshold
DEVFN double cbo_insert(double ev, const int* comb, int m, int jv, int K, double thr0,
                        double* E, unsigned char* S, int& cnt, int& worst) {
    int R = m + 1;
    int slot;
    if (cnt < K) { slot = cnt; cnt++; } else { slot = worst; }
    E[slot] = ev;
    for (int q = 0; q < m; q++) S[slot * R + q] = (unsigned char)comb[q];
    S[slot * R + m] = (unsigned char)jv;
    if (cnt < K) return thr0;
    worst = 0;
    double wv = E[0];
    for (int t = 1; t < K; t++) {
        if (E[t] > wv) { wv = E[t]; worst = t; }
    }
    return wv < thr0 ? wv : thr0;
}

DEVFN void cbo_warp(const double* RESTRICT D, const double* RESTRICT Qoff,
                    const unsigned long long* RESTRICT binom, int n, int m, int K,
                    unsigned long long p_begin, unsigned long long p_count, unsigned long long chunk,
                    unsigned long long* counter, double thr0, double* outE, unsigned char* outS,
                    int* outN, int lane, long long gw WARP_PARAM) {
    const int NP = n - 1;          // prefixes are m-combinations of {0..NP-1}
    const int R = m + 1;
    double* E = outE + gw * (long long)K;
    unsigned char* S = outS + gw * (long long)K * R;
    int cnt = 0, worst = 0;
    double thr = thr0;
    if (lane == 0) {
        cnt = outN[gw];
        if (cnt >= K) {
            double wv = E[0];
            for (int t = 1; t < K; t++) {
                if (E[t] > wv) { wv = E[t]; worst = t; }
            }
            thr = wv < thr0 ? wv : thr0;
        }
    }
    thr = SHFL_D(thr, 0);
    int comb[MMAX];
    double F[NSLOT];
    while (true) {
        unsigned long long c0 = 0;
        if (lane == 0) c0 = ATOMIC_ADD_U64(counter, chunk);
        c0 = SHFL_U64(c0, 0);
        if (c0 >= p_count) break;
        unsigned long long c1 = c0 + chunk < p_count ? c0 + chunk : p_count;
        // unrank p_begin + c0 (lexicographic rank of an m-combination of {0..NP-1})
        unsigned long long rk = p_begin + c0;
        int x = 0;
        for (int q = 0; q < m; q++) {
            int k = m - q;
            while (true) {
                unsigned long long c = binom[(long long)(NP - x - 1) * (m + 1) + (k - 1)];
                if (rk < c) break;
                rk -= c;
                x++;
            }
            comb[q] = x;
            x++;
        }
        // fields and prefix energy from scratch
        double EP = 0.0;
        for (int q = 0; q < m; q++) {
            int a = comb[q];
            EP += D[a];
            for (int q2 = 0; q2 < q; q2++) EP += Qoff[(long long)comb[q2] * n + a];
        }
#pragma unroll
        for (int s = 0; s < NSLOT; s++) {
            int j = lane + 32 * s;
            double f = 0.0;
            if (j < n) {
                f = D[j];
                for (int q = 0; q < m; q++) f += Qoff[(long long)comb[q] * n + j];
            }
            F[s] = f;
        }
        for (unsigned long long c = c0; c < c1; c++) {
            int last = m > 0 ? comb[m - 1] : -1;
#pragma unroll
            for (int s = 0; s < NSLOT; s++) {
                int j = lane + 32 * s;
                double e = EP + F[s];
                bool pred = (j > last) && (j < n) && (e < thr);
                unsigned int mask = BALLOT(pred);
                while (mask) {
                    int src = FFS(mask) - 1;
                    mask &= mask - 1u;
                    double ev = SHFL_D(e, src);
                    if (ev < thr) {
                        double nt = thr;
                        if (lane == 0) nt = cbo_insert(ev, comb, m, src + 32 * s, K, thr0, E, S, cnt, worst);
                        thr = SHFL_D(nt, 0);
                    }
                }
            }
            if (c + 1 >= c1) break;
            // next prefix in lexicographic order: comb[p]++ and reset the tail
            int p = m - 1;
            while (p >= 0 && comb[p] == NP - m + p) p--;
            if (p < 0) break;
            for (int q = m - 1; q >= p; q--) {
                int a = comb[q];
                EP -= SHFL_D(cbo_slot_value(F, a >> 5), a & 31);
#pragma unroll
                for (int s = 0; s < NSLOT; s++) {
                    int j = lane + 32 * s;
                    if (j < n) F[s] -= Qoff[(long long)a * n + j];
                }
            }
            comb[p] += 1;
            for (int q = p + 1; q < m; q++) comb[q] = comb[q - 1] + 1;
            for (int q = p; q < m; q++) {
                int b = comb[q];
                EP += SHFL_D(cbo_slot_value(F, b >> 5), b & 31);
#pragma unroll
                for (int s = 0; s < NSLOT; s++) {
                    int j = lane + 32 * s;
                    if (j < n) F[s] += Qoff[(long long)b * n + j];
                }
            }
        }
    }
    if (lane == 0) outN[gw] = cnt;
}
"""

CUDA_PRELUDE = r"""
#define DEVFN __device__ __forceinline__
#define RESTRICT __restrict__
#define WARP_PARAM
#define WARP_ARG
#define SHFL_D(v, s) __shfl_sync(0xffffffffu, (double)(v), (s))
#define SHFL_U64(v, s) __shfl_sync(0xffffffffu, (unsigned long long)(v), (s))
#define BALLOT(p) __ballot_sync(0xffffffffu, (p))
#define FFS(x) __ffs((int)(x))
#define ATOMIC_ADD_U64(p, v) atomicAdd((p), (unsigned long long)(v))
"""

CUDA_ENTRY = r"""
extern "C" __global__ void __launch_bounds__(256) cbo_enum(
        const double* __restrict__ D, const double* __restrict__ Qoff,
        const unsigned long long* __restrict__ binom, int n, int m, int K,
        unsigned long long p_begin, unsigned long long p_count, unsigned long long chunk,
        unsigned long long* counter, double thr0, double* outE, unsigned char* outS, int* outN) {
    int lane = threadIdx.x & 31;
    long long gw = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    cbo_warp(D, Qoff, binom, n, m, K, p_begin, p_count, chunk, counter, thr0, outE, outS, outN, lane, gw);
}
"""

EMULATOR_PRELUDE = r"""
#include <atomic>
#include <barrier>
#include <thread>
#include <vector>
struct EmuWarp {
    std::barrier<> bar;
    double d[32];
    unsigned long long u[32];
    int p[32];
    EmuWarp() : bar(32) {}
};
static double emu_shfl_d(EmuWarp* w, int lane, double v, int src) {
    w->d[lane] = v; w->bar.arrive_and_wait();
    double r = w->d[src]; w->bar.arrive_and_wait();
    return r;
}
static unsigned long long emu_shfl_u(EmuWarp* w, int lane, unsigned long long v, int src) {
    w->u[lane] = v; w->bar.arrive_and_wait();
    unsigned long long r = w->u[src]; w->bar.arrive_and_wait();
    return r;
}
static unsigned int emu_ballot(EmuWarp* w, int lane, bool pred) {
    w->p[lane] = pred ? 1 : 0; w->bar.arrive_and_wait();
    unsigned int m = 0;
    for (int i = 0; i < 32; i++) if (w->p[i]) m |= (1u << i);
    w->bar.arrive_and_wait();
    return m;
}
#define DEVFN static inline
#define RESTRICT __restrict__
#define WARP_PARAM , EmuWarp* W_
#define WARP_ARG , W_
#define SHFL_D(v, s) emu_shfl_d(W_, lane, (double)(v), (s))
#define SHFL_U64(v, s) emu_shfl_u(W_, lane, (unsigned long long)(v), (s))
#define BALLOT(p) emu_ballot(W_, lane, (p))
#define FFS(x) __builtin_ffs((int)(x))
#define ATOMIC_ADD_U64(p, v) __atomic_fetch_add((p), (unsigned long long)(v), __ATOMIC_SEQ_CST)
"""

EMULATOR_ENTRY = r"""
extern "C" int cbo_emulate(int warps, const double* D, const double* Qoff, const unsigned long long* binom,
                           int n, int m, int K, unsigned long long p_begin, unsigned long long p_count,
                           unsigned long long chunk, unsigned long long* counter, double thr0, double* outE,
                           unsigned char* outS, int* outN) {
    std::vector<EmuWarp> ws(warps);
    std::vector<std::thread> th;
    for (int w = 0; w < warps; w++) {
        for (int lane = 0; lane < 32; lane++) {
            EmuWarp* W_ = &ws[w];
            th.emplace_back([=]() {
                cbo_warp(D, Qoff, binom, n, m, K, p_begin, p_count, chunk, counter, thr0, outE, outS, outN,
                         lane, (long long)w, W_);
            });
        }
    }
    for (auto& t : th) t.join();
    return 0;
}
"""


def kernel_defines(n: int, m: int) -> str:
    return f"#define NSLOT {max(1, math.ceil(n / 32))}\n#define MMAX {max(1, m)}\n"


def cuda_source(n: int, m: int) -> str:
    """The complete CUDA C++ source of the kernel for n free blocks and prefixes of length m."""
    return kernel_defines(n, m) + CUDA_PRELUDE + KERNEL_SOURCE + CUDA_ENTRY


def emulator_source(n: int, m: int) -> str:
    """The same kernel as C++ for the CPU emulator (each lane a thread, warps meet at barriers)."""
    return kernel_defines(n, m) + EMULATOR_PRELUDE + KERNEL_SOURCE + EMULATOR_ENTRY


# ----------------------------------------------------------------------------- host-side logic
def binomial_table(a_max: int, m: int) -> np.ndarray:
    """(a_max+1, m+1) uint64 table of C(a, b); entries above 2**64 − 1 (never read) are clamped."""
    T = np.zeros((a_max + 1, m + 1), dtype=np.uint64)
    cap = 2**64 - 1
    for a in range(a_max + 1):
        for b in range(m + 1):
            T[a, b] = min(math.comb(a, b), cap)
    return T


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
        self.warps = self.blocks * _WARPS_PER_BLOCK
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
            (32 * _WARPS_PER_BLOCK,),
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


class _EmulatedDevice:
    """Runs the same kernel source on the CPU (g++; each lane a thread) for tests without a GPU."""

    def __init__(self, plan: Plan, K: int, warps: int = 2) -> None:
        self.lib = _emulator_library(plan.n, plan.m)
        self.warps = int(warps)
        self.sm_count = 0
        self.name = "CPU emulator"
        self.compile_seconds = 0.0
        R = plan.m + 1
        self.plan, self.K = plan, K
        self.binom = np.ascontiguousarray(binomial_table(plan.n, plan.m))
        self.outE = np.full(self.warps * K, np.inf)
        self.outS = np.zeros(self.warps * K * R, dtype=np.uint8)
        self.outN = np.zeros(self.warps, dtype=np.int32)
        self.counter = np.zeros(1, dtype=np.uint64)

    def launch(self, p_begin: int, p_count: int, chunk: int, thr0: float) -> None:
        p = self.plan
        self.counter[:] = 0

        def ptr(a: np.ndarray) -> ctypes.c_void_p:
            return a.ctypes.data_as(ctypes.c_void_p)

        self.lib.cbo_emulate(
            ctypes.c_int(self.warps),
            ptr(p.D),
            ptr(p.Qoff),
            ptr(self.binom),
            ctypes.c_int(p.n),
            ctypes.c_int(p.m),
            ctypes.c_int(self.K),
            ctypes.c_ulonglong(p_begin),
            ctypes.c_ulonglong(p_count),
            ctypes.c_ulonglong(chunk),
            ptr(self.counter),
            ctypes.c_double(thr0),
            ptr(self.outE),
            ptr(self.outS),
            ptr(self.outN),
        )

    def results(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.outE.copy(), self.outS.copy(), self.outN.copy()


def _emulator_library(n: int, m: int) -> Any:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise SolverUnavailableError("the GPU-kernel emulator needs a C++20 compiler (g++ or clang++).")
    src = emulator_source(n, m)
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / "cbo_gpu_emulator"
    cache.mkdir(exist_ok=True)
    lib = cache / f"emu_{digest}.so"
    if not lib.exists():
        cpp = cache / f"emu_{digest}.cpp"
        cpp.write_text(src)
        tmp = cache / f"emu_{digest}.{os.getpid()}.so"
        cmd = [cxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", str(cpp), "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SolverError(f"compiling the kernel emulator failed:\n{proc.stderr[-2000:]}")
        tmp.replace(lib)
    return ctypes.CDLL(str(lib))


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


# ----------------------------------------------------------------------------- solver
@register
class EnumerateGPU(Solver):
    """Exact top-K by full enumeration on an NVIDIA GPU (CuPy raw kernel)."""

    name = "enumerate-gpu"
    aliases = ("gpu", "exact-gpu")
    exact = True
    description = "exact top-K by full enumeration on a CUDA GPU (CuPy raw kernel)"
    battery_options: ClassVar[dict] = {}
    battery_max_n: ClassVar[int] = 20

    @dataclass
    class Options:
        """Settings of GPU enumeration.

        Attributes:
            warm_start: an upper bound on the K-th best energy (e.g. from a heuristic); states above
                it are never stored. Must be a true bound, or states are lost.
            blocks: CUDA blocks of 256 threads (default 8 per multiprocessor).
            device: CUDA device index.
            batch_seconds: target seconds per kernel launch; the time limit is checked in between.
            emulate: run the kernel source on the CPU emulator instead (testing without a GPU).
            emulate_warps: warps the emulator runs at once.
        """

        warm_start: float | None = None
        blocks: int | None = None
        device: int = 0
        batch_seconds: float = 1.0
        emulate: bool = False
        emulate_warps: int = 2

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return cuda_device_status()

    @classmethod
    def make_options(cls, options: dict[str, Any]) -> Any:
        opts = super().make_options(options)
        if opts.batch_seconds is None or not opts.batch_seconds > 0:
            raise SolverError(f"batch_seconds must be > 0, got {opts.batch_seconds!r}.")
        if opts.blocks is not None and (not isinstance(opts.blocks, (int, np.integer)) or opts.blocks < 1):
            raise SolverError(f"blocks must be an integer >= 1, got {opts.blocks!r}.")
        return opts

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        return enumerate_on_device(problem, options)


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
        device: Any = _EmulatedDevice(plan, k, options.emulate_warps)
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
    states_done = plan.total_states if finished else _states_before(plan, done)
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


def _states_before(plan: Plan, rank: int) -> int:
    """States whose prefix has lexicographic rank < ``rank`` (= lexicographic rank of the first state
    of prefix ``rank`` among r-combinations of {0..n−1})."""
    if rank >= plan.total_prefixes:
        return plan.total_states
    prefix = unrank(rank, plan.n - 1, plan.m)
    return _lex_rank(prefix + [(prefix[-1] if prefix else -1) + 1], plan.n)


def _lex_rank(comb: list[int], n: int) -> int:
    """Lexicographic rank of a combination of {0..n−1}."""
    k = len(comb)
    rank = 0
    prev = -1
    for q, c in enumerate(comb):
        for x in range(prev + 1, c):
            rank += math.comb(n - x - 1, k - q - 1)
        prev = c
    return rank
