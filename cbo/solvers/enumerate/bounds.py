"""Lower bounds on the energy of every completion of a prefix: what lets the exact search prune.

The search state at a node (see :mod:`cbo.solvers.enumerate.fused` and ``generic``): the prefix (the
removed positions chosen so far, in search order) enters a bound only through

* ``e``: the prefix's energy, and
* the fields ``F[row, j] = Q_jj + Σ_{i in prefix} Q_ij`` of the remaining candidates ``j`` (a row of the
  per-level field table ``F``; rows are passed by index, since array views would cost reference
  counting in the hot loop),

with the remaining candidates ``R = {c0, ..., n − 1}`` (positions after the prefix's last) and ``rho``
blocks still to remove. A completion ``S ⊂ R``, ``|S| = rho`` has energy
``e + Σ_{j∈S} F_j + Σ_{j<k∈S} Q_jk``. Tables that depend on Q alone are built once per plan
(:meth:`cbo.solvers.enumerate.plan.EnumerationPlan.tables`).

Interface of a bound (what the kernels call, and what a new bound must follow):

* ``relax_bound(rx, rw, F, row, c0, n, rho, target) -> float``: a lower bound on the *completion part*
  ``min_S Σ_{j∈S} F_j + Σ_{j<k∈S} Q_jk`` (``e`` not included). ``rx`` is its per-plan table tuple (from
  :func:`relaxation_tables`), ``rw`` per-thread scratch arrays. ``target`` is ``threshold + slack − e``:
  the bound may stop as soon as it proves a value above ``target`` (the node is pruned) or proves that it
  cannot get there; either way it returns a valid lower bound. The kernels prune when the returned
  value exceeds ``target``, and call it at nodes where ``rx[2][n − c0, rho]`` is set.
* ``suffix_bounds(F, row, e, T, s, rho, n, S, srow, hbuf)``: the per-row bound of the node *and* of every
  suffix ``{j ≥ c}``, ``c ∈ [s, n − rho]``, written (with ``e`` included) to ``S[srow, c]``, so that the
  child loop stops at the first later child whose suffix bound exceeds the threshold.

A bound must never exceed the true minimum: a node is pruned only when a bound exceeds the K-th best found
so far by more than the plan's rounding slack, so no true top-K state is ever cut. The tests compare
every bound with the minimum over all completions by itertools at random prefixes.

The two bounds here:

* Per-row bound: every completion has energy
  ``e + Σ_{j∈S} (f_j + ½ Σ_{k∈S, k≠j} Q_jk) ≥ e + (sum of the ρ smallest of f_j + T[s, ρ, j])`` with
  ``T[s, ρ, j] = ½·(sum of the ρ−1 smallest Q_jk over k ≥ s, k ≠ j)`` (:func:`bound_table`). Cheap
  (O(|R| log ρ)) but weak for large ρ.
* Convex relaxation: with C the off-diagonal part of Q and λ the smallest shift that makes ``C + λI``
  positive semidefinite on the plane Σy = 0 (:func:`relaxation_shift`, computed once), a completion's
  energy is the convex function ``½yᵀ(C + λI)y + Σ_j (f_j − λ/2) y_j`` at a 0/1 point; its minimum over
  the capped simplex {0 ≤ y ≤ 1, Σy = ρ} bounds every completion. Frank–Wolfe gives a valid dual bound
  at every iteration. This is what proves M ≈ n/5..n/2.

numba caches a compiled kernel keyed on its own file only; the package ``__init__`` drops the cached
kernels of every module here when any of them changes (see :mod:`cbo.solvers.enumerate.kernel_cache`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from cbo.solvers.enumerate.heap import larger_child, smaller_parent
from cbo.solvers.enumerate.threads import FASTMATH


@njit(cache=True, _nrt=False)
def suffix_bounds(F, row, e, T, s, rho, n, S, srow, hbuf):
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
            p = smaller_parent(hbuf, i, v)
            while p >= 0:
                hbuf[i] = hbuf[p]
                i, p = p, smaller_parent(hbuf, p, v)
            hbuf[i] = v
            size += 1
            total += v
        elif v < hbuf[0]:
            total += v - hbuf[0]
            i = 0
            ch = larger_child(hbuf, 0, rho, v)
            while ch >= 0:
                hbuf[i] = hbuf[ch]
                i, ch = ch, larger_child(hbuf, ch, rho, v)
            hbuf[i] = v
        if size == rho:
            S[srow, j] = e + total


@njit(cache=True)
def bound_table(Q, rmax):
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


@njit(cache=True, _nrt=False)
def _smallest(v, m, rho, sel, hv):
    """Indices of the rho smallest of v[0:m] into sel[0:rho] (unordered; a max-heap on hv)."""
    size = 0
    for i in range(m):
        x = v[i]
        if size < rho:
            k = size
            p = smaller_parent(hv, k, x)
            while p >= 0:
                hv[k], sel[k] = hv[p], sel[p]
                k, p = p, smaller_parent(hv, p, x)
            hv[k] = x
            sel[k] = i
            size += 1
        elif x < hv[0]:
            k = 0
            ch = larger_child(hv, 0, rho, x)
            while ch >= 0:
                hv[k], sel[k] = hv[ch], sel[ch]
                k, ch = ch, larger_child(hv, ch, rho, x)
            hv[k] = x
            sel[k] = i


@njit(cache=True, fastmath=FASTMATH, _nrt=False)
def relax_bound(rx, rw, F, row, c0, n, rho, target):
    """Lower bound on the energy of every completion below a node, from its convex relaxation.

    For the remaining blocks j ≥ c0 (fields F[row, j]) and ``rho`` of them still to remove, every
    completion y ∈ {0,1} with Σy = rho has energy ``½yᵀ(C + λI)y + Σ_j (f_j − λ/2) y_j`` (y_j² = y_j),
    where C is the off-diagonal part of Q and λ makes C + λI positive semidefinite on Σy = 0 (see
    :func:`relaxation_shift`). Minimizing that convex function over the capped simplex
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


def relaxation_shift(Q: np.ndarray) -> float:
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


def relaxation_tables(Q: np.ndarray, r: int, shift: float | None, iters: int, min_states: float) -> tuple:
    """The convex relaxation's per-plan tuple ``rx``: (A = C + λI, λ/2 per block, which (remaining, to
    remove) nodes use it, iterations). With ``shift`` None the relaxation is off (no node uses it)."""
    n = Q.shape[0]
    big = np.zeros((n + 1, r + 1), dtype=np.uint8)
    if shift is None:
        return (np.zeros((1, 1)), np.zeros(1), big, np.int64(1))
    lam = float(shift)
    A = Q - np.diag(np.diag(Q)) + lam * np.eye(n)
    for m in range(n + 1):
        for rho in range(2, min(r, m - 1) + 1):
            big[m, rho] = math.comb(m, rho) >= min_states
    return (np.ascontiguousarray(A), np.full(n, 0.5 * lam), big, np.int64(iters))
