"""Constraint-native annealing and tabu search: swap moves that never leave Σx = M.

A move removes one kept free block and keeps one removed free block, so every visited state has
exactly M blocks removed and no penalty λ is needed. Energy changes cost O(1) from maintained
local fields ``h = Q_off y``; an accepted move updates the fields in O(n). Keep/force are honoured
by working on the reduced problem (``Problem.Q`` over the free blocks), and per-kind caps and the
parameter budget by rejecting moves that would break them.

Both solvers keep a pool of the best distinct states seen (Zobrist-hashed) and finish with a
*closure* pass: every pooled state's whole single- and double-swap neighbourhood is scanned (each
in O(1) per neighbour from the fields) and any neighbour good enough for the pool is added, until
the pool no longer changes. Low-lying excited states of these energies are mostly one or two swaps
apart, so the closure turns a found ground state into a complete low-energy list. Runs are seeded per restart, so a given seed gives the same states whatever the
time limit cuts (unless it cuts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numba import njit

from cbo.errors import SolverError
from cbo.solvers.base import Problem, Solver, SolverOutput, register

_BIG = np.int64(2**62)


# ----------------------------------------------------------------------------- side constraints
@dataclass
class FreeConstraints:
    """Per-kind caps and the parameter budget restated over the free blocks of a :class:`Problem`.

    ``kind[i]`` is the cap group of free block i (blocks of uncapped kinds share a group with an
    unreachable cap), ``cap[k]`` how many more of group k may be removed once the forced blocks
    are counted, ``size[i]`` the parameter count, and ``[pmin, pmax]`` the range the free blocks'
    removed parameters must fall in.
    """

    kind: np.ndarray
    cap: np.ndarray
    size: np.ndarray
    pmin: int
    pmax: int

    @classmethod
    def from_problem(cls, problem: Problem) -> FreeConstraints:
        q = problem.qubo
        c = q.constraints
        groups = sorted(c.caps)
        gid = {k: i for i, k in enumerate(groups)}
        kind = np.array([gid.get(q.kinds[i], len(groups)) for i in problem.free], dtype=np.int64)
        cap = np.full(len(groups) + 1, _BIG, dtype=np.int64)
        for kname, g in gid.items():
            forced = sum(1 for i in c.force if q.kinds[i] == kname)
            cap[g] = int(c.caps[kname]) - forced
        size = q.sizes[problem.free].astype(np.int64)
        forced_params = int(q.sizes[problem.forced].sum()) if len(problem.forced) else 0
        pmin = -_BIG if c.min_removed_params is None else int(c.min_removed_params) - forced_params
        pmax = _BIG if c.max_removed_params is None else int(c.max_removed_params) - forced_params
        return cls(kind, cap, size, int(pmin), int(pmax))

    @property
    def active(self) -> bool:
        return bool((self.cap < _BIG).any()) or self.pmin > -_BIG or self.pmax < _BIG

    def ok(self, Y: np.ndarray) -> np.ndarray:
        """Which rows of (B, n_free) sub-states satisfy the caps and the budget."""
        Y = np.atleast_2d(np.asarray(Y, dtype=np.int64))
        good = np.ones(Y.shape[0], dtype=bool)
        for g in range(len(self.cap)):
            if self.cap[g] < _BIG:
                good &= Y[:, self.kind == g].sum(1) <= self.cap[g]
        p = Y @ self.size
        return good & (p >= self.pmin) & (p <= self.pmax)


# ----------------------------------------------------------------------------- numba core
@njit(cache=True)
def _fields(Qoff, y):
    n = y.shape[0]
    h = np.zeros(n)
    for j in range(n):
        if y[j]:
            for i in range(n):
                h[i] += Qoff[i, j]
    return h


@njit(cache=True)
def _energy(D, Qoff, y):
    n = y.shape[0]
    e = 0.0
    for i in range(n):
        if y[i]:
            e += D[i]
            for j in range(i + 1, n):
                if y[j]:
                    e += Qoff[i, j]
    return e


@njit(cache=True)
def _hash(keys, y):
    h = np.uint64(0)
    for i in range(y.shape[0]):
        if y[i]:
            h ^= keys[i]
    return h


@njit(cache=True)
def _worst(pool_E):
    w = 0
    for s in range(1, pool_E.shape[0]):
        if pool_E[s] > pool_E[w]:
            w = s
    return w


@njit(cache=True)
def _pool_find(pool_E, pool_H, pool_X, hsh, y, a, b):
    """Slot holding state y (with a added and b dropped when a >= 0), or -1."""
    n = y.shape[0]
    for s in range(pool_E.shape[0]):
        if pool_H[s] == hsh and pool_E[s] < np.inf:
            same = True
            for i in range(n):
                v = y[i]
                if i == a:
                    v = 1
                elif i == b:
                    v = 0
                if pool_X[s, i] != v:
                    same = False
                    break
            if same:
                return s
    return -1


@njit(cache=True)
def _pool_offer(pool_E, pool_H, pool_X, pool_done, e, hsh, y, a, b):
    """Insert state y (+a −b when a >= 0) with energy e if it beats the pool's worst and is new."""
    w = _worst(pool_E)
    if not e < pool_E[w]:
        return False
    if _pool_find(pool_E, pool_H, pool_X, hsh, y, a, b) >= 0:
        return False
    for i in range(y.shape[0]):
        pool_X[w, i] = y[i]
    if a >= 0:
        pool_X[w, a] = 1
        pool_X[w, b] = 0
    pool_E[w] = e
    pool_H[w] = hsh
    pool_done[w] = False
    return True


@njit(cache=True)
def _move_ok(a, b, kind, cnt, cap, size, p, pmin, pmax):
    if kind[a] != kind[b] and cnt[kind[a]] >= cap[kind[a]]:
        return False
    q = p + size[a] - size[b]
    return q >= pmin and q <= pmax


@njit(cache=True)
def _random_state(n, r, kind, cap, size, pmin, pmax):
    """A random state with r ones that respects the caps, then repaired towards the budget.

    Returns (y, ok); ok is False when no swap sequence found brings the parameters into range.
    """
    y = np.zeros(n, dtype=np.uint8)
    cnt = np.zeros(cap.shape[0], dtype=np.int64)
    perm = np.random.permutation(n)
    taken = 0
    for t in range(n):
        i = perm[t]
        if taken == r:
            break
        if cnt[kind[i]] < cap[kind[i]]:
            y[i] = 1
            cnt[kind[i]] += 1
            taken += 1
    if taken < r:
        return y, False
    p = 0
    for i in range(n):
        if y[i]:
            p += size[i]
    for _ in range(n * n):
        dist = max(0, p - pmax, pmin - p)
        if dist == 0:
            return y, True
        best_d = dist
        ba = -1
        bb = -1
        for a in range(n):
            if y[a]:
                continue
            for b in range(n):
                if not y[b]:
                    continue
                if kind[a] != kind[b] and cnt[kind[a]] >= cap[kind[a]]:
                    continue
                q = p + size[a] - size[b]
                d = max(0, q - pmax, pmin - q)
                if d < best_d:
                    best_d = d
                    ba = a
                    bb = b
        if ba < 0:
            return y, False
        y[ba] = 1
        y[bb] = 0
        cnt[kind[ba]] += 1
        cnt[kind[bb]] -= 1
        p += size[ba] - size[bb]
    return y, max(0, p - pmax, pmin - p) == 0


@njit(cache=True)
def _setup(y, kind, ncap, size):
    n = y.shape[0]
    ins = np.empty(n, dtype=np.int64)
    outs = np.empty(n, dtype=np.int64)
    where = np.empty(n, dtype=np.int64)
    ni = 0
    no = 0
    cnt = np.zeros(ncap, dtype=np.int64)
    p = 0
    for i in range(n):
        if y[i]:
            ins[ni] = i
            where[i] = ni
            ni += 1
            cnt[kind[i]] += 1
            p += size[i]
        else:
            outs[no] = i
            where[i] = no
            no += 1
    return ins, outs, where, cnt, p


@njit(cache=True)
def _apply(a, b, y, h, Qoff, ins, outs, where, cnt, kind):
    """Swap: a (out) enters, b (in) leaves; update fields and index lists."""
    n = y.shape[0]
    for i in range(n):
        h[i] += Qoff[i, a] - Qoff[i, b]
    y[a] = 1
    y[b] = 0
    ia = where[a]
    ib = where[b]
    outs[ia] = b
    where[b] = ia
    ins[ib] = a
    where[a] = ib
    cnt[kind[a]] += 1
    cnt[kind[b]] -= 1


@njit(cache=True)
def _descend(D, Qoff, y, h, e, hsh, keys, ins, outs, where, cnt, kind, cap, size, p, pmin, pmax, r, pool):
    """Steepest descent over swaps to a local minimum, offering each visited state to the pool."""
    pool_E, pool_H, pool_X, pool_done = pool
    n = y.shape[0]
    while True:
        best = 0.0
        ba = -1
        bb = -1
        for ti in range(n - r):
            a = outs[ti]
            fa = D[a] + h[a]
            for tj in range(r):
                b = ins[tj]
                d = fa - D[b] - h[b] - Qoff[a, b]
                if d < best and _move_ok(a, b, kind, cnt, cap, size, p, pmin, pmax):
                    best = d
                    ba = a
                    bb = b
        if ba < 0:
            return e, hsh, p
        _apply(ba, bb, y, h, Qoff, ins, outs, where, cnt, kind)
        e += best
        hsh ^= keys[ba] ^ keys[bb]
        p += size[ba] - size[bb]
        _pool_offer(pool_E, pool_H, pool_X, pool_done, e, hsh, y, -1, -1)


@njit(cache=True)
def _anneal(
    D, Qoff, kind, cap, size, pmin, pmax, r, keys, seed, first, count, sweeps, t0, t1, replicas, pool_E, pool_H,
    pool_X, pool_done, stats,
):  # fmt: skip
    """Restarts first..first+count-1 of simulated annealing (replicas > 1: parallel tempering).

    Each restart is seeded by (seed, restart index) so results do not depend on batching.
    stats: [restarts, proposals, accepted, infeasible starts].
    """
    n = D.shape[0]
    pool = (pool_E, pool_H, pool_X, pool_done)
    R = max(1, replicas)
    ratio = (t1 / t0) ** (1.0 / max(1, R - 1))
    temps = np.empty(R)
    for t in range(R):
        temps[t] = t1 / ratio**t if R > 1 else t0
    alpha = (t1 / t0) ** (1.0 / max(1, sweeps - 1))
    moves = max(n, 1)
    for rs in range(first, first + count):
        np.random.seed((seed * 1000003 + rs * 7919) % 2147483647)
        Y = np.zeros((R, n), dtype=np.uint8)
        Hs = np.zeros((R, n))
        E = np.zeros(R)
        HS = np.zeros(R, dtype=np.uint64)
        P = np.zeros(R, dtype=np.int64)
        INS = np.zeros((R, n), dtype=np.int64)
        OUTS = np.zeros((R, n), dtype=np.int64)
        WHERE = np.zeros((R, n), dtype=np.int64)
        CNT = np.zeros((R, cap.shape[0]), dtype=np.int64)
        bad = False
        for t in range(R):
            y, ok = _random_state(n, r, kind, cap, size, pmin, pmax)
            if not ok:
                bad = True
                break
            Y[t] = y
            Hs[t] = _fields(Qoff, y)
            E[t] = _energy(D, Qoff, y)
            HS[t] = _hash(keys, y)
            ins, outs, where, cnt, p = _setup(y, kind, cap.shape[0], size)
            INS[t] = ins
            OUTS[t] = outs
            WHERE[t] = where
            CNT[t] = cnt
            P[t] = p
            _pool_offer(pool_E, pool_H, pool_X, pool_done, E[t], HS[t], Y[t], -1, -1)
        if bad:
            stats[3] += 1
            continue
        # replica t runs at temperature temps[order[t]]; exchanges swap entries of order
        order = np.arange(R)
        T = t0
        if r > 0 and r < n:
            for _sweep in range(sweeps):
                for t in range(R):
                    temp = temps[order[t]] if R > 1 else T
                    y = Y[t]
                    h = Hs[t]
                    ins = INS[t]
                    outs = OUTS[t]
                    where = WHERE[t]
                    cnt = CNT[t]
                    for _ in range(moves):
                        a = outs[np.random.randint(n - r)]
                        b = ins[np.random.randint(r)]
                        stats[1] += 1
                        if not _move_ok(a, b, kind, cnt, cap, size, P[t], pmin, pmax):
                            continue
                        d = D[a] + h[a] - D[b] - h[b] - Qoff[a, b]
                        if d > 0.0 and np.random.random() >= math.exp(-d / temp):
                            continue
                        _apply(a, b, y, h, Qoff, ins, outs, where, cnt, kind)
                        stats[2] += 1
                        E[t] += d
                        HS[t] ^= keys[a] ^ keys[b]
                        P[t] += size[a] - size[b]
                        if E[t] < pool_E[_worst(pool_E)]:
                            _pool_offer(pool_E, pool_H, pool_X, pool_done, E[t], HS[t], y, -1, -1)
                if R > 1:
                    # replica exchange between neighbouring temperatures
                    pos = np.empty(R, dtype=np.int64)
                    for t in range(R):
                        pos[order[t]] = t
                    for k in range(R - 1):
                        u = pos[k]
                        v = pos[k + 1]
                        x = (1.0 / temps[k] - 1.0 / temps[k + 1]) * (E[u] - E[v])
                        if x >= 0.0 or np.random.random() < math.exp(x):
                            order[u] = k + 1
                            order[v] = k
                            pos[k] = v
                            pos[k + 1] = u
                else:
                    T *= alpha
        for t in range(R):
            E[t], HS[t], P[t] = _descend(
                D, Qoff, Y[t], Hs[t], E[t], HS[t], keys, INS[t], OUTS[t], WHERE[t], CNT[t], kind, cap, size, P[t],
                pmin, pmax, r, pool,
            )  # fmt: skip
        stats[0] += 1


@njit(cache=True)
def _tabu(
    D, Qoff, kind, cap, size, pmin, pmax, r, keys, seed, first, count, iters, tenure, pool_E, pool_H, pool_X,
    pool_done, stats,
):  # fmt: skip
    """Restarts first..first+count-1 of tabu search over the swap neighbourhood.

    Every iteration scans all feasible swaps, offers good neighbours to the pool, and takes the best
    non-tabu one (a tabu move is allowed when it beats the best energy of the restart). A block that
    just left may not re-enter, and one that just entered may not leave, for ``tenure`` (+ a random
    0..2) iterations. stats: [restarts, evaluated swaps, moves, infeasible starts].
    """
    n = D.shape[0]
    for rs in range(first, first + count):
        np.random.seed((seed * 1000003 + rs * 7919) % 2147483647)
        y, ok = _random_state(n, r, kind, cap, size, pmin, pmax)
        if not ok:
            stats[3] += 1
            continue
        h = _fields(Qoff, y)
        e = _energy(D, Qoff, y)
        hsh = _hash(keys, y)
        ins, outs, where, cnt, p = _setup(y, kind, cap.shape[0], size)
        _pool_offer(pool_E, pool_H, pool_X, pool_done, e, hsh, y, -1, -1)
        best_e = e
        until = np.zeros(n, dtype=np.int64)
        if r > 0 and r < n:
            for it in range(1, iters + 1):
                thr = pool_E[_worst(pool_E)]
                bd = np.inf
                ba = -1
                bb = -1
                for ti in range(n - r):
                    a = outs[ti]
                    fa = D[a] + h[a]
                    for tj in range(r):
                        b = ins[tj]
                        d = fa - D[b] - h[b] - Qoff[a, b]
                        stats[1] += 1
                        if not _move_ok(a, b, kind, cnt, cap, size, p, pmin, pmax):
                            continue
                        en = e + d
                        if en < thr:
                            if _pool_offer(pool_E, pool_H, pool_X, pool_done, en, hsh ^ keys[a] ^ keys[b], y, a, b):
                                thr = pool_E[_worst(pool_E)]
                        tabu = until[a] >= it or until[b] >= it
                        if tabu and not en < best_e:
                            continue
                        # random tie-breaking keeps restarts from retracing each other exactly
                        if d < bd or (d == bd and np.random.random() < 0.5):
                            bd = d
                            ba = a
                            bb = b
                if ba < 0:
                    break
                _apply(ba, bb, y, h, Qoff, ins, outs, where, cnt, kind)
                stats[2] += 1
                e += bd
                hsh ^= keys[ba] ^ keys[bb]
                p += size[ba] - size[bb]
                until[ba] = it + tenure + np.random.randint(3)
                until[bb] = it + tenure + np.random.randint(3)
                if e < best_e:
                    best_e = e
        stats[0] += 1


@njit(cache=True)
def _move2_ok(a1, a2, b1, b2, kind, cnt, cap, size, p, pmin, pmax):
    """Whether adding a1, a2 and dropping b1, b2 keeps the caps and the parameter budget."""
    cnt[kind[b1]] -= 1
    cnt[kind[b2]] -= 1
    ok = True
    cnt[kind[a1]] += 1
    if cnt[kind[a1]] > cap[kind[a1]]:
        ok = False
    cnt[kind[a2]] += 1
    if cnt[kind[a2]] > cap[kind[a2]]:
        ok = False
    cnt[kind[a1]] -= 1
    cnt[kind[a2]] -= 1
    cnt[kind[b1]] += 1
    cnt[kind[b2]] += 1
    q = p + size[a1] + size[a2] - size[b1] - size[b2]
    return ok and q >= pmin and q <= pmax


@njit(cache=True)
def _closure(D, Qoff, kind, cap, size, pmin, pmax, r, keys, pool_E, pool_H, pool_X, pool_done, max_expand, depth):
    """Scan the neighbourhood of every pooled state (best first) until the pool is stable.

    depth 1: all single swaps; depth 2: also all double swaps (two blocks in, two out), which
    reaches low states separated from the pool by a higher one. Returns the number of states
    expanded; stops early after ``max_expand`` expansions.
    """
    n = D.shape[0]
    P = pool_E.shape[0]
    m = n - r
    done = 0
    y = np.zeros(n, dtype=np.uint8)
    y2 = np.zeros(n, dtype=np.uint8)
    d = np.zeros((max(m, 1), max(r, 1)))
    while done < max_expand:
        s = -1
        for t in range(P):
            if not pool_done[t] and pool_E[t] < np.inf and (s < 0 or pool_E[t] < pool_E[s]):
                s = t
        if s < 0:
            break
        pool_done[s] = True
        done += 1
        for i in range(n):
            y[i] = pool_X[s, i]
        e = pool_E[s]
        hsh = pool_H[s]
        h = _fields(Qoff, y)
        ins, outs, where, cnt, p = _setup(y, kind, cap.shape[0], size)
        thr = pool_E[_worst(pool_E)]
        for ti in range(m):
            a = outs[ti]
            fa = D[a] + h[a]
            for tj in range(r):
                b = ins[tj]
                d[ti, tj] = fa - D[b] - h[b] - Qoff[a, b]
                en = e + d[ti, tj]
                if en < thr and _move_ok(a, b, kind, cnt, cap, size, p, pmin, pmax):
                    if _pool_offer(pool_E, pool_H, pool_X, pool_done, en, hsh ^ keys[a] ^ keys[b], y, a, b):
                        thr = pool_E[_worst(pool_E)]
        if depth < 2:
            continue
        # double swaps: y + a1 + a2 - b1 - b2 (one evaluation per unordered pair of each)
        for t1 in range(m):
            a1 = outs[t1]
            for t2 in range(t1 + 1, m):
                a2 = outs[t2]
                qa = Qoff[a1, a2]
                for u1 in range(r):
                    b1 = ins[u1]
                    base = e + d[t1, u1] + qa - Qoff[a2, b1]
                    for u2 in range(u1 + 1, r):
                        b2 = ins[u2]
                        en = base + d[t2, u2] + Qoff[b1, b2] - Qoff[a1, b2]
                        if en < thr and _move2_ok(a1, a2, b1, b2, kind, cnt, cap, size, p, pmin, pmax):
                            for i in range(n):
                                y2[i] = y[i]
                            y2[a1] = 1
                            y2[a2] = 1
                            y2[b1] = 0
                            y2[b2] = 0
                            h2 = hsh ^ keys[a1] ^ keys[a2] ^ keys[b1] ^ keys[b2]
                            if _pool_offer(pool_E, pool_H, pool_X, pool_done, en, h2, y2, -1, -1):
                                thr = pool_E[_worst(pool_E)]
    return done


# ----------------------------------------------------------------------------- python driver
class _Run:
    """Arrays of one swap-solver run (reduced problem, pool, stats)."""

    def __init__(self, problem: Problem, pool: int, seed: int) -> None:
        Q = np.ascontiguousarray(problem.Q, dtype=np.float64)
        self.D = np.ascontiguousarray(np.diag(Q).copy())
        self.Qoff = Q.copy()
        np.fill_diagonal(self.Qoff, 0.0)
        self.fc = FreeConstraints.from_problem(problem)
        self.r = int(problem.r)
        n = len(self.D)
        keys = np.random.default_rng([seed, 0x5A1]).integers(1, 2**63 - 1, size=n, dtype=np.int64)
        self.keys = keys.view(np.uint64)
        self.pool_E = np.full(pool, np.inf)
        self.pool_H = np.zeros(pool, dtype=np.uint64)
        self.pool_X = np.zeros((pool, n), dtype=np.uint8)
        self.pool_done = np.ones(pool, dtype=np.bool_)
        self.stats = np.zeros(4, dtype=np.int64)

    @property
    def constraint_args(self) -> tuple:
        fc = self.fc
        return (self.D, self.Qoff, fc.kind, fc.cap, fc.size, np.int64(fc.pmin), np.int64(fc.pmax), self.r, self.keys)

    @property
    def pool_args(self) -> tuple:
        return (self.pool_E, self.pool_H, self.pool_X, self.pool_done)

    def signature(self, k: int) -> tuple:
        """The current top-k (energies rounded, hashes) to detect when restarts stop helping."""
        order = np.argsort(self.pool_E, kind="stable")[:k]
        return tuple(int(h) for h in self.pool_H[order])

    def close(self, max_expand: int, depth: int) -> int:
        return int(_closure(*self.constraint_args, *self.pool_args, max_expand, depth))

    def candidates(self, problem: Problem) -> np.ndarray:
        filled = self.pool_E < np.inf
        return problem.expand(self.pool_X[filled])


def default_temperatures(problem: Problem, seed: int) -> tuple[float, float]:
    """(t_hot, t_cold) from the spread of swap energy changes at random states.

    Hot: the median |ΔE| of a random swap is accepted with probability 1/2. Cold: a change of 1%
    of that median is still accepted with probability ~1/e, so the end of the schedule is a
    near-greedy descent that still crosses the smallest gaps between low-lying states.
    """
    Q = problem.Q
    n, r = Q.shape[0], problem.r
    if r == 0 or r == n:
        return 1.0, 1e-3
    rng = np.random.default_rng([seed, 0x7E])
    D = np.diag(Q)
    Qoff = Q - np.diag(D)
    deltas = []
    for _ in range(16):
        y = np.zeros(n)
        y[rng.choice(n, r, replace=False)] = 1
        h = Qoff @ y
        ins, outs = np.flatnonzero(y), np.flatnonzero(y == 0)
        a = rng.choice(outs, 64)
        b = rng.choice(ins, 64)
        deltas.append(np.abs(D[a] + h[a] - D[b] - h[b] - Qoff[a, b]))
    med = float(np.median(np.concatenate(deltas)))
    if not med > 0:
        med = float(np.abs(Q).max()) or 1.0
    return med / math.log(2.0), 0.01 * med


def _check_size(problem: Problem) -> None:
    if problem.n_free > 0 and problem.r > problem.n_free:
        raise SolverError(f"cannot remove {problem.r} of {problem.n_free} free blocks.")


def _drive(problem: Problem, run: _Run, step, restarts: int, patience: int, batch: int) -> dict[str, Any]:
    """Run restarts in batches until ``restarts`` are done, ``patience`` restarts in a row leave the
    top-k unchanged, or the time limit passes. Returns facts for the result's info."""
    done = 0
    stale = 0
    timed_out = False
    interrupted = False
    sig = run.signature(problem.k)
    try:
        while done < restarts:
            count = min(batch, restarts - done)
            step(done, count)
            done += count
            new = run.signature(problem.k)
            stale = stale + count if new == sig else 0
            sig = new
            if patience and stale >= patience:
                break
            if problem.time_left() <= 0:
                timed_out = done < restarts
                break
    except KeyboardInterrupt:
        interrupted = True
    if run.stats[3] and not np.isfinite(run.pool_E).any():
        raise SolverError(
            "no starting state satisfies the caps and parameter budget for "
            f"M={problem.remove}; loosen max_removed_params/min_removed_params or the caps."
        )
    return {"restarts": done, "timed_out": timed_out, "interrupted": interrupted}


@register
class SwapAnnealer(Solver):
    """Simulated annealing over swap moves (optionally parallel tempering), with restarts."""

    name = "swap-sa"
    aliases = ("swap", "swap-anneal")
    exact = False
    description = "constraint-native simulated annealing (swap moves keep Σx = M; numba)"
    battery_options: ClassVar[dict] = {}
    battery_max_n: ClassVar[int] = 16

    @dataclass
    class Options:
        """Settings of the swap annealer.

        Attributes:
            sweeps: sweeps per restart (a sweep proposes n_free swaps).
            restarts: maximum number of restarts.
            patience: stop once this many restarts in a row leave the top-k unchanged (0: never).
            replicas: 1 for annealing; >1 for parallel tempering over that many temperatures.
            t_hot / t_cold: temperature range; None derives it from random swap energy changes.
            pool: size of the kept best-state pool (default max(2k, k + 20)).
            closure: 2 (default) scans the single- and double-swap neighbourhood of every kept
                state until the pool is stable; 1 single swaps only; 0 off.
        """

        sweeps: int = 300
        restarts: int = 200
        patience: int = 24
        replicas: int = 1
        t_hot: float | None = None
        t_cold: float | None = None
        pool: int | None = None
        closure: int = 2

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        _check_options(options, ("sweeps", "restarts", "replicas"))
        _check_size(problem)
        t_hot, t_cold = default_temperatures(problem, problem.seed)
        t_hot = float(options.t_hot) if options.t_hot is not None else t_hot
        t_cold = float(options.t_cold) if options.t_cold is not None else t_cold
        if not (t_hot > 0 and t_cold > 0):
            raise SolverError(f"temperatures must be > 0, got t_hot={t_hot!r}, t_cold={t_cold!r}.")
        run = _Run(problem, _pool_size(options.pool, problem.k), problem.seed)

        def step(first: int, count: int) -> None:
            _anneal(
                *run.constraint_args, problem.seed, first, count, int(options.sweeps), t_hot, t_cold,
                int(options.replicas), *run.pool_args, run.stats,
            )  # fmt: skip

        info = _drive(problem, run, step, int(options.restarts), int(options.patience), batch=4)
        expanded = run.close(10**9 if options.closure else 0, _closure_depth(options.closure))
        info.update(
            {
                "t_hot": t_hot,
                "t_cold": t_cold,
                "proposals": int(run.stats[1]),
                "accepted": int(run.stats[2]),
                "closure_expanded": expanded,
                "feasible_fraction": 1.0,
            }
        )
        return SolverOutput(run.candidates(problem), exact=False, info=info)


@register
class SwapTabu(Solver):
    """Tabu search over the swap neighbourhood, with restarts."""

    name = "swap-tabu"
    aliases = ()
    exact = False
    description = "constraint-native tabu search over swap moves (keeps Σx = M; numba)"
    battery_options: ClassVar[dict] = {}
    battery_max_n: ClassVar[int] = 16

    @dataclass
    class Options:
        """Settings of the swap tabu search.

        Attributes:
            iterations: moves per restart.
            restarts: maximum number of restarts.
            patience: stop once this many restarts in a row leave the top-k unchanged (0: never).
            tenure: iterations a moved block stays tabu (default max(2, min(M, n−M) // 4)).
            pool: size of the kept best-state pool (default max(2k, k + 20)).
            closure: 2 (default) scans the single- and double-swap neighbourhood of every kept
                state until the pool is stable; 1 single swaps only; 0 off.
        """

        iterations: int = 400
        restarts: int = 100
        patience: int = 16
        tenure: int | None = None
        pool: int | None = None
        closure: int = 2

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        _check_options(options, ("iterations", "restarts"))
        _check_size(problem)
        n, r = problem.n_free, problem.r
        tenure = options.tenure if options.tenure is not None else max(2, min(r, n - r) // 4)
        if tenure < 0:
            raise SolverError(f"tenure must be >= 0, got {tenure!r}.")
        run = _Run(problem, _pool_size(options.pool, problem.k), problem.seed)

        def step(first: int, count: int) -> None:
            _tabu(
                *run.constraint_args, problem.seed, first, count, int(options.iterations), int(tenure),
                *run.pool_args, run.stats,
            )  # fmt: skip

        info = _drive(problem, run, step, int(options.restarts), int(options.patience), batch=4)
        expanded = run.close(10**9 if options.closure else 0, _closure_depth(options.closure))
        info.update(
            {
                "tenure": int(tenure),
                "evaluated": int(run.stats[1]),
                "moves": int(run.stats[2]),
                "closure_expanded": expanded,
                "feasible_fraction": 1.0,
            }
        )
        return SolverOutput(run.candidates(problem), exact=False, info=info)


def _closure_depth(closure: Any) -> int:
    if isinstance(closure, bool):
        return 2 if closure else 0
    if not isinstance(closure, (int, np.integer)) or closure not in (0, 1, 2):
        raise SolverError(f"closure must be 0, 1 or 2, got {closure!r}.")
    return int(closure)


def _pool_size(pool: int | None, k: int) -> int:
    if pool is None:
        return max(2 * k, k + 20)
    if isinstance(pool, bool) or not isinstance(pool, (int, np.integer)) or pool < k:
        raise SolverError(f"pool must be an integer >= k={k}, got {pool!r}.")
    return int(pool)


def _check_options(options: Any, positive: tuple[str, ...]) -> None:
    for name in positive:
        v = getattr(options, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise SolverError(f"option {name!r} must be an integer >= 1, got {v!r}.")
    patience = getattr(options, "patience", 0)
    if isinstance(patience, bool) or not isinstance(patience, (int, np.integer)) or patience < 0:
        raise SolverError(f"option 'patience' must be an integer >= 0, got {patience!r}.")
