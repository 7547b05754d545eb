"""The CUDA kernel of GPU enumeration, as source text, and the CPU emulator that runs the same source.

The kernel is written against a handful of macros (shuffle, ballot, atomic add), so the same source
compiles with NVRTC for the GPU (:func:`cuda_source`, through CuPy) and with a C++ compiler into a CPU
emulator that runs every warp as 32 threads meeting at barriers (:class:`EmulatedDevice`, used by the
test suite and by ``emulate=True``). :mod:`cbo.solvers.enumerate.gpu` explains the work split.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from cbo.errors import SolverError, SolverUnavailableError

WARPS_PER_BLOCK = 8

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


def binomial_table(a_max: int, m: int) -> np.ndarray:
    """(a_max+1, m+1) uint64 table of C(a, b); entries above 2**64 − 1 (never read) are clamped."""
    T = np.zeros((a_max + 1, m + 1), dtype=np.uint64)
    cap = 2**64 - 1
    for a in range(a_max + 1):
        for b in range(m + 1):
            T[a, b] = min(math.comb(a, b), cap)
    return T


class EmulatedDevice:
    """Runs the same kernel source on the CPU (g++; each lane a thread) for tests without a GPU."""

    def __init__(self, plan: Any, K: int, warps: int = 2) -> None:
        self.lib = emulator_library(plan.n, plan.m)
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


def emulator_library(n: int, m: int) -> Any:
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
