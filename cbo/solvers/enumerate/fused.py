"""The fused kernel: depth-first search whose last four levels run as contiguous vector passes.

Used without caps or a parameter budget and for r >= 3. The pairs (a, b) are laid out in a triangle in
which the pairs above any index form a contiguous prefix. A node with four blocks left computes its pair
energies ``PE_ab = f_a + f_b + Q_ab`` once; for each child c1 the grandchildren's pair energies are
``PE + W_c1`` (``W_c,ab = Q_ca + Q_cb``, precomputed) in one contiguous pass, and the states below
grandchild c2 are ``E + f_c2 + PE3_ab + W_c2,ab``: two loads and an add per state, counted against the
current K-th best by a vectorized loop. Only a child whose count is non-zero is scanned again in scalar
code to push its states. Lower bounds (:mod:`cbo.solvers.enumerate.bounds`) prune nodes above the fused
levels; nodes whose remaining blocks fit the tail window finish in :mod:`cbo.solvers.enumerate.tail`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from cbo.solvers.enumerate.bounds import relax_bound, suffix_bounds
from cbo.solvers.enumerate.heap import heap_push, shared_threshold
from cbo.solvers.enumerate.tail import tail_states
from cbo.solvers.enumerate.threads import FASTMATH, add_stats, load_shared, next_task, thread_arrays


@njit(cache=True, inline="always")
def _cnt2(m):
    return (m * (m - 1)) // 2


@njit(cache=True)
def pair_tables(Q):
    """The pair triangle: pairs (a, b), a < b, ordered so that the pairs with a ≥ s are the first
    C(n − s, 2) entries; their couplings ``QP``; and ``W[woff[c] + k] = Q_c,a_k + Q_c,b_k`` for the pairs
    above c."""
    n = Q.shape[0]
    npairs = _cnt2(n)
    pa = np.empty(npairs, dtype=np.int32)
    pb = np.empty(npairs, dtype=np.int32)
    QP = np.empty(npairs)
    for a in range(n - 2, -1, -1):
        k0 = _cnt2(n - a - 1)
        for b in range(a + 1, n):
            k = k0 + b - a - 1
            pa[k] = a
            pb[k] = b
            QP[k] = Q[a, b]
    woff = np.zeros(n + 1, dtype=np.int64)
    for c in range(n):
        woff[c + 1] = woff[c] + _cnt2(n - c - 1)
    W = np.empty(woff[n])
    for c in range(n):
        o = woff[c]
        for k in range(_cnt2(n - c - 1)):
            W[o + k] = Q[c, pa[k]] + Q[c, pb[k]]
    return pa, pb, QP, W, woff


# The search functions run without reference counting (``_nrt=False``: they allocate nothing), which
# would otherwise cost atomic increments of every array argument on every call. Vectorized loops
# index with unsigned integers: a signed index carries a negative-index check that blocks SIMD.


@njit(cache=True, fastmath=FASTMATH, _nrt=False)
def _pair_energies(F, row, s, n, QP, out):
    """``out[k] = f_a + f_b + Q_ab`` (f = F[row]) for every pair k of the triangle with a ≥ s."""
    for a in range(s, n - 1):
        ln = n - a - 1
        k0 = np.uint64(_cnt2(ln))
        fa = F[row, a]
        b0 = np.uint64(a + 1)
        for i in range(np.uint64(ln)):
            out[k0 + i] = fa + F[row, b0 + i] + QP[k0 + i]


@njit(cache=True, fastmath=FASTMATH, _nrt=False)
def _count_below(PE, W, o, K2, tt):
    """How many of ``PE[k] + W[o + k]``, k < K2, are below ``tt`` (vectorized)."""
    cnt = 0
    uo = np.uint64(o)
    for k in range(np.uint64(K2)):
        if PE[k] + W[uo + k] < tt:
            cnt += 1
    return cnt


@njit(cache=True, fastmath=FASTMATH, _nrt=False)
def _scan3(
    Q, F, row, e, PE, L, s, n, T, W, woff, pa, pb, S, use_bound, heap_e, heap_s, heap_n, thr, nth, tid, cap, slack,
    cur, stats,
):  # fmt: skip
    """Every state below a node with three blocks left (level L, fields F[row], energy e, start s),
    given the pair energies ``PE`` of its remaining pairs: child c's states are e + f_c + PE + W_c.

    The threshold is re-read only after a push (a stale, higher threshold is safe)."""
    t = shared_threshold(thr, nth, cap)
    states = 0
    pruned = 0
    for c in range(s, n - 2):
        if use_bound and S[row, c] > t + slack:
            break
        ec = e + F[row, c]
        m = n - c - 1
        K2 = _cnt2(m)
        if use_bound and m > 16:
            # bound of the child: e + f_c + the 2 smallest (f_j + Q_cj + ½ min_k Q_jk) over j > c
            b1 = np.inf
            b2 = np.inf
            for j in range(c + 1, n):
                v = F[row, j] + Q[c, j] + T[c + 1, 2, j]
                if v < b2:
                    if v < b1:
                        b2 = b1
                        b1 = v
                    else:
                        b2 = v
            if ec + b1 + b2 > t + slack:
                pruned += 1
                continue
        tt = t - ec
        states += K2
        o = woff[c]
        if _count_below(PE, W, o, K2, tt) > 0:
            cur[L] = c
            for k in range(K2):
                v = PE[k] + W[o + k]
                if v < tt:
                    cur[L + 1] = pa[k]
                    cur[L + 2] = pb[k]
                    heap_push(heap_e, heap_s, heap_n, thr, tid, ec + v, cur)
                    t = shared_threshold(thr, nth, cap)
                    tt = t - ec
    stats[1] += states
    stats[2] += pruned


@njit(cache=True, fastmath=FASTMATH, _nrt=False)
def _node4(
    Q, F, E, S, L, s, n, T, QP, W, woff, pa, pb, PE4, PE3, use_bound, heap_e, heap_s, heap_n, thr, nth, tid, cap,
    slack, cur, hbuf, stats, stop, rx, rw, tl, tw,
):  # fmt: skip
    """Every state below a node with four blocks left (level L, start s): its pair energies PE4 once,
    then per child c1 the grandchildren's pair energies PE4 + W_c1 in one contiguous pass."""
    e = E[L]
    three = np.int64(3)  # not a literal: one compiled signature for the callees
    _pair_energies(F, L, s, n, QP, PE4)
    t = shared_threshold(thr, nth, cap)
    nodes = 1
    pruned = 0
    for c1 in range(s, n - 3):
        if load_shared(stop, 0) != 0:
            break
        if use_bound and S[L, c1] > t + slack:
            break
        e3 = e + F[L, c1]
        cur[L] = c1
        for j in range(np.uint64(c1 + 1), np.uint64(n)):
            F[L + 1, j] = F[L, j] + Q[c1, j]
        if use_bound:
            suffix_bounds(F, L + 1, e3, T, c1 + 1, three, n, S, L + 1, hbuf)
            if S[L + 1, c1 + 1] > t + slack:
                pruned += 1
                continue
            if rx[2][n - c1 - 1, 3]:
                stats[4] += 1
                if relax_bound(rx, rw, F, L + 1, c1 + 1, n, three, t + slack - e3) > t + slack - e3:
                    stats[5] += 1
                    pruned += 1
                    continue
        nodes += 1
        if n - c1 - 1 <= tw[2]:
            tail_states(
                F, L + 1, e3, c1 + 1, n, three, tl, tw[0], tw[1], cur, L + 1, heap_e, heap_s, heap_n, thr, nth, tid,
                cap, stats,
            )  # fmt: skip
            t = shared_threshold(thr, nth, cap)
            continue
        K3 = _cnt2(n - c1 - 1)
        o = np.uint64(woff[c1])
        for k in range(np.uint64(K3)):
            PE3[k] = PE4[k] + W[o + k]
        _scan3(
            Q, F, L + 1, e3, PE3, L + 1, c1 + 1, n, T, W, woff, pa, pb, S, use_bound, heap_e, heap_s, heap_n, thr,
            nth, tid, cap, slack, cur, stats,
        )  # fmt: skip
        t = shared_threshold(thr, nth, cap)
    stats[0] += nodes
    stats[2] += pruned


@njit(cache=True, fastmath=FASTMATH, _nrt=False)
def _task_fast(
    Q, T, QP, W, woff, pa, pb, r, prefix, use_bound, heap_e, heap_s, heap_n, thr, nth, tid, cap, slack,
    F, E, S, pos, cur, PE4, PE3, hbuf, stats, stop, rx, rw, tl, tw,
):  # fmt: skip
    """One task: the subtree below a prefix, depth first, down to the fused four-left nodes."""
    n = Q.shape[0]
    d0 = prefix.shape[0]
    for j in range(n):
        F[d0, j] = Q[j, j]
    e = 0.0
    for i in range(d0):
        c = np.int64(prefix[i])
        cur[i] = c
        e += F[d0, c]
        for j in range(c + 1, n):
            F[d0, j] += Q[c, j]
    E[d0] = e
    s0 = prefix[d0 - 1] + 1 if d0 > 0 else 0
    if use_bound:
        t = shared_threshold(thr, nth, cap)
        suffix_bounds(F, d0, e, T, s0, r - d0, n, S, d0, hbuf)
        if S[d0, s0] > t + slack:
            stats[2] += 1
            return
        if rx[2][n - s0, r - d0]:
            stats[4] += 1
            if relax_bound(rx, rw, F, d0, s0, n, r - d0, t + slack - e) > t + slack - e:
                stats[5] += 1
                stats[2] += 1
                return
    if n - s0 <= tw[2]:
        tail_states(
            F, d0, e, s0, n, r - d0, tl, tw[0], tw[1], cur, d0, heap_e, heap_s, heap_n, thr, nth, tid, cap, stats
        )
        return
    if r == 3:
        _pair_energies(F, d0, s0, n, QP, PE3)
        _scan3(
            Q, F, d0, e, PE3, d0, s0, n, T, W, woff, pa, pb, S, use_bound, heap_e, heap_s, heap_n, thr, nth, tid, cap,
            slack, cur, stats,
        )  # fmt: skip
        return
    if d0 == r - 4:
        _node4(
            Q, F, E, S, d0, s0, n, T, QP, W, woff, pa, pb, PE4, PE3, use_bound, heap_e, heap_s, heap_n, thr, nth, tid,
            cap, slack, cur, hbuf, stats, stop, rx, rw, tl, tw,
        )  # fmt: skip
        return
    L = d0
    pos[L] = s0
    t = shared_threshold(thr, nth, cap)
    nodes = 0
    pruned = 0
    while L >= d0:
        if load_shared(stop, 0) != 0:
            break
        c = pos[L]
        rho = r - L
        if c > n - rho:
            L -= 1
            continue
        if use_bound and S[L, c] > t + slack:
            L -= 1
            continue
        pos[L] = c + 1
        cur[L] = c
        ec = E[L] + F[L, c]
        E[L + 1] = ec
        for j in range(np.uint64(c + 1), np.uint64(n)):
            F[L + 1, j] = F[L, j] + Q[c, j]
        if use_bound:
            suffix_bounds(F, L + 1, ec, T, c + 1, rho - 1, n, S, L + 1, hbuf)
            if S[L + 1, c + 1] > t + slack:
                pruned += 1
                continue
            if rx[2][n - c - 1, rho - 1]:
                stats[4] += 1
                if relax_bound(rx, rw, F, L + 1, c + 1, n, rho - 1, t + slack - ec) > t + slack - ec:
                    stats[5] += 1
                    pruned += 1
                    continue
        if n - c - 1 <= tw[2]:
            nodes += 1
            tail_states(
                F, L + 1, ec, c + 1, n, rho - 1, tl, tw[0], tw[1], cur, L + 1, heap_e, heap_s, heap_n, thr, nth, tid,
                cap, stats,
            )  # fmt: skip
            t = shared_threshold(thr, nth, cap)
            continue
        if L + 1 == r - 4:
            _node4(
                Q, F, E, S, L + 1, c + 1, n, T, QP, W, woff, pa, pb, PE4, PE3, use_bound, heap_e, heap_s, heap_n, thr,
                nth, tid, cap, slack, cur, hbuf, stats, stop, rx, rw, tl, tw,
            )  # fmt: skip
            t = shared_threshold(thr, nth, cap)
            continue
        nodes += 1
        L += 1
        pos[L] = c + 1
    stats[0] += nodes
    stats[2] += pruned


@njit(cache=True, parallel=True, nogil=True)
def batch_fused(
    Q, T, QP, W, woff, pa, pb, r, tasks, lo, hi, counter, use_bound, heap_e, heap_s, heap_n, thr, nth, cap, slack, stats,
    stop, rx, tl,
):  # fmt: skip
    n = Q.shape[0]
    npairs = _cnt2(n)
    for slot in prange(nth):
        tid = np.int64(slot)  # prange indices are unsigned in the parallel lowering: one callee signature
        F, E, S, pos, cur, hbuf, st, rw = thread_arrays(r, n)
        PE4 = np.empty(max(npairs, 1))
        PE3 = np.empty(max(npairs, 1))
        window = tl[3].shape[0] - 2
        tw = (np.zeros(max(tl[2][window + 1], 1)), np.zeros(max(window, 1)), window)
        while True:
            i = next_task(stop, counter, lo, hi)
            if i < 0:
                break
            _task_fast(
                Q, T, QP, W, woff, pa, pb, r, tasks[i], use_bound, heap_e, heap_s, heap_n, thr, nth, tid, cap, slack,
                F, E, S, pos, cur, PE4, PE3, hbuf, st, stop, rx, rw, tl, tw,
            )  # fmt: skip
            if load_shared(stop, 0) == 0:
                st[3] += 1
        add_stats(stats, tid, st)
