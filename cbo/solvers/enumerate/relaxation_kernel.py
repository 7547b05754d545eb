"""The numba kernel of the relaxation search: a resumable depth-first branch and bound over one subtree.

Blocks are decided one per level from the last position of a :class:`~cbo.solvers.enumerate.relaxation.CholeskyFactor`
down to position 0; every child is bounded in O(1) from running sums (plus an O(p) update of the partial row
sums when the search descends), the child with the smaller bound is searched first, and a child is pruned when
its bound exceeds the current K-th best (or the given threshold) by more than the factor's rounding slack.
Leaves get their energy recomputed exactly from Q. The whole search state lives in arrays the caller owns, so
the kernel runs for a node budget, returns, and continues from where it stopped on the next call.

Per-kind caps and a parameter budget (``side``) prune children that cannot be completed feasibly: a cap
already reached, too few removable blocks left under the caps, or removed parameters that can no longer land
in ``[pmin, pmax]`` (from prefix tables of the smallest and largest sizes). The relaxation ignores them, so
its bound stays valid. The kernel releases the GIL: several subtrees run on threads at once.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def node_bound(dn, sdn, thn, tan, rho, q, Na, Nh, Nah):
    """The relaxation bound of a node with q free positions (see ``CholeskyFactor``), without the constant."""
    b = 0.5 * dn - 0.5 * sdn
    if q > 0:
        u = rho + tan - 0.5 * Nah[q]
        b += 0.5 * thn - 0.125 * Nh[q] + 0.5 * u * u / Na[q]
    elif rho != 0:
        b = np.inf
    return b


@njit(cache=True)
def push(heap_e, heap_s, nh, e, X, n):
    """Offer a state (energy e, decisions X) to the max-heap of size K; returns the new heap size."""
    K = heap_e.shape[0]
    if nh < K:
        i = nh
        nh += 1
        while i > 0:
            p = (i - 1) // 2
            if heap_e[p] >= e:
                break
            heap_e[i] = heap_e[p]
            heap_s[i, :] = heap_s[p, :]
            i = p
    else:
        if e >= heap_e[0]:
            return nh
        i = 0
        while True:
            left = 2 * i + 1
            if left >= K:
                break
            ch = left
            if left + 1 < K and heap_e[left + 1] > heap_e[left]:
                ch = left + 1
            if heap_e[ch] <= e:
                break
            heap_e[i] = heap_e[ch]
            heap_s[i, :] = heap_s[ch, :]
            i = ch
    heap_e[i] = e
    for k in range(n):
        heap_s[i, k] = X[k]
    return nh


@njit(cache=True, inline="always")
def completable(q, rho, ps, cnt, g_new, cap, minsum, maxsum, avail, pmin, pmax):
    """Whether a node with positions 0..q−1 free, ``rho`` blocks still to remove, removed parameters ``ps`` and
    group counts ``cnt`` (plus one in group ``g_new`` when ``g_new >= 0``) has a completion within the caps
    and the budget."""
    G = cap.shape[0]
    if g_new >= 0 and cnt[g_new] + 1 > cap[g_new]:
        return False
    if ps + minsum[q, rho] > pmax or ps + maxsum[q, rho] < pmin:
        return False
    room = 0
    for g in range(G):
        c = cnt[g] + (1 if g == g_new else 0)
        free = cap[g] - c
        if free > avail[q, g]:
            free = avail[q, g]
        if free > 0:
            room += free
    return room >= rho


@njit(cache=True, nogil=True)
def search_chunk(
    R, a, h, dv, Na, Nh, Nah, Qp, const, slack, thr, heap_e, heap_s, st, fl, S, lv, child, bb, X, top, budget,
    side, kind, cap, size, pmin, pmax, minsum, maxsum, avail, cnt, psum,
):  # fmt: skip
    """Run the depth-first search for at most ``budget`` nodes from the state in (st, fl, S, lv, child, bb, X).

    st = [level p, heap size, nodes, leaves]; fl = [covered fraction]; lv[p] = (D, T_a, T_h, Σdv, ρ) of the
    node at level p; child[p] = children tried; bb[p] = the two children's bounds; cnt[p] and psum[p] its
    removed blocks per cap group and removed parameters (read only with ``side``). The search covers the
    subtree of the node at level ``top``; level top + 1 means done.
    """
    n = R.shape[0]
    p = st[0]
    nh = st[1]
    nodes = 0
    leaves = st[3]
    covered = fl[0]
    idx = np.empty(n, dtype=np.int64)
    while p <= top and nodes < budget:
        if child[p] >= 2:
            p += 1
            continue
        q = p - 1
        s = S[p, q]
        D = lv[p, 0]
        ta = lv[p, 1]
        th = lv[p, 2]
        sd = lv[p, 3]
        rho = int(lv[p, 4])
        if child[p] == 0:
            b0 = np.inf
            b1 = np.inf
            ok0 = rho <= q
            ok1 = rho >= 1
            if side:
                ok0 = ok0 and completable(q, rho, psum[p], cnt[p], -1, cap, minsum, maxsum, avail, pmin, pmax)
                ok1 = ok1 and completable(
                    q, rho - 1, psum[p] + size[q], cnt[p], kind[q], cap, minsum, maxsum, avail, pmin, pmax
                )
            if ok0:
                b0 = node_bound(D + s * s, sd, th - h[q] * s, ta - a[q] * s, rho, q, Na, Nh, Nah)
            if ok1:
                t1 = R[q, q] + s
                b1 = node_bound(
                    D + t1 * t1,
                    sd + dv[q],
                    th - h[q] * s + dv[q] - h[q] * R[q, q],
                    ta - a[q] * s + 1.0 - a[q] * R[q, q],
                    rho - 1,
                    q,
                    Na,
                    Nh,
                    Nah,
                )
            bb[p, 0] = b0
            bb[p, 1] = b1
        v = 0 if bb[p, 0] <= bb[p, 1] else 1
        if child[p] == 1:
            v = 1 - v
        child[p] += 1
        nodes += 1
        lim = thr
        if nh == heap_e.shape[0] and heap_e[0] < lim:
            lim = heap_e[0]
        if bb[p, v] == np.inf or bb[p, v] + const > lim + slack:
            covered += 2.0 ** (q - top)
            continue
        X[q] = v
        if q == 0:
            covered += 2.0 ** (-top)
            leaves += 1
            m = 0
            for j in range(n):
                if X[j] == 1:
                    idx[m] = j
                    m += 1
            e = 0.0
            for u in range(m):
                i = idx[u]
                e += Qp[i, i]
                for t in range(u + 1, m):
                    e += Qp[i, idx[t]]
            if e <= lim + slack:
                nh = push(heap_e, heap_s, nh, e, X, n)
            continue
        lv[q, 0] = D + (R[q, q] * v + s) ** 2
        lv[q, 1] = ta - a[q] * s + v * (1.0 - a[q] * R[q, q])
        lv[q, 2] = th - h[q] * s + v * (dv[q] - h[q] * R[q, q])
        lv[q, 3] = sd + v * dv[q]
        lv[q, 4] = rho - v
        if side:
            for g in range(cnt.shape[1]):
                cnt[q, g] = cnt[p, g]
            psum[q] = psum[p]
            if v == 1:
                cnt[q, kind[q]] += 1
                psum[q] += size[q]
        if v == 1:
            for i in range(q):
                S[q, i] = S[p, i] + R[i, q]
        else:
            for i in range(q):
                S[q, i] = S[p, i]
        child[q] = 0
        p = q
    st[0] = p
    st[1] = nh
    st[2] += nodes
    st[3] = leaves
    fl[0] = covered
