"""Exact top-K enumeration on the CPU: depth-first branch and bound over all states with Σx = M.

The free blocks (not kept, not forced) are reordered (by ascending diagonal by default, so that
good states come early) and the states are visited in lexicographic order of their removed-block
indices. Every node keeps the field ``f_j = Q_jj + Σ_{i chosen} Q_ij`` of each candidate ``j``, so
adding ``j`` costs ``f_j``.

Fast path (no caps or parameter budget, r ≥ 3): the last levels are fused. The pairs (a, b) are laid
out in a triangle in which the pairs above any index form a contiguous prefix. A node with four
blocks left computes its pair energies ``PE_ab = f_a + f_b + Q_ab`` once; for each child c1 the
grandchildren's pair energies are ``PE + W_c1`` (``W_c,ab = Q_ca + Q_cb``, precomputed) in one
contiguous pass, and the states below grandchild c2 are ``E + f_c2 + PE3_ab + W_c2,ab``: two loads and
an add per state, counted against the current K-th best by a vectorized loop. Only a child whose count
is non-zero is scanned again in scalar code to push its states. The kernels run without reference
counting (``_nrt=False``) and index their vectorized loops with unsigned integers.

Generic path (caps or a parameter budget, r ≤ 2, or very large n): the same search with a leaf loop,
tracking the removed count of every kind and the removed parameters, and pruning prefixes that can no
longer be completed feasibly.

Bounds (``bound=True``), for a prefix with energy ``E``, fields ``f`` and ``ρ`` blocks still to choose
from ``R = {j ≥ s}``:

* Per-row bound: every completion ``S ⊂ R``, ``|S| = ρ`` has energy
  ``E + Σ_{j∈S} (f_j + ½ Σ_{k∈S, k≠j} Q_jk) ≥ E + (sum of the ρ smallest of f_j + T[s, ρ, j])`` with
  ``T[s, ρ, j] = ½·(sum of the ρ−1 smallest Q_jk over k ≥ s, k ≠ j)``, a table that does not depend on
  the prefix. The same bound over the suffix ``{j ≥ c}`` covers every later child of a node, so the
  child loop stops as soon as it exceeds the K-th best. Cheap (O(|R| log ρ)) but weak for large ρ.
* Convex relaxation (``relaxation=True``, at nodes with at least ``relax_min_states`` states below):
  with C the off-diagonal part of Q and λ the smallest shift that makes ``C + λI`` positive
  semidefinite on the plane Σy = 0 (computed once), a completion's energy is the convex function
  ``E + ½yᵀ(C + λI)y + Σ_j (f_j − λ/2) y_j`` at a 0/1 point. Its minimum over the capped simplex
  {0 ≤ y ≤ 1, Σy = ρ} bounds every completion; Frank–Wolfe gives a valid dual bound at every iteration
  and stops as soon as the node is pruned or provably cannot be. This is what proves M ≈ n/5..n/2.

A node is pruned only when a bound exceeds the K-th best found so far by more than a rounding slack,
so no true top-K state is ever cut.

Threads: tasks are the prefixes of a fixed depth, handed out dynamically (an atomic counter); every
thread keeps its own max-heap of K states, and the pruning threshold is the smallest K-th best over
all threads (each is an upper bound on the global K-th best), a threshold seeded by a greedy +
swap-descent heuristic, or the warm-start energy. The search runs in a worker thread (the kernels
release the GIL) while the caller watches the time limit and Ctrl-C; either sets a flag that every
thread checks at each node, and the best states found so far (with the heuristic's) come back marked
inexact.

Split searches (``plan_enumeration`` / ``enumerate_tasks`` / ``merge_task_results``) expose the
same search task by task, for sharding over processes or machines.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from cbo.errors import SolverError
from cbo.solvers.base import Problem, Solver, SolverOutput, register

# Per-thread slots in shared arrays are this many entries apart, so that threads updating their own
# slot do not share a cache line.
_PAD = 8
# Largest pair table (C(n, 3) doubles) the fused kernel may allocate; larger n use the generic kernel.
_MAX_PAIR_TABLE = 8_000_000
# Largest bound table (n * (r + 1) * n doubles); above it the bound is switched off.
_MAX_BOUND_TABLE = 8_000_000
_BIG_INT = np.int64(2**62)
# Search statistics per thread: nodes, states, pruned, tasks done, relaxations solved, pruned by them.
_NSTATS = 6
# How often the caller checks the time limit while the search runs in its worker thread.
_POLL_SECONDS = 0.02

_ORDERS = ("diagonal", "natural")
# Floating-point freedoms for the kernels: contraction (FMA) and sign of zero; no reassociation, so
# the state energies are summed in a fixed order. NaN and inf keep their meaning (inf = no threshold).
_FM = {"nsz", "arcp", "contract"}


# --------------------------------------------------------------------------------------- primitives
@intrinsic
def _fetch_add(typingctx, arr, idx, val):
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
def _load_shared(typingctx, arr, idx):
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
def _store_shared(typingctx, arr, idx, val):
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


@njit(cache=True, inline="always")
def _cnt2(m):
    return (m * (m - 1)) // 2


@njit(cache=True, inline="always", _nrt=False)
def _threshold(thr, nth, cap):
    """The pruning threshold: the smallest K-th best over all threads, or the seeded cap."""
    m = cap
    for t in range(nth):
        v = _load_shared(thr, t * _PAD)
        if v < m:
            m = v
    return m


@njit(cache=True, _nrt=False)
def _push(heap_e, heap_s, heap_n, thr, tid, e, cur):
    """Offer a state (energy ``e``, removed indices ``cur``) to thread ``tid``'s max-heap of size K."""
    K = heap_e.shape[1]
    r = heap_s.shape[2]
    nh = heap_n[tid * _PAD]
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
        heap_n[tid * _PAD] = nh
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
        _store_shared(thr, tid * _PAD, heap_e[tid, 0])


@njit(cache=True, _nrt=False)
def _suffix_bounds(F, row, e, T, s, rho, n, S, srow, hbuf):
    """``S[srow, c] = e + sum of the rho smallest F[row, j] + T[s, rho, j] over j >= c``, c in [s, n − rho].

    A right-to-left scan keeping the rho smallest values in a max-heap (``hbuf``). Rows are passed
    by index: array views would cost reference counting in the hot loop.
    """
    size = 0
    total = 0.0
    for j in range(n - 1, s - 1, -1):
        v = F[row, j] + T[s, rho, j]
        if size < rho:
            i = size
            while i > 0:
                p = (i - 1) // 2
                if hbuf[p] >= v:
                    break
                hbuf[i] = hbuf[p]
                i = p
            hbuf[i] = v
            size += 1
            total += v
        elif v < hbuf[0]:
            total += v - hbuf[0]
            i = 0
            while True:
                left = 2 * i + 1
                if left >= rho:
                    break
                ch = left
                if left + 1 < rho and hbuf[left + 1] > hbuf[left]:
                    ch = left + 1
                if hbuf[ch] <= v:
                    break
                hbuf[i] = hbuf[ch]
                i = ch
            hbuf[i] = v
        if size == rho:
            S[srow, j] = e + total


# --------------------------------------------------------------------------------------- tables
@njit(cache=True)
def _bound_table(Q, rmax):
    """``T[s, rho, j] = ½·(sum of the rho−1 smallest Q_jk over k ≥ s, k ≠ j)`` for j ≥ s."""
    n = Q.shape[0]
    T = np.zeros((n, rmax + 1, n))
    for j in range(n):
        row = Q[j].copy()
        row[j] = np.inf
        order = np.argsort(row)
        for s in range(j + 1):
            acc = 0.0
            taken = 0
            for t in range(n - 1):
                k = order[t]
                if k < s:
                    continue
                taken += 1
                if taken > rmax - 1:
                    break
                acc += row[k]
                T[s, taken + 1, j] = 0.5 * acc
            # fewer candidates than needed: the state cannot exist; keep the bound finite and valid
            for rho in range(taken + 2, rmax + 1):
                T[s, rho, j] = T[s, taken + 1, j] if taken + 1 <= rmax else 0.0
    return T


@njit(cache=True)
def _pair_tables(Q):
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


@njit(cache=True)
def _seed_threshold(Q, r, K):
    """An upper bound on the K-th best energy from a heuristic, or inf.

    Greedy construction from every possible first block, each followed by best-improvement swap
    descent; the best local optimum and its r·(n−r) single-swap neighbours are distinct states, so the
    K-th smallest of their energies bounds the true K-th best from above.
    """
    n = Q.shape[0]
    best_e = np.inf
    best = np.zeros(n, dtype=np.bool_)
    inset = np.zeros(n, dtype=np.bool_)
    f = np.empty(n)
    if r == 0 or r == n:
        return np.inf, best
    for start in range(n):
        inset[:] = False
        for j in range(n):
            f[j] = Q[j, j]
        e = 0.0
        inset[start] = True
        e += f[start]
        for j in range(n):
            if j != start:
                f[j] += Q[start, j]
        for _ in range(r - 1):
            bj = -1
            bv = np.inf
            for j in range(n):
                if not inset[j] and f[j] < bv:
                    bv = f[j]
                    bj = j
            inset[bj] = True
            e += bv
            for j in range(n):
                if j != bj:
                    f[j] += Q[bj, j]
        # f_j for j in the set excludes its own row; for j outside it is the cost of adding j
        for _it in range(10 * n):
            bd = -1e-12 * (1.0 + abs(e))
            bi = -1
            bo = -1
            for i in range(n):
                if not inset[i]:
                    continue
                for j in range(n):
                    if inset[j]:
                        continue
                    d = f[j] - f[i] - Q[i, j]
                    if d < bd:
                        bd = d
                        bi = i
                        bo = j
            if bi < 0:
                break
            inset[bi] = False
            inset[bo] = True
            e += bd
            for j in range(n):
                if j != bi:
                    f[j] -= Q[bi, j]
                if j != bo:
                    f[j] += Q[bo, j]
        if e < best_e:
            best_e = e
            best[:] = inset
    if K == 1:
        return best_e, best
    nb = r * (n - r)
    if nb + 1 < K:
        return np.inf, best
    # neighbour energies of the best local optimum
    for j in range(n):
        f[j] = Q[j, j]
    for i in range(n):
        if best[i]:
            for j in range(n):
                if j != i:
                    f[j] += Q[i, j]
    vals = np.empty(nb + 1)
    vals[0] = best_e
    m = 1
    for i in range(n):
        if not best[i]:
            continue
        for j in range(n):
            if best[j]:
                continue
            vals[m] = best_e + f[j] - f[i] - Q[i, j]
            m += 1
    vals.sort()
    return vals[K - 1], best


# --------------------------------------------------------------------------------------- convex bound
@njit(cache=True, _nrt=False)
def _smallest(v, m, rho, sel, hv):
    """Indices of the rho smallest of v[0:m] into sel[0:rho] (unordered; a max-heap on hv)."""
    size = 0
    for i in range(m):
        x = v[i]
        if size < rho:
            k = size
            while k > 0:
                p = (k - 1) // 2
                if hv[p] >= x:
                    break
                hv[k] = hv[p]
                sel[k] = sel[p]
                k = p
            hv[k] = x
            sel[k] = i
            size += 1
        elif x < hv[0]:
            k = 0
            while True:
                left = 2 * k + 1
                if left >= rho:
                    break
                ch = left
                if left + 1 < rho and hv[left + 1] > hv[left]:
                    ch = left + 1
                if hv[ch] <= x:
                    break
                hv[k] = hv[ch]
                sel[k] = sel[ch]
                k = ch
            hv[k] = x
            sel[k] = i


@njit(cache=True, fastmath=_FM, _nrt=False)
def _relax_bound(rx, rw, F, row, c0, n, rho, target):
    """Lower bound on the energy of every completion below a node, from its convex relaxation.

    For the remaining blocks j ≥ c0 (fields F[row, j]) and ``rho`` of them still to remove, every
    completion y ∈ {0,1} with Σy = rho has energy ``½yᵀ(C + λI)y + Σ_j (f_j − λ/2) y_j`` (y_j² = y_j),
    where C is the off-diagonal part of Q and λ makes C + λI positive semidefinite on Σy = 0 (see
    :func:`_relaxation_shift`). Minimizing that convex function over the capped simplex
    {0 ≤ y ≤ 1, Σy = rho} bounds every completion from below; Frank–Wolfe iterates give the dual
    bound ``φ(y) + ∇φ(y)·(s − y)`` (s the best vertex) at every step. Stops as soon as the bound
    exceeds ``target`` (the node can be pruned) or the iterate's value falls below it (it cannot).
    """
    A, lamh, _big, iters = rx
    work, sel, hv = rw
    y = work[0]
    g = work[1]
    b = work[2]
    a = work[3]
    s = work[4]
    m = n - c0
    for i in range(m):
        b[i] = F[row, c0 + i] - lamh[c0 + i]
        y[i] = 0.0
        s[i] = 0.0
        g[i] = b[i]
    # start at the vertex of the rho smallest linear costs
    _smallest(b, m, rho, sel, hv)
    for t in range(rho):
        y[sel[t]] = 1.0
        j = c0 + sel[t]
        for i in range(m):
            g[i] += A[j, c0 + i]
    best = -np.inf
    for _ in range(iters):
        phi = 0.0
        gy = 0.0
        for i in range(m):
            phi += y[i] * (g[i] + b[i])
            gy += g[i] * y[i]
        phi *= 0.5
        _smallest(g, m, rho, sel, hv)
        gs = 0.0
        for t in range(rho):
            gs += g[sel[t]]
        slope = gs - gy
        if phi + slope > best:
            best = phi + slope
        if best > target or phi <= target or slope >= -1e-12 * (1.0 + abs(phi)):
            return best
        for i in range(m):
            a[i] = b[i] - g[i]  # −A y
        for t in range(rho):
            s[sel[t]] = 1.0
            j = c0 + sel[t]
            for i in range(m):
                a[i] += A[j, c0 + i]  # A (s − y)
        curv = 0.0
        for i in range(m):
            curv += (s[i] - y[i]) * a[i]
        gam = 1.0 if curv <= 0.0 else min(1.0, -slope / curv)
        for i in range(m):
            y[i] += gam * (s[i] - y[i])
            g[i] += gam * a[i]
        for t in range(rho):
            s[sel[t]] = 0.0
    return best


# --------------------------------------------------------------------------------------- tail tables
@njit(cache=True)
def _tail_tables(Q, w):
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


@njit(cache=True, fastmath=_FM, _nrt=False)
def _tail(F, row, e, s, n, rho, tl, SFb, gb, cur, L, heap_e, heap_s, heap_n, thr, nth, tid, cap, stats):
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
    t = _threshold(thr, nth, cap)
    if k == 0:  # all m remaining blocks are removed: one state
        stats[1] += 1
        if base < t:
            for p in range(m):
                cur[L + p] = n - 1 - p
            _push(heap_e, heap_s, heap_n, thr, tid, base, cur)
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
                    _push(heap_e, heap_s, heap_n, thr, tid, base + v, cur)
                    t = _threshold(thr, nth, cap)
                    lim = t - base
    stats[1] += states


# --------------------------------------------------------------------------------------- fast kernel
# The search functions run without reference counting (``_nrt=False``: they allocate nothing), which
# would otherwise cost atomic increments of every array argument on every call. Vectorized loops
# index with unsigned integers: a signed index carries a negative-index check that blocks SIMD.


@njit(cache=True, fastmath=_FM, _nrt=False)
def _pair_energies(F, row, s, n, QP, out):
    """``out[k] = f_a + f_b + Q_ab`` (f = F[row]) for every pair k of the triangle with a ≥ s."""
    for a in range(s, n - 1):
        ln = n - a - 1
        k0 = np.uint64(_cnt2(ln))
        fa = F[row, a]
        b0 = np.uint64(a + 1)
        for i in range(np.uint64(ln)):
            out[k0 + i] = fa + F[row, b0 + i] + QP[k0 + i]


@njit(cache=True, fastmath=_FM, _nrt=False)
def _count_below(PE, W, o, K2, tt):
    """How many of ``PE[k] + W[o + k]``, k < K2, are below ``tt`` (vectorized)."""
    cnt = 0
    uo = np.uint64(o)
    for k in range(np.uint64(K2)):
        if PE[k] + W[uo + k] < tt:
            cnt += 1
    return cnt


@njit(cache=True, fastmath=_FM, _nrt=False)
def _scan3(
    Q, F, row, e, PE, L, s, n, T, W, woff, pa, pb, S, use_bound, heap_e, heap_s, heap_n, thr, nth, tid, cap, slack,
    cur, stats,
):  # fmt: skip
    """Every state below a node with three blocks left (level L, fields F[row], energy e, start s),
    given the pair energies ``PE`` of its remaining pairs: child c's states are e + f_c + PE + W_c.

    The threshold is re-read only after a push (a stale, higher threshold is safe)."""
    t = _threshold(thr, nth, cap)
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
                    _push(heap_e, heap_s, heap_n, thr, tid, ec + v, cur)
                    t = _threshold(thr, nth, cap)
                    tt = t - ec
    stats[1] += states
    stats[2] += pruned


@njit(cache=True, fastmath=_FM, _nrt=False)
def _node4(
    Q, F, E, S, L, s, n, T, QP, W, woff, pa, pb, PE4, PE3, use_bound, heap_e, heap_s, heap_n, thr, nth, tid, cap,
    slack, cur, hbuf, stats, stop, rx, rw, tl, tw,
):  # fmt: skip
    """Every state below a node with four blocks left (level L, start s): its pair energies PE4 once,
    then per child c1 the grandchildren's pair energies PE4 + W_c1 in one contiguous pass."""
    e = E[L]
    three = np.int64(3)  # not a literal: one compiled signature for the callees
    _pair_energies(F, L, s, n, QP, PE4)
    t = _threshold(thr, nth, cap)
    nodes = 1
    pruned = 0
    for c1 in range(s, n - 3):
        if _load_shared(stop, 0) != 0:
            break
        if use_bound and S[L, c1] > t + slack:
            break
        e3 = e + F[L, c1]
        cur[L] = c1
        for j in range(np.uint64(c1 + 1), np.uint64(n)):
            F[L + 1, j] = F[L, j] + Q[c1, j]
        if use_bound:
            _suffix_bounds(F, L + 1, e3, T, c1 + 1, three, n, S, L + 1, hbuf)
            if S[L + 1, c1 + 1] > t + slack:
                pruned += 1
                continue
            if rx[2][n - c1 - 1, 3]:
                stats[4] += 1
                if _relax_bound(rx, rw, F, L + 1, c1 + 1, n, three, t + slack - e3) > t + slack - e3:
                    stats[5] += 1
                    pruned += 1
                    continue
        nodes += 1
        if n - c1 - 1 <= tw[2]:
            _tail(
                F, L + 1, e3, c1 + 1, n, three, tl, tw[0], tw[1], cur, L + 1, heap_e, heap_s, heap_n, thr, nth, tid,
                cap, stats,
            )  # fmt: skip
            t = _threshold(thr, nth, cap)
            continue
        K3 = _cnt2(n - c1 - 1)
        o = np.uint64(woff[c1])
        for k in range(np.uint64(K3)):
            PE3[k] = PE4[k] + W[o + k]
        _scan3(
            Q, F, L + 1, e3, PE3, L + 1, c1 + 1, n, T, W, woff, pa, pb, S, use_bound, heap_e, heap_s, heap_n, thr,
            nth, tid, cap, slack, cur, stats,
        )  # fmt: skip
        t = _threshold(thr, nth, cap)
    stats[0] += nodes
    stats[2] += pruned


@njit(cache=True, fastmath=_FM, _nrt=False)
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
        t = _threshold(thr, nth, cap)
        _suffix_bounds(F, d0, e, T, s0, r - d0, n, S, d0, hbuf)
        if S[d0, s0] > t + slack:
            stats[2] += 1
            return
        if rx[2][n - s0, r - d0]:
            stats[4] += 1
            if _relax_bound(rx, rw, F, d0, s0, n, r - d0, t + slack - e) > t + slack - e:
                stats[5] += 1
                stats[2] += 1
                return
    if n - s0 <= tw[2]:
        _tail(F, d0, e, s0, n, r - d0, tl, tw[0], tw[1], cur, d0, heap_e, heap_s, heap_n, thr, nth, tid, cap, stats)
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
    t = _threshold(thr, nth, cap)
    nodes = 0
    pruned = 0
    while L >= d0:
        if _load_shared(stop, 0) != 0:
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
            _suffix_bounds(F, L + 1, ec, T, c + 1, rho - 1, n, S, L + 1, hbuf)
            if S[L + 1, c + 1] > t + slack:
                pruned += 1
                continue
            if rx[2][n - c - 1, rho - 1]:
                stats[4] += 1
                if _relax_bound(rx, rw, F, L + 1, c + 1, n, rho - 1, t + slack - ec) > t + slack - ec:
                    stats[5] += 1
                    pruned += 1
                    continue
        if n - c - 1 <= tw[2]:
            nodes += 1
            _tail(
                F, L + 1, ec, c + 1, n, rho - 1, tl, tw[0], tw[1], cur, L + 1, heap_e, heap_s, heap_n, thr, nth, tid,
                cap, stats,
            )  # fmt: skip
            t = _threshold(thr, nth, cap)
            continue
        if L + 1 == r - 4:
            _node4(
                Q, F, E, S, L + 1, c + 1, n, T, QP, W, woff, pa, pb, PE4, PE3, use_bound, heap_e, heap_s, heap_n, thr,
                nth, tid, cap, slack, cur, hbuf, stats, stop, rx, rw, tl, tw,
            )  # fmt: skip
            t = _threshold(thr, nth, cap)
            continue
        nodes += 1
        L += 1
        pos[L] = c + 1
    stats[0] += nodes
    stats[2] += pruned


@njit(cache=True, parallel=True, nogil=True)
def _batch_fast(
    Q, T, QP, W, woff, pa, pb, r, tasks, lo, hi, counter, use_bound, heap_e, heap_s, heap_n, thr, nth, cap, slack, stats,
    stop, rx, tl,
):  # fmt: skip
    n = Q.shape[0]
    npairs = _cnt2(n)
    for slot in prange(nth):
        tid = np.int64(slot)  # prange indices are unsigned in the parallel lowering: one callee signature
        F = np.empty((r + 1, n))
        E = np.empty(r + 1)
        S = np.empty((r + 1, n))
        pos = np.empty(r + 1, dtype=np.int64)
        cur = np.empty(r, dtype=np.int32)
        PE4 = np.empty(max(npairs, 1))
        PE3 = np.empty(max(npairs, 1))
        hbuf = np.empty(r + 1)
        st = np.zeros(_NSTATS, dtype=np.int64)
        rw = (np.zeros((5, n)), np.zeros(r + 1, dtype=np.int64), np.zeros(r + 1))
        window = tl[3].shape[0] - 2
        tw = (np.zeros(max(tl[2][window + 1], 1)), np.zeros(max(window, 1)), window)
        while _load_shared(stop, 0) == 0:
            i = lo + _fetch_add(counter, 0, 1)
            if i >= hi:
                break
            _task_fast(
                Q, T, QP, W, woff, pa, pb, r, tasks[i], use_bound, heap_e, heap_s, heap_n, thr, nth, tid, cap, slack,
                F, E, S, pos, cur, PE4, PE3, hbuf, st, stop, rx, rw, tl, tw,
            )  # fmt: skip
            if _load_shared(stop, 0) == 0:
                st[3] += 1
        for k in range(_NSTATS):
            stats[tid, k] += st[k]


# --------------------------------------------------------------------------------------- generic kernel
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


@njit(cache=True, fastmath=_FM, _nrt=False)
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
        t = _threshold(thr, nth, cap)
        _suffix_bounds(F, d0, E[d0], T, s0, r - d0, n, S, d0, hbuf)
        if S[d0, s0] > t + slack:
            stats[2] += 1
            return
        if rx[2][n - s0, r - d0]:
            stats[4] += 1
            if _relax_bound(rx, rw, F, d0, s0, n, r - d0, t + slack - E[d0]) > t + slack - E[d0]:
                stats[5] += 1
                stats[2] += 1
                return
    L = d0
    pos[L] = s0
    while L >= d0:
        if _load_shared(stop, 0) != 0:
            break
        rho = r - L
        if rho == 1:
            # leaf level: every remaining block completes a state
            eL = E[L]
            t = _threshold(thr, nth, cap)
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
                    _push(heap_e, heap_s, heap_n, thr, tid, v, cur)
                    t = _threshold(thr, nth, cap)
            L -= 1
            continue
        c = pos[L]
        if c > n - rho:
            L -= 1
            continue
        t = _threshold(thr, nth, cap)
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
            _suffix_bounds(F, L + 1, ec, T, c + 1, rho - 1, n, S, L + 1, hbuf)
            if S[L + 1, c + 1] > t + slack:
                stats[2] += 1
                continue
            if rx[2][n - c - 1, rho - 1]:
                stats[4] += 1
                if _relax_bound(rx, rw, F, L + 1, c + 1, n, rho - 1, t + slack - ec) > t + slack - ec:
                    stats[5] += 1
                    stats[2] += 1
                    continue
        stats[0] += 1
        L += 1
        pos[L] = c + 1


@njit(cache=True, parallel=True, nogil=True)
def _batch_generic(
    Q, T, r, tasks, lo, hi, counter, use_bound, side, kind, capk, size, pmin, pmax, minsum, maxsum, avail, heap_e,
    heap_s, heap_n, thr, nth, cap, slack, stats, stop, rx,
):  # fmt: skip
    n = Q.shape[0]
    nk = capk.shape[0]
    for slot in prange(nth):
        tid = np.int64(slot)  # prange indices are unsigned in the parallel lowering: one callee signature
        F = np.empty((r + 1, n))
        E = np.empty(r + 1)
        S = np.empty((r + 1, n))
        pos = np.empty(r + 1, dtype=np.int64)
        cur = np.empty(r, dtype=np.int32)
        cnt = np.zeros((r + 1, nk), dtype=np.int64)
        P = np.zeros(r + 1, dtype=np.int64)
        hbuf = np.empty(r + 1)
        st = np.zeros(_NSTATS, dtype=np.int64)
        rw = (np.zeros((5, n)), np.zeros(r + 1, dtype=np.int64), np.zeros(r + 1))
        while _load_shared(stop, 0) == 0:
            i = lo + _fetch_add(counter, 0, 1)
            if i >= hi:
                break
            _task_generic(
                Q, T, r, tasks[i], use_bound, side, kind, capk, size, pmin, pmax, minsum, maxsum, avail, heap_e,
                heap_s, heap_n, thr, nth, tid, cap, slack, F, E, S, pos, cur, cnt, P, hbuf, st, stop, rx, rw,
            )  # fmt: skip
            if _load_shared(stop, 0) == 0:
                st[3] += 1
        for k in range(_NSTATS):
            stats[tid, k] += st[k]


# --------------------------------------------------------------------------------------- the solver
@register
class EnumerateSolver(Solver):
    """Exact top-K by depth-first enumeration with a K-best threshold and lower bounds (CPU, numba)."""

    name = "enumerate"
    aliases = ("exact",)
    exact = True
    description = "exact top-K by branch-and-bound enumeration of all states with Σx = M (CPU, numba, threads)"

    @dataclass
    class Options:
        """Settings of the enumerator.

        Attributes:
            threads: worker threads (default: all numba threads, ``numba.get_num_threads()``).
            bound: prune prefixes with the lower bound (off = plain enumeration of every state).
            warm_start: only states with energy <= this value are sought; the threshold starts there.
                If fewer than K such states exist, the result has fewer than K states (still exact:
                it holds every state at or below the threshold that belongs to the top K).
            order: ``"diagonal"`` (blocks by ascending removal cost, finds good states first) or
                ``"natural"`` (block order).
            task_depth: depth of the prefixes handed to threads as tasks (default: chosen from n, M).
            batch_seconds: target duration of one batch of tasks between progress-bar updates (the
                time limit and Ctrl-C stop the search within a node regardless).
            seed_heuristic: seed the threshold with a greedy + swap-descent solution.
            relaxation: also bound nodes by the convex relaxation of their completions (Frank–Wolfe;
                only with ``bound``). Much stronger than the per-row bound at large M.
            relax_iters: Frank–Wolfe iterations per node at most (it stops early when it can).
            relax_min_states: use the relaxation only at nodes with at least this many states below.
            tail: nodes whose remaining blocks all lie among the last ``tail`` blocks enumerate their
                states flat from precomputed subset tables (2^tail entries; 0 switches it off).
        """

        threads: int | None = None
        bound: bool = True
        warm_start: float | None = None
        order: str = "diagonal"
        task_depth: int | None = None
        batch_seconds: float = 0.2
        seed_heuristic: bool = True
        relaxation: bool = True
        relax_iters: int = 30
        relax_min_states: float = 1000.0
        tail: int = 16

    @classmethod
    def make_options(cls, options: dict[str, Any]) -> Any:
        opts = super().make_options(options)
        if opts.threads is not None:
            limit = numba.config.NUMBA_NUM_THREADS
            if isinstance(opts.threads, bool) or not isinstance(opts.threads, (int, np.integer)):
                raise SolverError(f"threads must be an integer in 1..{limit}, got {opts.threads!r}.")
            if not 1 <= opts.threads <= limit:
                raise SolverError(f"threads={opts.threads} is out of range; use 1..{limit} (NUMBA_NUM_THREADS).")
        if opts.order not in _ORDERS:
            raise SolverError(f"order={opts.order!r} is not valid; use one of {list(_ORDERS)}.")
        if opts.warm_start is not None and not (
            isinstance(opts.warm_start, (int, float, np.number)) and math.isfinite(opts.warm_start)
        ):
            raise SolverError(f"warm_start must be a finite energy or None, got {opts.warm_start!r}.")
        if opts.task_depth is not None and (
            isinstance(opts.task_depth, bool)
            or not isinstance(opts.task_depth, (int, np.integer))
            or opts.task_depth < 0
        ):
            raise SolverError(f"task_depth must be an integer >= 0 or None, got {opts.task_depth!r}.")
        if not (isinstance(opts.batch_seconds, (int, float)) and opts.batch_seconds > 0):
            raise SolverError(f"batch_seconds must be > 0, got {opts.batch_seconds!r}.")
        if (
            isinstance(opts.relax_iters, bool)
            or not isinstance(opts.relax_iters, (int, np.integer))
            or opts.relax_iters < 1
        ):
            raise SolverError(f"relax_iters must be an integer >= 1, got {opts.relax_iters!r}.")
        if not (isinstance(opts.relax_min_states, (int, float)) and opts.relax_min_states >= 0):
            raise SolverError(f"relax_min_states must be a number >= 0, got {opts.relax_min_states!r}.")
        if isinstance(opts.tail, bool) or not isinstance(opts.tail, (int, np.integer)) or not 0 <= opts.tail <= 20:
            raise SolverError(f"tail must be an integer in 0..20, got {opts.tail!r}.")
        return opts

    def run(self, problem: Problem, options: Any) -> SolverOutput:
        return _enumerate(problem, options)


def _side_arrays(problem: Problem, perm: np.ndarray, r: int) -> dict[str, Any]:
    """Kind ids, caps, sizes and budget of the free blocks (in search order), net of the forced ones."""
    q = problem.qubo
    c = q.constraints
    free = problem.free[perm]
    n = len(free)
    kinds = sorted(set(q.kinds))
    kid = {k: i for i, k in enumerate(kinds)}
    kind = np.array([kid[q.kinds[i]] for i in free], dtype=np.int64)
    capk = np.full(len(kinds), _BIG_INT, dtype=np.int64)
    for k, cap in c.caps.items():
        if k in kid:
            forced = sum(1 for i in c.force if q.kinds[i] == k)
            capk[kid[k]] = cap - forced
    size = np.asarray(q.sizes, dtype=np.int64)[free] if n else np.zeros(0, dtype=np.int64)
    forced_params = int(np.asarray(q.sizes, dtype=np.int64)[list(c.force)].sum()) if c.force else 0
    pmax = _BIG_INT if c.max_removed_params is None else np.int64(c.max_removed_params - forced_params)
    pmin = -_BIG_INT if c.min_removed_params is None else np.int64(c.min_removed_params - forced_params)
    minsum = np.full((n + 1, r + 1), _BIG_INT, dtype=np.int64)
    maxsum = np.full((n + 1, r + 1), -_BIG_INT, dtype=np.int64)
    avail = np.zeros((n + 1, len(kinds)), dtype=np.int64)
    for s in range(n, -1, -1):
        tail = np.sort(size[s:])
        m = min(len(tail), r)
        minsum[s, : m + 1] = np.concatenate([[0], np.cumsum(tail[:m])])
        maxsum[s, : m + 1] = np.concatenate([[0], np.cumsum(tail[::-1][:m])])
        if s < n:
            avail[s] = avail[s + 1]
            avail[s, kind[s]] += 1
    return {
        "kind": kind,
        "capk": capk,
        "size": size,
        "pmin": np.int64(pmin),
        "pmax": np.int64(pmax),
        "minsum": minsum,
        "maxsum": maxsum,
        "avail": avail,
    }


def _relaxation_shift(Q: np.ndarray) -> float:
    """The smallest λ with C + λI positive semidefinite on {Σy = 0} (C: Q without its diagonal), plus a
    margin for rounding. It may be negative (C already convex there): the bound is then tighter."""
    n = Q.shape[0]
    C = Q - np.diag(np.diag(Q))
    if n < 2:
        return 0.0
    # orthonormal basis of the complement of the all-ones vector
    basis, _ = np.linalg.qr(np.column_stack([np.ones(n), np.eye(n)[:, : n - 1]]))
    B = basis[:, 1:]
    low = float(np.linalg.eigvalsh(B.T @ C @ B)[0])
    margin = 1e-9 * max(1.0, float(np.abs(C).sum(1).max()))
    return -low + margin


def _seed_states(Q: np.ndarray, best: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """The K best of the heuristic's local optimum and its single-swap neighbours: (energies, positions)."""
    S = np.flatnonzero(best)
    out = np.flatnonzero(~best)
    if not len(S):
        return np.zeros(0), np.zeros((0, 0), dtype=np.int32)
    d = np.diag(Q)
    e0 = float(d[S].sum() + np.triu(Q[np.ix_(S, S)], 1).sum())
    f = d + Q[S].sum(0)
    f[S] -= d[S]  # a chosen block's field excludes its own row: f_i = Q_ii + Σ_{k∈S, k≠i} Q_ik
    energies = [e0]
    states = [S]
    for a, i in enumerate(S):
        de = f[out] - f[i] - Q[i, out]
        for b, j in enumerate(out):
            energies.append(e0 + de[b])
            states.append(np.sort(np.concatenate([np.delete(S, a), [j]])))
    energies = np.asarray(energies)
    order = np.argsort(energies, kind="stable")[:K]
    return energies[order], np.asarray(states, dtype=np.int32)[order]


def _choose_task_depth(n: int, r: int, dmax: int, requested: int | None) -> int:
    if requested is not None:
        return min(int(requested), dmax)
    d = 0
    # tasks are the prefixes of depth d: C(n - r + d, d) of them; aim for a few thousand
    while d < dmax and math.comb(n - r + d + 1, d + 1) <= 6000:
        d += 1
    return d


def _trivial(problem: Problem, r: int, n: int) -> SolverOutput:
    Y = np.zeros((1, n), dtype=np.uint8)
    Y[:, :r] = 1  # r == 0 or r == n: exactly one state
    return SolverOutput(problem.expand(Y), exact=True, info={"states": 1, "nodes": 0, "pruned": 0, "threads": 1})


def _enumerate(problem: Problem, opts: Any) -> SolverOutput:
    n, r = problem.n_free, problem.r
    if r == 0 or r == n:
        return _trivial(problem, r, n)
    plan = plan_enumeration(problem, opts)
    nth = int(opts.threads) if opts.threads is not None else numba.get_num_threads()
    bar = None
    if problem.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(plan.tasks), unit="task", desc=f"enumerate C({n},{r})", leave=False)
    try:
        res = enumerate_tasks(
            plan,
            threads=nth,
            batch_seconds=opts.batch_seconds,
            time_left=problem.time_left,
            progress=None if bar is None else bar.update,
        )
    finally:
        if bar is not None:
            bar.close()
    E, S = merge_task_results(plan, [res])
    info = dict(plan.info)
    info.update(
        threads=nth,
        nodes=res.nodes,
        states=res.states,
        pruned=res.pruned,
        tasks_done=res.done,
        relaxations=res.relaxations,
        relax_pruned=res.relax_pruned,
        interrupted=res.interrupted,
        timed_out=res.timed_out,
    )
    if not len(E) and plan.side:
        info["hint"] = "no state satisfies the caps and the parameter budget together"
    exact = res.done == len(plan.tasks) and not (res.interrupted or res.timed_out)
    return SolverOutput(plan.states(S), exact=exact, info=info)


def _side_arrays_none(n: int, r: int) -> dict[str, Any]:
    """Neutral side-constraint arrays (no caps, no budget) of the types the generic kernel expects."""
    return {
        "kind": np.zeros(n, dtype=np.int64),
        "capk": np.full(1, _BIG_INT, dtype=np.int64),
        "size": np.zeros(n, dtype=np.int64),
        "pmin": np.int64(-_BIG_INT),
        "pmax": np.int64(_BIG_INT),
        "minsum": np.zeros((n + 1, r + 1), dtype=np.int64),
        "maxsum": np.zeros((n + 1, r + 1), dtype=np.int64),
        "avail": np.zeros((n + 1, 1), dtype=np.int64),
    }


# --------------------------------------------------------------------------------------- split searches
@dataclass
class EnumerationPlan:
    """A prepared exact search: the free blocks' QUBO in search order, the settings, and the tasks.

    The tasks are the prefixes (removed-block positions in search order) of depth ``task_depth``;
    their subtrees partition the search space, so any split of the task list can be searched
    separately (other threads, processes or machines) and the results merged with
    :func:`merge_task_results`. Energies inside the plan are *reduced*: without ``const`` (the energy
    of the forced blocks). A plan pickles without its lookup tables; :meth:`tables` rebuilds them.
    """

    Q: np.ndarray
    perm: np.ndarray
    r: int
    k: int
    fast: bool
    use_bound: bool
    side: bool
    side_arrays: dict[str, Any]
    slack: float
    cap: float
    const: float
    warm_start: float | None
    task_depth: int
    tasks: np.ndarray
    free: np.ndarray
    forced: np.ndarray
    n_blocks: int
    info: dict[str, Any]
    seed_energies: np.ndarray = field(default_factory=lambda: np.zeros(0))
    seed_positions: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int32))
    relax_shift: float | None = None
    relax_iters: int = 30
    relax_min_states: float = 1000.0
    tail_window: int = 0
    _tables: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def n(self) -> int:
        return self.Q.shape[0]

    @property
    def trivial(self) -> bool:
        """Nothing to search: no free block to remove (r = 0) or all of them (r = n)."""
        return self.r == 0 or self.r == self.n

    def task_leaves(self, tasks: np.ndarray | None = None) -> np.ndarray:
        """The number of states below each task, ``C(n − last − 1, r − depth)`` (float64: may exceed 2⁶³)."""
        tasks = self.tasks if tasks is None else tasks
        d0, n, r = self.task_depth, self.n, self.r
        if d0 == 0:
            return np.full(len(tasks), float(math.comb(n, r)))
        return np.array([float(math.comb(n - int(t[-1]) - 1, r - d0)) for t in tasks])

    def tables(self) -> tuple:
        """(T, pair tables, relaxation data, tail tables) for the kernels, built on first use."""
        if self._tables is None:
            T = _bound_table(self.Q, self.r) if self.use_bound else np.zeros((1, 1, 1))
            pairs = _pair_tables(self.Q) if self.fast else None
            tail = _tail_tables(self.Q, min(self.tail_window, self.n) if self.fast else 0)
            self._tables = (T, pairs, self._relaxation(), tail)
        return self._tables

    def _relaxation(self) -> tuple:
        """(A = C + λI, λ/2 per block, which (remaining, to remove) nodes use it, iterations)."""
        n, r = self.n, self.r
        big = np.zeros((n + 1, r + 1), dtype=np.uint8)
        if self.relax_shift is None or not self.use_bound:
            return (np.zeros((1, 1)), np.zeros(1), big, np.int64(1))
        lam = float(self.relax_shift)
        A = self.Q - np.diag(np.diag(self.Q)) + lam * np.eye(n)
        for m in range(n + 1):
            for rho in range(2, min(r, m - 1) + 1):
                big[m, rho] = math.comb(m, rho) >= self.relax_min_states
        return (np.ascontiguousarray(A), np.full(n, 0.5 * lam), big, np.int64(self.relax_iters))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tables"] = None
        return state

    def states(self, S: np.ndarray) -> np.ndarray:
        """Full (B, N) uint8 states from (B, r) removed positions in search order."""
        S = np.asarray(S, dtype=np.int64).reshape(-1, self.r)
        X = np.zeros((len(S), self.n_blocks), dtype=np.uint8)
        if len(S):
            X[np.arange(len(S))[:, None], self.free[self.perm[S]]] = 1
        if len(self.forced):
            X[:, self.forced] = 1
        return X


@dataclass
class TaskResult:
    """What :func:`enumerate_tasks` found: at most ``k`` states per thread with their reduced energies.

    Attributes:
        energies: (B,) reduced energies (without the plan's ``const``), ascending.
        positions: (B, r) removed positions in search order (``plan.states`` maps them to full states).
        done: how many of the given tasks were searched completely.
        nodes / states / pruned: search statistics.
        interrupted / timed_out: why the search stopped early, if it did.
        relaxations / relax_pruned: convex relaxations solved, and nodes they pruned.
    """

    energies: np.ndarray
    positions: np.ndarray
    done: int
    nodes: int = 0
    states: int = 0
    pruned: int = 0
    interrupted: bool = False
    timed_out: bool = False
    relaxations: int = 0
    relax_pruned: int = 0

    def kth(self, k: int) -> float:
        """The k-th best energy found (an upper bound on the true k-th best), or inf with fewer states."""
        return float(self.energies[k - 1]) if len(self.energies) >= k else np.inf


def plan_enumeration(problem: Problem, options: Any = None) -> EnumerationPlan:
    """Prepare the exact search of ``problem`` (reordering, bound switch, seeded threshold, tasks).

    Args:
        problem: a reduced solve request (see :class:`cbo.solvers.base.Problem`).
        options: :class:`EnumerateSolver.Options` (defaults when None).

    Example:
        >>> plan = plan_enumeration(problem, EnumerateSolver.Options())          # doctest: +SKIP
        >>> halves = [enumerate_tasks(plan, part) for part in np.array_split(plan.tasks, 2)]  # doctest: +SKIP
        >>> energies, positions = merge_task_results(plan, halves)               # doctest: +SKIP
    """
    opts = EnumerateSolver.Options() if options is None else options
    n, r, K = problem.n_free, problem.r, problem.k
    Q0 = np.asarray(problem.Q, dtype=np.float64)
    perm = np.argsort(np.diag(Q0), kind="stable") if opts.order == "diagonal" else np.arange(n)
    Q = np.ascontiguousarray(Q0[np.ix_(perm, perm)])
    side = problem.has_side_constraints
    fast = (not side) and r >= 3 and math.comb(n, 3) <= _MAX_PAIR_TABLE
    use_bound = bool(opts.bound)
    info: dict[str, Any] = {"kernel": "fused" if fast else "generic", "order": opts.order}
    if use_bound and n * (r + 1) * n > _MAX_BOUND_TABLE:
        use_bound = False
        info["bound_note"] = f"bound table for n={n}, M={r} too large; bound switched off"
    info["bound"] = use_bound
    trivial = r == 0 or r == n

    # rounding slack: energies are sums of about r² terms; prune only beyond this margin
    slack = 1e-9 * max(1.0, r * float(np.abs(Q).sum(1).max(initial=0.0)))
    cap = np.inf
    if opts.warm_start is not None:
        cap = float(opts.warm_start) - problem.const + slack
        info["warm_start"] = float(opts.warm_start)
    if opts.seed_heuristic and not side and not trivial:
        seed_thr, best = _seed_threshold(Q, r, K)
        info["seed_threshold"] = float(seed_thr + problem.const) if np.isfinite(seed_thr) else None
        cap = min(cap, float(seed_thr) + slack)
        seed_energies, seed_positions = _seed_states(Q, best, K)
    else:
        seed_energies, seed_positions = np.zeros(0), np.zeros((0, r), dtype=np.int32)

    if trivial:
        d0 = 0
        tasks = np.zeros((0, 0), dtype=np.int32)
    else:
        d0 = _choose_task_depth(n, r, max(r - 4, 0) if fast else (r - 1), opts.task_depth)
        combos = list(itertools.combinations(range(n - r + d0), d0))
        tasks = np.array(combos, dtype=np.int32).reshape(len(combos), d0)
    info["task_depth"] = d0
    info["tasks"] = len(tasks)
    sa = _side_arrays(problem, perm, r) if side else _side_arrays_none(n, r)
    relax_shift = None
    if use_bound and opts.relaxation and not trivial and r >= 2:
        relax_shift = _relaxation_shift(Q)
        info["relaxation_shift"] = relax_shift
    info["relaxation"] = relax_shift is not None
    return EnumerationPlan(
        Q=Q,
        perm=perm,
        r=r,
        k=K,
        fast=fast,
        use_bound=use_bound,
        side=side,
        side_arrays=sa,
        slack=slack,
        cap=cap,
        const=float(problem.const),
        warm_start=None if opts.warm_start is None else float(opts.warm_start),
        task_depth=d0,
        tasks=tasks,
        free=np.asarray(problem.free, dtype=np.int64),
        forced=np.asarray(problem.forced, dtype=np.int64),
        n_blocks=problem.qubo.n,
        info=info,
        seed_energies=seed_energies,
        seed_positions=seed_positions,
        relax_shift=relax_shift,
        relax_iters=int(opts.relax_iters),
        relax_min_states=float(opts.relax_min_states),
        tail_window=int(opts.tail),
    )


def enumerate_tasks(
    plan: EnumerationPlan,
    tasks: np.ndarray | None = None,
    *,
    threads: int | None = None,
    threshold: float = np.inf,
    batch_seconds: float = 0.2,
    time_left: Callable[[], float] | None = None,
    share: Callable[[float], float] | None = None,
    progress: Callable[[int], Any] | None = None,
) -> TaskResult:
    """Search the subtrees of ``tasks`` (default: all of the plan's) and return the best states found.

    Only states below the pruning threshold are kept: the smaller of the plan's seeded cap, the
    ``threshold`` given (an upper bound on the global K-th best, e.g. from other workers), and the
    K-th best found so far. The search runs in a worker thread while the calling thread watches the
    time limit and Ctrl-C; either stops it within a node, keeping the states found so far. With
    ``progress`` or ``share``, tasks run in batches of about ``batch_seconds``; after each, ``progress``
    is told, and ``share(local K-th best)`` returns a new global threshold, so that searches on other
    processes prune with each other's finds. Without them, all tasks run in one parallel region.

    Args:
        plan: from :func:`plan_enumeration`.
        tasks: (T, task_depth) prefixes, a subset of ``plan.tasks``.
        threads: numba threads (default: ``numba.get_num_threads()``).
        threshold: starting threshold in reduced energy (without ``plan.const``).
        batch_seconds: target duration of one batch.
        time_left: seconds left (a callable); the search stops, marked ``timed_out``, at 0.
        share: called between batches with the local K-th best (inf until K states are found);
            returns the threshold to prune with.
        progress: called with the number of tasks finished in each batch.
    """
    tasks = plan.tasks if tasks is None else np.ascontiguousarray(tasks, dtype=np.int32)
    ntasks = len(tasks)
    r, K = plan.r, plan.k
    deepest = max(r - 4, 0) if plan.fast else r - 1
    if tasks.ndim != 2 or tasks.shape[1] > deepest:
        raise SolverError(
            f"tasks must be a 2-D array of prefixes of depth <= {deepest} for this plan, got shape {tasks.shape}."
        )
    nth = int(threads) if threads is not None else numba.get_num_threads()
    Q, fast, use_bound, slack = plan.Q, plan.fast, plan.use_bound, plan.slack
    T, pairs, rx, tl = plan.tables()
    sa = plan.side_arrays
    heap_e = np.full((nth, K), np.inf)
    heap_s = np.zeros((nth, K, r), dtype=np.int32)
    heap_n = np.zeros(nth * _PAD, dtype=np.int64)
    thr = np.full(nth * _PAD, np.inf)
    stats = np.zeros((nth, _NSTATS), dtype=np.int64)
    counter = np.zeros(1, dtype=np.int64)
    stop = np.zeros(1, dtype=np.int64)
    failure: list[BaseException] = []

    def run_batch(lo: int, hi: int, cap: float) -> None:
        counter[0] = 0
        if fast:
            pa, pb, QP, W, woff = pairs
            _batch_fast(
                Q, T, QP, W, woff, pa, pb, r, tasks, lo, hi, counter, use_bound, heap_e, heap_s, heap_n, thr, nth,
                cap, slack, stats, stop, rx, tl,
            )  # fmt: skip
        else:
            _batch_generic(
                Q, T, r, tasks, lo, hi, counter, use_bound, plan.side, sa["kind"], sa["capk"], sa["size"], sa["pmin"],
                sa["pmax"], sa["minsum"], sa["maxsum"], sa["avail"], heap_e, heap_s, heap_n, thr, nth, cap, slack,
                stats, stop, rx,
            )  # fmt: skip

    def left() -> float:
        return float("inf") if time_left is None else time_left()

    def work() -> None:
        # runs in its own thread so that the caller stays responsive to the time limit and Ctrl-C;
        # the kernels release the GIL and stop within a node of ``stop`` being set
        try:
            numba.set_num_threads(nth)  # per-thread setting
            cap = min(plan.cap, float(threshold))
            done = 0
            # batches only serve progress reports and threshold sharing (the stop flag handles the
            # time limit); without either, one parallel region runs every task
            batch = ntasks if progress is None and share is None else min(ntasks, 2 * nth)
            while done < ntasks and stop[0] == 0:
                hi = min(ntasks, done + batch)
                t0 = time.perf_counter()
                run_batch(done, hi, cap)
                dt = time.perf_counter() - t0
                if stop[0] != 0:
                    break
                if progress is not None:
                    progress(hi - done)
                step = hi - done
                done = hi
                if share is not None:
                    cap = min(cap, float(share(float(thr[::_PAD].min()))))
                budget = min(batch_seconds, max(left(), 1e-3))
                rate = step / max(dt, 1e-6)
                batch = int(min(max(rate * budget, nth), 4 * step + nth))
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
            stop[0] = 1

    interrupted = timed_out = False
    worker = threading.Thread(target=work, name="cbo-enumerate", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(timeout=_POLL_SECONDS)
            if worker.is_alive() and left() <= 0:
                timed_out = True
                stop[0] = 1
    except KeyboardInterrupt:
        interrupted = True
        stop[0] = 1
        worker.join()
    if failure:
        raise failure[0]

    # merge the per-thread heaps
    counts = heap_n[::_PAD]
    E = np.concatenate([heap_e[t, : counts[t]] for t in range(nth)])
    S = np.concatenate([heap_s[t, : counts[t]] for t in range(nth)]).reshape(-1, r)
    order = np.argsort(E, kind="stable")[:K]
    tot = stats.sum(0)
    complete = int(tot[3]) == ntasks
    return TaskResult(
        energies=E[order],
        positions=S[order],
        done=int(tot[3]),
        nodes=int(tot[0]),
        states=int(tot[1]),
        pruned=int(tot[2]),
        interrupted=interrupted and not complete,
        timed_out=timed_out and not complete,
        relaxations=int(tot[4]),
        relax_pruned=int(tot[5]),
    )


def merge_task_results(plan: EnumerationPlan, results: Iterable[TaskResult]) -> tuple[np.ndarray, np.ndarray]:
    """The K best (reduced energies, positions) over several results; with a warm start, only those
    at or below it."""
    results = list(results)
    # the heuristic's states take part: a search stopped early may not have reached its threshold
    E = np.concatenate([plan.seed_energies] + [res.energies for res in results])
    S = np.concatenate(
        [plan.seed_positions.reshape(-1, plan.r)] + [res.positions.reshape(-1, plan.r) for res in results]
    )
    S = np.sort(S, axis=1).astype(np.int32)
    if len(S):
        S, first = np.unique(S, axis=0, return_index=True)
        E = E[first]
    order = np.argsort(E, kind="stable")[: plan.k]
    E, S = E[order], S[order]
    if plan.warm_start is not None:
        keep = E + plan.const <= plan.warm_start + plan.slack
        E, S = E[keep], S[keep]
    return E, S
