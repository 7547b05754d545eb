"""The generic kernel: depth-first search with a leaf loop, for caps, a parameter budget, r <= 2 or large n.

It tracks the removed count of every cap group and the removed parameters along the prefix, and prunes
prefixes that can no longer be completed feasibly (``child_ok``), besides the lower bounds of
:mod:`cbo.solvers.enumerate.bounds`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from cbo.solvers.enumerate.bounds import relax_bound, suffix_bounds
from cbo.solvers.enumerate.heap import heap_push, shared_threshold
from cbo.solvers.enumerate.threads import FASTMATH, add_stats, load_shared, next_task, thread_arrays


@njit(cache=True, _nrt=False)
def _child_ok(c, L, r, kind, capk, size, pmin, pmax, minsum, maxsum, avail, cnt, P):
    """Whether choosing ``c`` after level-L prefix (counts ``cnt[L]``, params ``P[L]``) can still be
    completed into a feasible state; fills level L+1 counts and params."""
    k = kind[c]
    if cnt[L, k] + 1 > capk[k]:
        return False
    nk = capk.shape[0]
    for q in range(nk):
        cnt[L + 1, q] = cnt[L, q]
    cnt[L + 1, k] += 1
    p = P[L] + size[c]
    P[L + 1] = p
    left = r - L - 1
    if p + minsum[c + 1, left] > pmax or p + maxsum[c + 1, left] < pmin:
        return False
    if left > 0:
        room = 0
        for q in range(nk):
            room += min(avail[c + 1, q], capk[q] - cnt[L + 1, q])
        if room < left:
            return False
    return True


@njit(cache=True, fastmath=FASTMATH, _nrt=False)
def _task_generic(
    Q, T, r, prefix, use_bound, side, kind, capk, size, pmin, pmax, minsum, maxsum, avail, heap_e, heap_s, heap_n,
    thr, nth, tid, cap, slack, F, E, S, pos, cur, cnt, P, hbuf, stats, stop, rx, rw,
):  # fmt: skip
    n = Q.shape[0]
    d0 = prefix.shape[0]
    for q in range(cnt.shape[1]):
        cnt[0, q] = 0
    P[0] = 0
    for j in range(n):
        F[0, j] = Q[j, j]
    E[0] = 0.0
    # walk the prefix level by level (keeps counts and params exact for the side constraints)
    for i in range(d0):
        c = np.int64(prefix[i])
        cur[i] = c
        if side and not _child_ok(c, i, r, kind, capk, size, pmin, pmax, minsum, maxsum, avail, cnt, P):
            stats[2] += 1
            return
        E[i + 1] = E[i] + F[i, c]
        for j in range(c + 1, n):
            F[i + 1, j] = F[i, j] + Q[c, j]
    s0 = prefix[d0 - 1] + 1 if d0 > 0 else 0
    if use_bound:
        t = shared_threshold(thr, nth, cap)
        suffix_bounds(F, d0, E[d0], T, s0, r - d0, n, S, d0, hbuf)
        if S[d0, s0] > t + slack:
            stats[2] += 1
            return
        if rx[2][n - s0, r - d0]:
            stats[4] += 1
            if relax_bound(rx, rw, F, d0, s0, n, r - d0, t + slack - E[d0]) > t + slack - E[d0]:
                stats[5] += 1
                stats[2] += 1
                return
    L = d0
    pos[L] = s0
    while L >= d0:
        if load_shared(stop, 0) != 0:
            break
        rho = r - L
        if rho == 1:
            # leaf level: every remaining block completes a state
            eL = E[L]
            t = shared_threshold(thr, nth, cap)
            for c in range(pos[L], n):
                if use_bound and S[L, c] > t + slack:
                    break
                if side:
                    k = kind[c]
                    if cnt[L, k] + 1 > capk[k]:
                        continue
                    p = P[L] + size[c]
                    if p > pmax or p < pmin:
                        continue
                stats[1] += 1
                v = eL + F[L, c]
                if v < t:
                    cur[L] = c
                    heap_push(heap_e, heap_s, heap_n, thr, tid, v, cur)
                    t = shared_threshold(thr, nth, cap)
            L -= 1
            continue
        c = pos[L]
        if c > n - rho:
            L -= 1
            continue
        t = shared_threshold(thr, nth, cap)
        if use_bound and S[L, c] > t + slack:
            L -= 1
            continue
        pos[L] = c + 1
        if side and not _child_ok(c, L, r, kind, capk, size, pmin, pmax, minsum, maxsum, avail, cnt, P):
            stats[2] += 1
            continue
        cur[L] = c
        ec = E[L] + F[L, c]
        E[L + 1] = ec
        for j in range(c + 1, n):
            F[L + 1, j] = F[L, j] + Q[c, j]
        if use_bound:
            suffix_bounds(F, L + 1, ec, T, c + 1, rho - 1, n, S, L + 1, hbuf)
            if S[L + 1, c + 1] > t + slack:
                stats[2] += 1
                continue
            if rx[2][n - c - 1, rho - 1]:
                stats[4] += 1
                if relax_bound(rx, rw, F, L + 1, c + 1, n, rho - 1, t + slack - ec) > t + slack - ec:
                    stats[5] += 1
                    stats[2] += 1
                    continue
        stats[0] += 1
        L += 1
        pos[L] = c + 1


@njit(cache=True, parallel=True, nogil=True)
def batch_generic(
    Q, T, r, tasks, lo, hi, counter, use_bound, side, kind, capk, size, pmin, pmax, minsum, maxsum, avail, heap_e,
    heap_s, heap_n, thr, nth, cap, slack, stats, stop, rx,
):  # fmt: skip
    n = Q.shape[0]
    nk = capk.shape[0]
    for slot in prange(nth):
        tid = np.int64(slot)  # prange indices are unsigned in the parallel lowering: one callee signature
        F, E, S, pos, cur, hbuf, st, rw = thread_arrays(r, n)
        cnt = np.zeros((r + 1, nk), dtype=np.int64)
        P = np.zeros(r + 1, dtype=np.int64)
        while True:
            i = next_task(stop, counter, lo, hi)
            if i < 0:
                break
            _task_generic(
                Q, T, r, tasks[i], use_bound, side, kind, capk, size, pmin, pmax, minsum, maxsum, avail, heap_e,
                heap_s, heap_n, thr, nth, tid, cap, slack, F, E, S, pos, cur, cnt, P, hbuf, st, stop, rx, rw,
            )  # fmt: skip
            if load_shared(stop, 0) == 0:
                st[3] += 1
        add_stats(stats, tid, st)
