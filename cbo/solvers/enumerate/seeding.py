"""Seeding the exact search: states known before it starts, and the pruning threshold they prove.

Any K distinct feasible states bound the true K-th best energy from above: the K-th smallest of their
energies. The search starts its pruning threshold there (plus the rounding slack) and merges the seed
states into its result, so a search stopped early still returns them. :class:`Seeds` carries both; seeds
come from the built-in greedy heuristic (:func:`greedy_seeds`: greedy construction from every first
block, swap descent, and the single-swap neighbours of the best local optimum) or from any given states
(:func:`seeds_from_positions`, e.g. the states of a heuristic solver), combined with :func:`merge_seeds`;
:func:`cbo.solvers.enumerate.plan.plan_enumeration` takes given states as ``seeds``.

Energies here are *reduced*: over the free blocks in search order, without the forced blocks' constant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit


@dataclass
class Seeds:
    """Seed states, best first, and the threshold they prove.

    Attributes:
        energies: (B,) reduced energies, ascending, at most K of them.
        positions: (B, r) removed positions in search order (sorted within a row).
        threshold: an upper bound on the K-th best reduced energy (inf when the seeds prove none).
    """

    energies: np.ndarray
    positions: np.ndarray
    threshold: float

    @classmethod
    def empty(cls, r: int) -> Seeds:
        return cls(np.zeros(0), np.zeros((0, r), dtype=np.int32), np.inf)


def greedy_seeds(Q: np.ndarray, r: int, K: int) -> Seeds:
    """The built-in seeds: the heuristic's best local optimum and its K − 1 best single-swap neighbours."""
    threshold, best = seed_threshold(Q, r, K)
    energies, positions = seed_states(Q, best, K)
    return Seeds(energies, positions, float(threshold))


def seeds_from_positions(Q: np.ndarray, positions: np.ndarray, K: int) -> Seeds:
    """Seeds from given states (removed positions in search order, each a feasible state).

    Their energies are computed here; the threshold is the K-th smallest energy among the distinct
    states (inf with fewer than K of them).
    """
    P = np.asarray(positions, dtype=np.int64)
    r = P.shape[1] if P.ndim == 2 else 0
    if P.size == 0:
        return Seeds.empty(r)
    S = np.unique(np.sort(P, axis=1), axis=0)
    d = np.diag(Q)
    energies = d[S].sum(1)
    for a in range(r):
        for b in range(a + 1, r):
            energies = energies + Q[S[:, a], S[:, b]]
    order = np.argsort(energies, kind="stable")[:K]
    threshold = float(energies[order[K - 1]]) if len(order) >= K else np.inf
    return Seeds(energies[order], S[order].astype(np.int32), threshold)


def merge_seeds(first: Seeds, second: Seeds, K: int) -> Seeds:
    """The K best distinct states of both (``first``'s energy kept for a state in both), and the smaller
    of the thresholds they prove (theirs, or the K-th of the merged states); both must be for this K."""
    r = first.positions.shape[1] if first.positions.ndim == 2 else second.positions.shape[1]
    E = np.concatenate([first.energies, second.energies])
    S = np.concatenate([first.positions.reshape(-1, r), second.positions.reshape(-1, r)]).astype(np.int32)
    if len(S):
        S, index = np.unique(np.sort(S, axis=1), axis=0, return_index=True)
        E = E[index]
    order = np.argsort(E, kind="stable")[:K]
    kth = float(E[order[K - 1]]) if len(order) >= K else np.inf
    return Seeds(E[order], S[order], min(first.threshold, second.threshold, kth))


@njit(cache=True)
def seed_threshold(Q, r, K):
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
    # neighbour energies of the best local optimum: each swap of a removed block i for a kept block j
    removed = np.flatnonzero(best)
    kept = np.flatnonzero(~best)
    for j in range(n):
        f[j] = Q[j, j]
    for i in removed:
        for j in range(n):
            if j != i:
                f[j] += Q[i, j]
    vals = np.empty(nb + 1)
    vals[0] = best_e
    m = 1
    for i in removed:
        for j in kept:
            vals[m] = best_e + f[j] - f[i] - Q[i, j]
            m += 1
    vals.sort()
    return vals[K - 1], best


def seed_states(Q: np.ndarray, best: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
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
