"""What the threads of one parallel search share: atomics, the task hand-out, work arrays, statistics.

Tasks are handed out dynamically: every thread takes the next index from a shared atomic counter
(:func:`next_task`) until the batch is done or the stop flag is set. Threads read values other threads
write (their K-th best, the stop flag) through relaxed atomic loads, never cached in a register.
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
