"""Exact top-K of a cardinality-constrained QUBO by depth-first branch and bound with the relaxation bound.

The search decides one block per level (removed or kept), in the order of a :class:`CholeskyFactor`, and
bounds every child in O(1) (plus an O(p) update of the partial row sums when it descends) with the shifted
least-squares relaxation of :mod:`cbo.solvers.relaxation`. Of the two children the one with the smaller bound
is searched first. A child is pruned when its bound exceeds the current K-th best (or the seeded threshold)
by more than the factor's rounding slack, so no state of the true top K is ever cut; leaves get their energy
recomputed exactly from Q. The search is resumable: the kernel runs for a node budget and returns with its
whole state in arrays, so the caller checks the time limit, shows progress and can stop (Ctrl-C) between
chunks without losing anything found.

The shift is the Shor shift of the root (:func:`~cbo.solvers.relaxation.shor_shift`) plus a uniform ``α``
times the energy scale. ``α`` is chosen by a race: each candidate searches for ``race_nodes`` nodes and the
one that closed the largest fraction of the tree wins (the fraction is Σ 2^−depth over closed subtrees, which
is also the progress shown). Every state a racer finds is kept and tightens the threshold of the real run.

Use from the enumerator (``cbo/solvers/enumerate/``), for problems without caps or a parameter budget: the plan
computes ``w = shor_shift(Problem.Q, r).w`` once, the processing order (:func:`processing_order`: expensive
blocks decided first — the opposite of the lexicographic kernel's ascending order, and it matters), races α,
and either calls :func:`search_top_k` (one thread) or, to use threads/processes/Ray, ``split(fac, depth,
threshold)`` into subtrees and runs one :class:`SubtreeSearch` per subtree with the smallest k-th best known so
far as its threshold (every subtree's k-th best is an upper bound on the global one), merging the states
found. Seed the threshold with the heuristic's top-k (``seed_states``) so that a time-limited run is never
worse than ``auto``. Energies here are over the free blocks; add ``Problem.const``.

Measured on this machine (2 shared cores, one thread; ``research/relaxation_figures.py``): the SmolLM2
sublayer Fisher QUBO (N = 60, rank 32) proves its top-10 at M = 8..30 in under a second; 80-block
Fisher-shaped instances (``cbo.instances.fisher_block_qubo``) with 2048 and 128 gradient samples prove
M = 32 and 40 in seconds to tens of seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from numba import njit

from cbo.errors import SolverError
from cbo.solvers.relaxation import CholeskyFactor, energy_scale, factor, processing_order, shor_shift

# Uniform extra shifts tried by the race, in units of the energy scale (median |2·Q_jj|). On full-rank Fisher
# matrices the smallest wins; on low-rank ones (32 samples) about 0.1-0.2.
RACE_ALPHAS = (1e-3, 1e-2, 0.05, 0.2, 0.5)
# Nodes per kernel call between time-limit / progress checks (about 0.1 s).
_CHUNK = 1_000_000


@njit(cache=True, inline="always")
def _node_bound(dn, sdn, thn, tan, rho, q, Na, Nh, Nah):
    b = 0.5 * dn - 0.5 * sdn
    if q > 0:
        u = rho + tan - 0.5 * Nah[q]
        b += 0.5 * thn - 0.125 * Nh[q] + 0.5 * u * u / Na[q]
    elif rho != 0:
        b = np.inf
    return b


@njit(cache=True)
def _push(heap_e, heap_s, nh, e, X, Qn):
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
    for k in range(Qn):
        heap_s[i, k] = X[k]
    return nh


@njit(cache=True)
def _search(R, a, h, dv, Na, Nh, Nah, Qp, const, slack, thr, heap_e, heap_s, st, fl, S, lv, child, bb, X, top, budget):
    """Run the depth-first search for at most ``budget`` nodes from the state in (st, fl, S, lv, child, bb, X).

    st = [level p, heap size, nodes, leaves]; fl = [covered fraction]; lv[p] = (D, T_a, T_h, Σdv, ρ) of the
    node at level p; child[p] = children tried; bb[p] = the two children's bounds. The search covers the
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
            if rho <= q:
                b0 = _node_bound(D + s * s, sd, th - h[q] * s, ta - a[q] * s, rho, q, Na, Nh, Nah)
            if rho >= 1:
                t1 = R[q, q] + s
                b1 = _node_bound(
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
                nh = _push(heap_e, heap_s, nh, e, X, n)
            continue
        lv[q, 0] = D + (R[q, q] * v + s) ** 2
        lv[q, 1] = ta - a[q] * s + v * (1.0 - a[q] * R[q, q])
        lv[q, 2] = th - h[q] * s + v * (dv[q] - h[q] * R[q, q])
        lv[q, 3] = sd + v * dv[q]
        lv[q, 4] = rho - v
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


class SubtreeSearch:
    """A resumable search of the subtree below one node: a factor, a threshold and the kernel's state.

    ``decided`` holds the 0/1 values of the factor's last positions (the node; empty for the whole tree). A
    search is split for threads, processes or machines by running one of these per node of a fixed depth
    (:func:`split`), each with the best threshold known (any upper bound on the global k-th best is valid), and
    merging the states they find.

    Example:
        >>> from cbo.instances import fisher_block_qubo
        >>> from cbo.solvers.relaxation import factor, processing_order, shor_shift
        >>> Q = fisher_block_qubo(16, seed=0).qubo_matrix()
        >>> fac = factor(Q, 5, shor_shift(Q, 5).w + 0.05, processing_order(Q))
        >>> run = SubtreeSearch(fac, k=3)
        >>> run.step(10**6); run.done
        True
    """

    def __init__(self, fac: CholeskyFactor, k: int, threshold: float = np.inf, decided: Any = ()) -> None:
        n = len(fac.order)
        x = np.asarray(decided, dtype=np.int8).reshape(-1)
        top = n - len(x)
        if top < 0 or np.any((x != 0) & (x != 1)):
            raise SolverError(f"decided must hold at most {n} values 0/1, got {len(x)}.")
        self.fac = fac
        self.threshold = float(threshold)
        self.top = top
        self.heap_e = np.full(k, np.inf)
        self.heap_s = np.zeros((k, n), dtype=np.int8)
        self.st = np.array([top, 0, 0, 0], dtype=np.int64)
        self.fl = np.zeros(1)
        self.S = np.zeros((n + 1, n))
        self.lv = np.zeros((n + 1, 5))
        self.child = np.zeros(n + 1, dtype=np.int64)
        self.bb = np.zeros((n + 1, 2))
        self.X = np.zeros(n, dtype=np.int8)
        self.X[top:] = x
        rho = fac.r - int(x.sum())
        if rho < 0 or rho > top or top == 0:
            # no completion, or the node is a leaf: nothing to search (a leaf's state is offered once below)
            self.st[0] = top + 1
            if top == 0 and rho == 0:
                e = float(_energies(fac.Q, x[None])[0])
                if e <= self.threshold:
                    self.heap_e[0] = e
                    self.heap_s[0] = x
                    self.st[1] = 1
            return
        rows = fac.R[top:, top:] @ x
        s = fac.R[:top, top:] @ x
        self.S[top, :top] = s
        self.lv[top] = (rows @ rows, fac.a[:top] @ s, fac.h[:top] @ s, fac.dv[top:] @ x, rho)

    @property
    def done(self) -> bool:
        return int(self.st[0]) > self.top

    @property
    def nodes(self) -> int:
        return int(self.st[2])

    @property
    def covered(self) -> float:
        """Fraction of the subtree closed (Σ 2^−depth over closed subtrees below the node)."""
        return 1.0 if self.done else float(self.fl[0])

    def step(self, budget: int) -> None:
        """Search for at most ``budget`` more nodes."""
        f = self.fac
        _search(
            f.R, f.a, f.h, f.dv, f.Na, f.Nh, f.Nah, f.Q, f.const, f.slack, self.threshold,
            self.heap_e, self.heap_s, self.st, self.fl, self.S, self.lv, self.child, self.bb, self.X,
            self.top, int(budget),
        )  # fmt: skip

    def found(self) -> tuple[np.ndarray, np.ndarray]:
        """(energies, states over the original blocks) found so far, best first."""
        nh = int(self.st[1])
        keep = np.argsort(self.heap_e[:nh], kind="stable")
        states = np.zeros((nh, len(self.fac.order)), dtype=np.uint8)
        states[:, self.fac.order] = self.heap_s[:nh][keep]
        return self.heap_e[:nh][keep].copy(), states


def split(fac: CholeskyFactor, depth: int, threshold: float = np.inf) -> list[np.ndarray]:
    """The nodes at ``depth`` decided positions whose bound does not exceed ``threshold``: their ``decided``
    arrays (values of the last ``depth`` positions), for one :class:`SubtreeSearch` each. Every state at or
    below the threshold lies below exactly one of them."""
    n = len(fac.order)
    depth = min(int(depth), n)
    out: list[np.ndarray] = []
    stack = [np.zeros(0, dtype=np.int8)]
    while stack:
        x = stack.pop()
        if fac.node_bound(x) > threshold + fac.slack:
            continue
        if len(x) == depth:
            out.append(x)
            continue
        for v in (1, 0):
            stack.append(np.concatenate([[v], x]).astype(np.int8))
    return out


@dataclass
class SearchResult:
    """The top-K states of a search and how it went.

    ``states`` are 0/1 rows over Q's blocks, best first, with their exact ``energies``. ``exact`` is True when
    the search finished: then they are the proven K best (fewer when fewer than K states have energy at or
    below the seeded threshold). ``covered`` is the fraction of the search tree closed.
    """

    energies: np.ndarray
    states: np.ndarray
    exact: bool
    nodes: int
    covered: float
    seconds: float
    cpu_seconds: float
    alpha: float
    root_bound: float
    info: dict[str, Any] = field(default_factory=dict)


def _energies(Q: np.ndarray, X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    return X @ np.diag(Q) + np.einsum("bi,ij,bj->b", X, np.triu(Q, 1), X)


def _merge(Q: np.ndarray, parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best distinct states of several lists (energies recomputed exactly)."""
    rows = [s for _, s in parts if len(s)]
    n = Q.shape[0]
    if not rows:
        return np.zeros(0), np.zeros((0, n), dtype=np.uint8)
    X = np.unique(np.concatenate(rows).astype(np.uint8), axis=0)
    e = _energies(Q, X)
    keep = np.argsort(e, kind="stable")[:k]
    return e[keep], X[keep]


def search_top_k(
    Q: np.ndarray,
    r: int,
    k: int = 10,
    *,
    alpha: float | None = None,
    shift: np.ndarray | None = None,
    order: np.ndarray | None = None,
    seed_states: np.ndarray | None = None,
    threshold: float = np.inf,
    time_limit: float | None = None,
    node_limit: int | None = None,
    race_nodes: int = 300_000,
    progress: Callable[[float, int, float], None] | None = None,
) -> SearchResult:
    """The k lowest-energy states with ``Σy = r`` of ``E(y) = Σ Q_ii y_i + Σ_{i<j} Q_ij y_i y_j``, proven.

    Args:
        Q: (n, n) QUBO matrix over the free blocks (``Problem.Q``).
        r: blocks to remove.
        k: states to return.
        alpha: uniform extra shift (> 0) in units of the energy scale; None races ``RACE_ALPHAS``.
        shift: the base shift ``w`` (default: :func:`~cbo.solvers.relaxation.shor_shift` of the root).
        order: processing order (default :func:`~cbo.solvers.relaxation.processing_order`).
        seed_states: (m, n) 0/1 states from a heuristic (e.g. ``cbo.solve(q, M, "auto")``): their k-th best
            energy is the starting threshold, and they are merged into the answer, so a run stopped early is
            never worse than the seed.
        threshold: an upper bound on the k-th best energy, if known (only states at or below it are sought).
        time_limit: seconds for the whole call; when it runs out the result is marked inexact.
        node_limit: nodes for the main search at most (inexact when reached).
        race_nodes: nodes per candidate α in the race.
        progress: called after every chunk as ``progress(covered, nodes, kth_best)``.

    Example:
        >>> from cbo.instances import fisher_block_qubo
        >>> q = fisher_block_qubo(24, seed=0)
        >>> res = search_top_k(q.qubo_matrix(), 8, k=3)
        >>> res.exact, len(res.energies)
        (True, 3)
    """
    t0, c0 = time.perf_counter(), time.process_time()
    Q = np.asarray(Q, dtype=np.float64)
    if Q.ndim != 2 or Q.shape[0] != Q.shape[1] or not np.all(np.isfinite(Q)):
        raise SolverError(f"Q must be a finite square matrix, got shape {Q.shape}.")
    Q = 0.5 * (Q + Q.T)
    n = Q.shape[0]
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r <= n:
        raise SolverError(f"r must be an integer in 0..{n}, got {r!r}.")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise SolverError(f"k must be an integer >= 1, got {k!r}.")
    if alpha is not None and not (np.isfinite(alpha) and alpha > 0):
        # at 0 the Shor shift sits on the edge of convexity and the rounding slack swamps the bound
        raise SolverError(f"alpha must be a number > 0 (e.g. 1e-3) or None, got {alpha!r}.")
    if time_limit is not None and not time_limit > 0:
        raise SolverError(f"time_limit must be > 0 seconds, got {time_limit!r}.")
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    if seed_states is not None:
        seeds = np.atleast_2d(np.asarray(seed_states))
        if seeds.size and (seeds.shape[1] != n or np.any((seeds != 0) & (seeds != 1)) or np.any(seeds.sum(1) != r)):
            raise SolverError(f"seed_states must be 0/1 rows of length {n} with exactly {r} ones.")
        if seeds.size:
            parts.append((np.zeros(0), seeds.astype(np.uint8)))

    def finish(exact: bool, nodes: int, covered: float, a: float, root: float, info: dict) -> SearchResult:
        e, X = _merge(Q, parts, k)
        return SearchResult(
            e, X, exact, nodes, covered, time.perf_counter() - t0, time.process_time() - c0, a, root, info
        )

    if r == 0 or r == n:
        parts.append((np.zeros(1), np.full((1, n), 1 if r == n else 0, dtype=np.uint8)))
        return finish(True, 0, 1.0, 0.0, float(_energies(Q, parts[-1][1])[0]), {})

    def kth(thr: float) -> float:
        e, _ = _merge(Q, parts, k)
        return min(thr, float(e[-1])) if len(e) == k else thr

    base = shor_shift(Q, r) if shift is None else None
    w0 = base.w if base is not None else np.broadcast_to(np.asarray(shift, dtype=np.float64), (n,))
    perm = processing_order(Q) if order is None else np.asarray(order)
    scale = energy_scale(Q)
    info: dict[str, Any] = {"shor_bound": None if base is None else base.bound, "race": []}

    def out_of_time() -> bool:
        return time_limit is not None and time.perf_counter() - t0 >= time_limit

    candidates = RACE_ALPHAS if alpha is None else (float(alpha),)
    chosen = candidates[0]
    raced = 0
    if len(candidates) > 1:
        best = -1.0
        for cand in candidates:
            run = SubtreeSearch(factor(Q, r, w0 + cand * scale, perm), k, kth(threshold))
            try:
                run.step(race_nodes)
            except KeyboardInterrupt:
                parts.append(run.found())
                return finish(False, raced, 0.0, chosen, run.fac.root_bound(), {**info, "interrupted": True})
            parts.append(run.found())
            info["race"].append({"alpha": cand, "covered": run.covered, "nodes": run.nodes})
            raced += run.nodes
            if run.done:
                return finish(True, raced, 1.0, cand, run.fac.root_bound(), info)
            if run.covered > best:
                best, chosen = run.covered, cand
            if out_of_time():
                return finish(False, raced, 0.0, chosen, run.fac.root_bound(), info)
    run = SubtreeSearch(factor(Q, r, w0 + chosen * scale, perm), k, kth(threshold))
    limit = np.inf if node_limit is None else int(node_limit)
    try:
        while not run.done and run.nodes < limit and not out_of_time():
            run.step(int(min(_CHUNK, limit - run.nodes)))
            if progress is not None:
                e, _ = run.found()
                progress(run.covered, run.nodes, float(e[-1]) if len(e) == k else np.inf)
    except KeyboardInterrupt:
        info["interrupted"] = True
    parts.append(run.found())
    info["leaves"] = int(run.st[3])
    info["slack"] = run.fac.slack
    info["race_nodes"] = raced
    return finish(run.done, raced + run.nodes, run.covered, chosen, run.fac.root_bound(), info)
