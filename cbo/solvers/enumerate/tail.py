"""The flat tail: every state below a node whose remaining blocks all lie among the last ``w`` blocks.

Such nodes enumerate their states from precomputed subset tables of the last ``w`` blocks (``tail_tables``,
2^w entries) instead of descending further: sums of fields over subsets are built level by level as
contiguous vector adds, and the last level is counted against the threshold in one vectorized loop.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cbo.solvers.enumerate.heap import heap_push, shared_threshold
from cbo.solvers.enumerate.threads import FASTMATH


@njit(cache=True)
def tail_tables(Q, w):
    """Every subset of the last ``w`` blocks, for nodes whose remaining blocks all lie among them.

    Tail position p is block n − 1 − p. The subsets of size k are stored in colex order, so that the
    subsets of the first m positions (the last m blocks) are a prefix, and those with largest
    position p form the block [C(p, k), C(p + 1, k)) whose members are the (k−1)-subsets of {0..p−1}
    plus p, in the same order as level k−1 itself. Returns (QI: internal coupling of each subset,
    MASK: its positions as bits, off: start of each size, binom, RS[m, p]: coupling of p to the other
    first-m positions, QIall[m]: internal coupling of the first m positions).
    """
    n = Q.shape[0]
    binom = np.zeros((w + 2, w + 2), dtype=np.int64)
    for a in range(w + 2):
        binom[a, 0] = 1
        for b in range(1, a + 1):
            binom[a, b] = binom[a - 1, b - 1] + binom[a - 1, b]
    off = np.zeros(w + 2, dtype=np.int64)
    for k in range(w + 1):
        off[k + 1] = off[k] + binom[w, k]
    QI = np.zeros(max(off[w + 1], 1))
    MASK = np.zeros(max(off[w + 1], 1), dtype=np.int64)
    for k in range(1, w + 1):
        for p in range(k - 1, w):
            ln = binom[p, k - 1]
            dst = off[k] + binom[p, k]
            src = off[k - 1]
            x = n - 1 - p
            for i in range(ln):
                msk = MASK[src + i]
                acc = QI[src + i]
                for q in range(p):
                    if (msk >> q) & 1:
                        acc += Q[x, n - 1 - q]
                QI[dst + i] = acc
                MASK[dst + i] = msk | (1 << p)
    RS = np.zeros((w + 1, max(w, 1)))
    QIall = np.zeros(w + 1)
    for m in range(w + 1):
        for p in range(m):
            acc = 0.0
            for q in range(m):
                if q != p:
                    acc += Q[n - 1 - p, n - 1 - q]
            RS[m, p] = acc
        QIall[m] = QI[off[m]]  # the first subset of size m in colex order is {0, ..., m − 1}
    return QI, MASK, off, binom, RS, QIall


@njit(cache=True, fastmath=FASTMATH, _nrt=False)
def tail_states(F, row, e, s, n, rho, tl, SFb, gb, cur, L, heap_e, heap_s, heap_n, thr, nth, tid, cap, stats):
    """Every state below a node whose remaining blocks are the last m = n − s: the rho-subsets of the
    tail, scanned flat. Sums of fields over subsets are built level by level as contiguous vector
    adds (level k, block p = level k−1's prefix + f_p); the last level is fused with a vectorized count
    against the threshold. When rho > m/2 the m − rho blocks left out are enumerated instead."""
    QI, MASK, off, binom, RS, QIall = tl
    m = n - s
    comp = 2 * rho > m
    k = m - rho if comp else rho
    if comp:
        tot = 0.0
        for p in range(m):
            fx = F[row, n - 1 - p]
            tot += fx
            gb[p] = -(fx + RS[m, p])
        base = e + tot + QIall[m]
    else:
        for p in range(m):
            gb[p] = F[row, n - 1 - p]
        base = e
    t = shared_threshold(thr, nth, cap)
    if k == 0:  # all m remaining blocks are removed: one state
        stats[1] += 1
        if base < t:
            for p in range(m):
                cur[L + p] = n - 1 - p
            heap_push(heap_e, heap_s, heap_n, thr, tid, base, cur)
        return
    SFb[0] = 0.0
    for j in range(1, k):
        src = np.uint64(off[j - 1])
        for p in range(j - 1, m):
            dst = np.uint64(off[j] + binom[p, j])
            gp = gb[p]
            for i in range(np.uint64(binom[p, j - 1])):
                SFb[dst + i] = SFb[src + i] + gp
    src = np.uint64(off[k - 1])
    lim = t - base
    states = 0
    for p in range(k - 1, m):
        ln = binom[p, k - 1]
        q0 = np.uint64(off[k] + binom[p, k])
        gp = gb[p]
        cnt = 0
        for i in range(np.uint64(ln)):
            if SFb[src + i] + gp + QI[q0 + i] < lim:
                cnt += 1
        states += ln
        if cnt > 0:
            for i in range(np.uint64(ln)):
                v = SFb[src + i] + gp + QI[q0 + i]
                if v < lim:
                    msk = MASK[q0 + i]
                    h = L
                    for q in range(m):
                        if ((msk >> q) & 1 == 1) != comp:
                            cur[h] = n - 1 - q
                            h += 1
                    heap_push(heap_e, heap_s, heap_n, thr, tid, base + v, cur)
                    t = shared_threshold(thr, nth, cap)
                    lim = t - base
    stats[1] += states
