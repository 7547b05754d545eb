"""What every search thread shares: its max-heap of the K best states, the pruning threshold, atomics.

Each thread keeps its own max-heap of K states (``heap_e`` energies, ``heap_s`` removed positions,
``heap_n`` sizes); the pruning threshold is the smallest K-th best over all threads (each an upper bound on
the global K-th best) or the plan's seeded cap. Threads read each other's K-th best through relaxed atomic
loads, and take tasks from a shared atomic counter.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

# Per-thread slots in shared arrays are this many entries apart, so that threads updating their own
# slot do not share a cache line.
PAD = 8
# Search statistics per thread: nodes, states, pruned, tasks done, relaxations solved, pruned by them.
NSTATS = 6
# Floating-point freedoms for the kernels: contraction (FMA) and sign of zero; no reassociation, so
# the state energies are summed in a fixed order. NaN and inf keep their meaning (inf = no threshold).
FASTMATH = {"nsz", "arcp", "contract"}


@intrinsic
def fetch_add(typingctx, arr, idx, val):
    """Atomically add ``val`` to ``arr[idx]`` (int64) and return the previous value."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None
    sig = types.int64(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return sig, codegen


@intrinsic
def load_shared(typingctx, arr, idx):
    """``arr[idx]`` read atomically (relaxed): a value other threads write, never cached in a register."""
    if not isinstance(arr, types.Array):
        return None
    sig = arr.dtype(arr, types.intp)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        return builder.load_atomic(ptr, "monotonic", signature.args[0].dtype.bitwidth // 8)

    return sig, codegen


@intrinsic
def store_shared(typingctx, arr, idx, val):
    """``arr[idx] = val`` written atomically (relaxed), for values other threads read."""
    if not isinstance(arr, types.Array):
        return None
    sig = types.none(arr, types.intp, arr.dtype)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        builder.store_atomic(args[2], ptr, "monotonic", signature.args[0].dtype.bitwidth // 8)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, inline="always", _nrt=False)
def shared_threshold(thr, nth, cap):
    """The pruning threshold: the smallest K-th best over all threads, or the seeded cap."""
    m = cap
    for t in range(nth):
        v = load_shared(thr, t * PAD)
        if v < m:
            m = v
    return m


@njit(cache=True, _nrt=False)
def heap_push(heap_e, heap_s, heap_n, thr, tid, e, cur):
    """Offer a state (energy ``e``, removed indices ``cur``) to thread ``tid``'s max-heap of size K."""
    K = heap_e.shape[1]
    r = heap_s.shape[2]
    nh = heap_n[tid * PAD]
    if nh < K:
        i = nh
        while i > 0:
            p = (i - 1) // 2
            if heap_e[tid, p] >= e:
                break
            heap_e[tid, i] = heap_e[tid, p]
            for q in range(r):
                heap_s[tid, i, q] = heap_s[tid, p, q]
            i = p
        nh += 1
        heap_n[tid * PAD] = nh
    else:
        if e >= heap_e[tid, 0]:
            return
        i = 0
        while True:
            left = 2 * i + 1
            if left >= K:
                break
            ch = left
            if left + 1 < K and heap_e[tid, left + 1] > heap_e[tid, left]:
                ch = left + 1
            if heap_e[tid, ch] <= e:
                break
            heap_e[tid, i] = heap_e[tid, ch]
            for q in range(r):
                heap_s[tid, i, q] = heap_s[tid, ch, q]
            i = ch
    heap_e[tid, i] = e
    for q in range(r):
        heap_s[tid, i, q] = cur[q]
    if nh == K:
        store_shared(thr, tid * PAD, heap_e[tid, 0])


@njit(cache=True, inline="always", _nrt=False)
def next_task(stop, counter, lo, hi):
    """The index of this thread's next task in [lo, hi), or -1 once all are taken or the search is stopped."""
    if load_shared(stop, 0) != 0:
        return -1
    i = lo + fetch_add(counter, 0, 1)
    return i if i < hi else -1


@njit(cache=True, inline="always")
def thread_arrays(r, n):
    """One thread's work arrays: fields ``F`` and energies ``E`` per level, suffix bounds ``S``, child
    positions ``pos``, the current prefix ``cur``, a bound heap ``hbuf``, statistics ``st`` and the
    relaxation's scratch ``rw``."""
    F = np.empty((r + 1, n))
    E = np.empty(r + 1)
    S = np.empty((r + 1, n))
    pos = np.empty(r + 1, dtype=np.int64)
    cur = np.empty(r, dtype=np.int32)
    hbuf = np.empty(r + 1)
    st = np.zeros(NSTATS, dtype=np.int64)
    rw = (np.zeros((5, n)), np.zeros(r + 1, dtype=np.int64), np.zeros(r + 1))
    return F, E, S, pos, cur, hbuf, st, rw


@njit(cache=True, inline="always", _nrt=False)
def add_stats(stats, tid, st):
    """Add one thread's statistics to its row of the shared table."""
    for k in range(NSTATS):
        stats[tid, k] += st[k]
