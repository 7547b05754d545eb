"""Numba kernels of the swap heuristics: annealing, tabu search and the neighbourhood closure.

A move removes one kept free block and keeps one removed free block, so every visited state has
exactly M blocks removed. Energy changes cost O(1) from maintained local fields ``h = Q_off y``; an
accepted move updates the fields in O(n). Caps and the parameter budget (``kind``, ``cap``, ``size``,
``pmin``, ``pmax`` of :class:`cbo.solvers.constraints.FreeConstraints`) reject moves that would break
them. Every kernel offers the states it visits to a pool of the best distinct states (``pool_E``
energies, ``pool_H`` Zobrist hashes, ``pool_X`` states, ``pool_done`` expanded by the closure).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


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
def state_energy(D, Qoff, y):
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
def state_hash(keys, y):
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
def pool_offer(pool_E, pool_H, pool_X, pool_done, e, hsh, y, a, b):
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
def _swap_deltas(D, Qoff, h, ins, outs, m, r, delta):
    """Fill ``delta[ti, tj]``: the energy change of the swap that keeps ``outs[ti]`` and removes ``ins[tj]``
    (``m`` blocks kept, ``r`` removed; ``h`` the fields of the current state)."""
    for ti in range(m):
        a = outs[ti]
        fa = D[a] + h[a]
        for tj in range(r):
            b = ins[tj]
            delta[ti, tj] = fa - D[b] - h[b] - Qoff[a, b]


@njit(cache=True)
def _descend(D, Qoff, y, h, e, hsh, keys, ins, outs, where, cnt, kind, cap, size, p, pmin, pmax, r, pool):
    """Steepest descent over swaps to a local minimum, offering each visited state to the pool."""
    pool_E, pool_H, pool_X, pool_done = pool
    m = y.shape[0] - r
    delta = np.empty((max(m, 1), max(r, 1)))
    while True:
        _swap_deltas(D, Qoff, h, ins, outs, m, r, delta)
        best = 0.0
        ba = -1
        bb = -1
        for ti in range(m):
            for tj in range(r):
                d = delta[ti, tj]
                if d < best and _move_ok(outs[ti], ins[tj], kind, cnt, cap, size, p, pmin, pmax):
                    best = d
                    ba = outs[ti]
                    bb = ins[tj]
        if ba < 0:
            return e, hsh, p
        _apply(ba, bb, y, h, Qoff, ins, outs, where, cnt, kind)
        e += best
        hsh ^= keys[ba] ^ keys[bb]
        p += size[ba] - size[bb]
        pool_offer(pool_E, pool_H, pool_X, pool_done, e, hsh, y, -1, -1)


@njit(cache=True)
def anneal(
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
            E[t] = state_energy(D, Qoff, y)
            HS[t] = state_hash(keys, y)
            ins, outs, where, cnt, p = _setup(y, kind, cap.shape[0], size)
            INS[t] = ins
            OUTS[t] = outs
            WHERE[t] = where
            CNT[t] = cnt
            P[t] = p
            pool_offer(pool_E, pool_H, pool_X, pool_done, E[t], HS[t], Y[t], -1, -1)
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
                            pool_offer(pool_E, pool_H, pool_X, pool_done, E[t], HS[t], y, -1, -1)
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
def tabu_search(
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
    delta = np.empty((max(n - r, 1), max(r, 1)))
    for rs in range(first, first + count):
        np.random.seed((seed * 1000003 + rs * 7919) % 2147483647)
        y, ok = _random_state(n, r, kind, cap, size, pmin, pmax)
        if not ok:
            stats[3] += 1
            continue
        h = _fields(Qoff, y)
        e = state_energy(D, Qoff, y)
        hsh = state_hash(keys, y)
        ins, outs, where, cnt, p = _setup(y, kind, cap.shape[0], size)
        pool_offer(pool_E, pool_H, pool_X, pool_done, e, hsh, y, -1, -1)
        best_e = e
        until = np.zeros(n, dtype=np.int64)
        if r > 0 and r < n:
            for it in range(1, iters + 1):
                thr = pool_E[_worst(pool_E)]
                _swap_deltas(D, Qoff, h, ins, outs, n - r, r, delta)
                bd = np.inf
                ba = -1
                bb = -1
                for ti in range(n - r):
                    a = outs[ti]
                    for tj in range(r):
                        b = ins[tj]
                        d = delta[ti, tj]
                        stats[1] += 1
                        if not _move_ok(a, b, kind, cnt, cap, size, p, pmin, pmax):
                            continue
                        en = e + d
                        if en < thr:
                            if pool_offer(pool_E, pool_H, pool_X, pool_done, en, hsh ^ keys[a] ^ keys[b], y, a, b):
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
def closure(D, Qoff, kind, cap, size, pmin, pmax, r, keys, pool_E, pool_H, pool_X, pool_done, max_expand, depth):
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
    delta = np.zeros((max(m, 1), max(r, 1)))
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
        _swap_deltas(D, Qoff, h, ins, outs, m, r, delta)
        for ti in range(m):
            a = outs[ti]
            for tj in range(r):
                b = ins[tj]
                en = e + delta[ti, tj]
                if en < thr and _move_ok(a, b, kind, cnt, cap, size, p, pmin, pmax):
                    if pool_offer(pool_E, pool_H, pool_X, pool_done, en, hsh ^ keys[a] ^ keys[b], y, a, b):
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
                    base = e + delta[t1, u1] + qa - Qoff[a2, b1]
                    for u2 in range(u1 + 1, r):
                        b2 = ins[u2]
                        en = base + delta[t2, u2] + Qoff[b1, b2] - Qoff[a1, b2]
                        if en < thr and _move2_ok(a1, a2, b1, b2, kind, cnt, cap, size, p, pmin, pmax):
                            for i in range(n):
                                y2[i] = y[i]
                            y2[a1] = 1
                            y2[a2] = 1
                            y2[b1] = 0
                            y2[b2] = 0
                            h2 = hsh ^ keys[a1] ^ keys[a2] ^ keys[b1] ^ keys[b2]
                            if pool_offer(pool_E, pool_H, pool_X, pool_done, en, h2, y2, -1, -1):
                                thr = pool_E[_worst(pool_E)]
    return done
