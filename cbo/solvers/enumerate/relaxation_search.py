"""Exact top-K of a cardinality-constrained QUBO by depth-first branch and bound with the relaxation bound.

The search decides one block per level (removed or kept), in the order of a :class:`CholeskyFactor`, and
bounds every child in O(1) with the shifted least-squares relaxation of
:mod:`cbo.solvers.enumerate.relaxation` (the kernel: :mod:`cbo.solvers.enumerate.relaxation_kernel`). A child
is pruned when its bound exceeds the current K-th best (or the seeded threshold) by more than the factor's
rounding slack, so no state of the true top K is ever cut; leaves get their energy recomputed exactly from Q.
Per-kind caps and a parameter budget (a :class:`~cbo.solvers.constraints.FreeConstraints`) prune the children
that cannot be completed within them.

The shift is the Shor shift of the root (:func:`~cbo.solvers.enumerate.relaxation.shor_shift`) plus a uniform
``α`` times the energy scale. ``α`` is chosen by a race: each candidate searches for ``race_nodes`` nodes and
the one that closed the largest fraction of the tree wins (the fraction is Σ 2^−depth over closed subtrees,
which is also the progress shown). Every state a racer finds is kept and tightens the threshold of the real run.

The real run is resumable: the kernel runs for a node budget and returns with its whole state in arrays, so the
search checks the time limit, a stop request (Ctrl-C) and shows progress between chunks without losing
anything found. With ``threads > 1`` the tree is :func:`split` into subtrees that threads search at once (the
kernel releases the GIL), every subtree pruning with the best K-th energy any of them has found. ``reseed``
(e.g. a heuristic solver) is called once when the race has not proven the answer, before the main search: its
states set the threshold and join the answer, so a search stopped early is never worse than the heuristic.
Energies here are over Q's blocks (add ``Problem.const`` for the full QUBO).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from cbo.checks import check_int
from cbo.errors import SolverError
from cbo.solvers.constraints import UNBOUNDED, FreeConstraints
from cbo.solvers.enumerate.relaxation import CholeskyFactor, energy_scale, factor, processing_order, shor_shift
from cbo.solvers.enumerate.relaxation_kernel import search_chunk

# Uniform extra shifts tried by the race, in units of the energy scale (median |2·Q_jj|). On full-rank Fisher
# matrices the smallest wins; on low-rank ones (32 samples) about 0.1-0.2.
RACE_ALPHAS = (1e-3, 1e-2, 0.05, 0.2, 0.5)
# Nodes per kernel call between checks of the time limit, stop requests and progress (about 0.05 s).
CHUNK = 1_000_000
# How often the calling thread looks at the clock while threads search.
POLL_SECONDS = 0.02
# Subtrees handed to threads: about this many per thread, split at most this deep.
TASKS_PER_THREAD = 8
MAX_SPLIT_DEPTH = 20


@dataclass(frozen=True)
class SideTables:
    """Per-kind caps and the parameter budget over the blocks in processing order, as the kernel reads them.

    ``minsum[q, t]`` / ``maxsum[q, t]`` are the sums of the ``t`` smallest / largest sizes among positions
    ``0..q−1`` (unreachable values where fewer than t blocks are left), ``avail[q, g]`` how many of those
    positions belong to cap group ``g``.
    """

    active: bool
    kind: np.ndarray
    cap: np.ndarray
    size: np.ndarray
    pmin: np.int64
    pmax: np.int64
    minsum: np.ndarray
    maxsum: np.ndarray
    avail: np.ndarray

    @classmethod
    def build(cls, constraints: FreeConstraints | None, order: np.ndarray, r: int) -> SideTables:
        n = len(order)
        if constraints is None or not constraints.active:
            z = np.zeros((1, 1), dtype=np.int64)
            return cls(
                False, np.zeros(n, np.int64), np.full(1, UNBOUNDED), np.zeros(n, np.int64), np.int64(-UNBOUNDED),
                np.int64(UNBOUNDED), np.zeros((n + 1, r + 1), np.int64), np.zeros((n + 1, r + 1), np.int64), z,
            )  # fmt: skip
        kind = np.ascontiguousarray(np.asarray(constraints.kind, dtype=np.int64)[order])
        size = np.ascontiguousarray(np.asarray(constraints.size, dtype=np.int64)[order])
        cap = np.asarray(constraints.cap, dtype=np.int64)
        if len(kind) != n or len(size) != n or (n and kind.max() >= len(cap)):
            raise SolverError(f"constraints must describe the {n} blocks of Q (kind, size) and every cap group.")
        minsum = np.full((n + 1, r + 1), UNBOUNDED, dtype=np.int64)
        maxsum = np.full((n + 1, r + 1), -UNBOUNDED, dtype=np.int64)
        avail = np.zeros((n + 1, len(cap)), dtype=np.int64)
        for q in range(n + 1):
            head = np.sort(size[:q])
            m = min(q, r)
            minsum[q, : m + 1] = np.concatenate([[0], np.cumsum(head[:m])])
            maxsum[q, : m + 1] = np.concatenate([[0], np.cumsum(head[::-1][:m])])
            if q:
                avail[q] = avail[q - 1]
                avail[q, kind[q - 1]] += 1
        return cls(True, kind, cap, size, np.int64(constraints.pmin), np.int64(constraints.pmax), minsum, maxsum, avail)

    def counts(self, decided: np.ndarray) -> tuple[np.ndarray, int]:
        """(removed blocks per cap group, removed parameters) of the decided last positions."""
        n = len(self.kind)
        ones = n - len(decided) + np.flatnonzero(decided)
        cnt = np.bincount(self.kind[ones], minlength=len(self.cap)).astype(np.int64) if self.active else None
        return (cnt if cnt is not None else np.zeros(1, np.int64)), int(self.size[ones].sum())

    def completable(self, decided: np.ndarray, r: int) -> bool:
        """Whether the node whose last positions hold ``decided`` has a completion within the caps and budget."""
        q = len(self.kind) - len(decided)
        rho = r - int(np.sum(decided))
        if rho < 0 or rho > q:
            return False
        if not self.active:
            return True
        cnt, ps = self.counts(decided)
        if np.any(cnt > self.cap) or ps + self.minsum[q, rho] > self.pmax or ps + self.maxsum[q, rho] < self.pmin:
            return False
        room = np.clip(np.minimum(self.cap - cnt, self.avail[q]), 0, None).sum()
        return bool(room >= rho)


class SubtreeSearch:
    """A resumable search of the subtree below one node: a factor, a threshold and the kernel's state.

    ``decided`` holds the 0/1 values of the factor's last positions (the node; empty for the whole tree). A
    search is split for threads, processes or machines by running one of these per node of a fixed depth
    (:func:`split`), each with the best threshold known (any upper bound on the global k-th best is valid; it
    may be lowered between steps), and merging the states they find.

    Example:
        >>> from cbo.qubo.instances import fisher_block_qubo
        >>> from cbo.solvers.enumerate.relaxation import factor, processing_order, shor_shift
        >>> Q = fisher_block_qubo(16, seed=0).qubo_matrix()
        >>> fac = factor(Q, 5, shor_shift(Q, 5).w + 0.05, processing_order(Q))
        >>> run = SubtreeSearch(fac, k=3)
        >>> run.step(10**6); run.done
        True
    """

    def __init__(
        self, fac: CholeskyFactor, k: int, threshold: float = np.inf, decided: Any = (), side: SideTables | None = None
    ) -> None:
        n = len(fac.order)
        x = np.asarray(decided, dtype=np.int8).reshape(-1)
        top = n - len(x)
        if top < 0 or np.any((x != 0) & (x != 1)):
            raise SolverError(f"decided must hold at most {n} values 0/1, got {len(x)}.")
        self.fac = fac
        self.side = SideTables.build(None, fac.order, fac.r) if side is None else side
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
        self.cnt = np.zeros((n + 1, len(self.side.cap)), dtype=np.int64)
        self.psum = np.zeros(n + 1, dtype=np.int64)
        rho = fac.r - int(x.sum())
        if top == 0 or not self.side.completable(x, fac.r):
            # no completion, or the node is a leaf: nothing to search (a feasible leaf is offered once here)
            self.st[0] = top + 1
            if top == 0 and rho == 0 and self.side.completable(x, fac.r):
                e = float(state_energies(fac.Q, x[None])[0])
                if e <= self.threshold + fac.slack:  # the kernel's and split's rounding allowance
                    self.heap_e[0] = e
                    self.heap_s[0] = x
                    self.st[1] = 1
            return
        rows = fac.R[top:, top:] @ x
        s = fac.R[:top, top:] @ x
        self.S[top, :top] = s
        self.lv[top] = (rows @ rows, fac.a[:top] @ s, fac.h[:top] @ s, fac.dv[top:] @ x, rho)
        if self.side.active:
            self.cnt[top], self.psum[top] = self.side.counts(x)

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
        f, sd = self.fac, self.side
        search_chunk(
            f.R, f.a, f.h, f.dv, f.Na, f.Nh, f.Nah, f.Q, f.const, f.slack, self.threshold,
            self.heap_e, self.heap_s, self.st, self.fl, self.S, self.lv, self.child, self.bb, self.X,
            self.top, int(budget), sd.active, sd.kind, sd.cap, sd.size, sd.pmin, sd.pmax, sd.minsum, sd.maxsum,
            sd.avail, self.cnt, self.psum,
        )  # fmt: skip

    def found(self) -> tuple[np.ndarray, np.ndarray]:
        """(energies, states over the original blocks) found so far, best first."""
        nh = int(self.st[1])
        keep = np.argsort(self.heap_e[:nh], kind="stable")
        states = np.zeros((nh, len(self.fac.order)), dtype=np.uint8)
        states[:, self.fac.order] = self.heap_s[:nh][keep]
        return self.heap_e[:nh][keep].copy(), states


def split(
    fac: CholeskyFactor, depth: int, threshold: float = np.inf, side: SideTables | None = None
) -> list[np.ndarray]:
    """The nodes at ``depth`` decided positions whose bound does not exceed ``threshold`` (and that can be
    completed within the caps and budget of ``side``): their ``decided`` arrays (values of the last ``depth``
    positions), for one :class:`SubtreeSearch` each, best bound first. Every state at or below the threshold
    lies below exactly one of them."""
    n = len(fac.order)
    depth = min(int(depth), n)
    out: list[tuple[float, np.ndarray]] = []
    stack = [np.zeros(0, dtype=np.int8)]
    while stack:
        x = stack.pop()
        bound = fac.node_bound(x)
        if bound > threshold + fac.slack or (side is not None and not side.completable(x, fac.r)):
            continue
        if len(x) == depth:
            out.append((bound, x))
            continue
        for v in (1, 0):
            stack.append(np.concatenate([[v], x]).astype(np.int8))
    out.sort(key=lambda item: item[0])
    return [x for _, x in out]


@dataclass
class SearchResult:
    """The top-K states of a search and how it went.

    ``states`` are 0/1 rows over Q's blocks, best first, with their exact ``energies``. ``exact`` is True when
    the search finished: then they are the proven K best (fewer when fewer than K states have energy at or
    below the seeded threshold). ``covered`` is the fraction of the search tree closed. ``info`` says why a
    search stopped early (``interrupted``, ``timed_out``), how many subtrees and threads ran, the race, and
    how many states ``reseed`` gave.
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


def state_energies(Q: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``Σ Q_ii x_i + Σ_{i<j} Q_ij x_i x_j`` of every row of X."""
    X = np.asarray(X, dtype=np.float64)
    return X @ np.diag(Q) + np.einsum("bi,ij,bj->b", X, np.triu(Q, 1), X)


class BestStates:
    """The k best distinct states offered so far (energies recomputed exactly), shared by threads."""

    def __init__(self, Q: np.ndarray, k: int, threshold: float = np.inf) -> None:
        self.Q, self.k, self.threshold = Q, k, float(threshold)
        self.energies = np.zeros(0)
        self.states = np.zeros((0, Q.shape[0]), dtype=np.uint8)
        self.lock = threading.Lock()

    def offer(self, states: np.ndarray) -> None:
        states = np.asarray(states, dtype=np.uint8).reshape(-1, self.Q.shape[0])
        if not len(states):
            return
        with self.lock:
            X = np.unique(np.concatenate([self.states, states]), axis=0)
            e = state_energies(self.Q, X)
            keep = np.argsort(e, kind="stable")[: self.k]
            self.energies, self.states = e[keep], X[keep]

    def kth(self) -> float:
        """The threshold to prune with: the k-th best energy found, or the given threshold if lower."""
        e = self.energies
        return min(self.threshold, float(e[-1])) if len(e) == self.k else self.threshold


def check_states(states: Any, n: int, r: int, label: str) -> np.ndarray:
    """0/1 rows of length n with r ones, as uint8 (SolverError naming ``label`` otherwise)."""
    X = np.atleast_2d(np.asarray(states))
    if X.size == 0:
        return np.zeros((0, n), dtype=np.uint8)
    if X.shape[1] != n or np.any((X != 0) & (X != 1)) or np.any(X.sum(1) != r):
        raise SolverError(f"{label} must be 0/1 rows of length {n} with exactly {r} ones.")
    return X.astype(np.uint8)


def search_top_k(
    Q: np.ndarray,
    r: int,
    k: int = 10,
    *,
    constraints: FreeConstraints | None = None,
    alpha: float | None = None,
    shift: np.ndarray | None = None,
    order: np.ndarray | None = None,
    seed_states: np.ndarray | None = None,
    threshold: float = np.inf,
    time_limit: float | None = None,
    node_limit: int | None = None,
    race_nodes: int = 300_000,
    threads: int = 1,
    progress: Callable[[float, int, float], None] | None = None,
    stop: Callable[[], bool] | None = None,
    reseed: Callable[[], np.ndarray] | None = None,
) -> SearchResult:
    """The k lowest-energy states with ``Σy = r`` of ``E(y) = Σ Q_ii y_i + Σ_{i<j} Q_ij y_i y_j``, proven.

    Args:
        Q: (n, n) QUBO matrix over the free blocks (``Problem.Q``).
        r: blocks to remove.
        k: states to return.
        constraints: per-kind caps and a parameter budget over Q's blocks (``FreeConstraints.from_problem``).
        alpha: uniform extra shift (> 0) in units of the energy scale; None races ``RACE_ALPHAS``.
        shift: the base shift ``w`` (default: :func:`~cbo.solvers.enumerate.relaxation.shor_shift` of the root).
        order: processing order (default :func:`~cbo.solvers.enumerate.relaxation.processing_order`).
        seed_states: (m, n) 0/1 states from a heuristic (e.g. ``cbo.solve(q, M, "auto")``): their k-th best
            energy is the starting threshold, and they are merged into the answer, so a run stopped early is
            never worse than the seed (states breaking the constraints are dropped).
        threshold: an upper bound on the k-th best energy, if known (only states at or below it are sought).
        time_limit: seconds for the whole call; when it runs out the result is marked inexact.
        node_limit: nodes at most, the race's included (inexact when reached).
        race_nodes: nodes per candidate α in the race.
        threads: subtrees searched at once.
        progress: called between chunks as ``progress(covered, nodes, kth_best)``.
        stop: polled between chunks; True stops the search (inexact, ``info["interrupted"]``).
        reseed: called once when the race did not prove the answer, before the main search; returns (m, n)
            states that seed the threshold and join the answer, like ``seed_states``.

    Example:
        >>> from cbo.qubo.instances import fisher_block_qubo
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
    check_int("r", r, 0, n, error=SolverError)
    check_int("k", k, 1, error=SolverError)
    if alpha is not None and not (np.isfinite(alpha) and alpha > 0):
        # at 0 the Shor shift sits on the edge of convexity and the rounding slack swamps the bound
        raise SolverError(f"alpha must be a number > 0 (e.g. 1e-3) or None, got {alpha!r}.")
    if time_limit is not None and not time_limit > 0:
        raise SolverError(f"time_limit must be > 0 seconds, got {time_limit!r}.")
    check_int("threads", threads, 1, error=SolverError)
    best = BestStates(Q, int(k), threshold)

    def admit(states: Any, label: str) -> int:
        X = check_states(states, n, r, label)
        if constraints is not None and len(X):
            X = X[constraints.ok(X)]
        best.offer(X)
        return len(X)

    info: dict[str, Any] = {"shor_bound": None, "race": [], "threads": int(threads), "reseeded": None}
    if seed_states is not None:
        info["seeded"] = admit(seed_states, "seed_states")

    def finish(exact: bool, nodes: int, covered: float, a: float, root: float) -> SearchResult:
        if progress is not None:
            progress(covered, nodes, best.kth())
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        return SearchResult(best.energies, best.states, exact, nodes, covered, seconds, cpu, a, root, info)

    if r == 0 or r == n:
        admit(np.full((1, n), 1 if r == n else 0, dtype=np.uint8), "the only state")
        return finish(True, 0, 1.0, 0.0, float(best.energies[0]) if len(best.energies) else np.inf)

    def out_of_time() -> bool:
        return time_limit is not None and time.perf_counter() - t0 >= time_limit

    def stopped() -> bool:
        if stop is not None and stop():
            info["interrupted"] = True
            return True
        if out_of_time():
            info["timed_out"] = True
            return True
        return False

    base = shor_shift(Q, r) if shift is None else None
    w0 = base.w if base is not None else np.broadcast_to(np.asarray(shift, dtype=np.float64), (n,))
    info["shor_bound"] = None if base is None else base.bound
    perm = processing_order(Q) if order is None else np.asarray(order)
    side = SideTables.build(constraints, perm, r)
    scale = energy_scale(Q)
    candidates = RACE_ALPHAS if alpha is None else (float(alpha),)
    chosen = candidates[0]
    raced = 0
    limit = np.inf if node_limit is None else int(node_limit)
    widest = -1.0
    # the race (one runner when alpha is given): what a runner proves needs no main search
    for cand in candidates:
        run = SubtreeSearch(factor(Q, r, w0 + cand * scale, perm), k, best.kth(), side=side)
        budget = min(race_nodes, limit - raced)
        try:
            while not run.done and run.nodes < budget and not stopped():
                run.step(int(min(CHUNK, budget - run.nodes)))
        except KeyboardInterrupt:
            info["interrupted"] = True
        best.offer(run.found()[1])
        info["race"].append({"alpha": cand, "covered": run.covered, "nodes": run.nodes})
        raced += run.nodes
        if run.done:
            return finish(True, raced, 1.0, cand, run.fac.root_bound())
        if run.covered > widest:
            widest, chosen = run.covered, cand
        if raced >= limit:
            info["node_limit"] = True
        if info.get("interrupted") or info.get("timed_out") or info.get("node_limit"):
            return finish(False, raced, run.covered, chosen, run.fac.root_bound())
    if reseed is not None and not stopped():
        info["reseeded"] = admit(reseed(), "reseed states")
    fac = factor(Q, r, w0 + chosen * scale, perm)
    search = ParallelSearch(fac, side, best, int(threads), None if node_limit is None else limit - raced)
    search.run(stopped, progress, info)
    info.update(race_nodes=raced, slack=fac.slack, subtrees=len(search.tasks), leaves=search.leaves)
    if search.complete:  # a stop that came after the last subtree finished changes nothing
        info.pop("interrupted", None)
        info.pop("timed_out", None)
    return finish(search.complete, raced + search.nodes, search.covered(), chosen, fac.root_bound())


class ParallelSearch:
    """The main search of one factor: the tree split into subtrees (one per thread at a time), each pruning
    with the best k-th energy found by any of them; the calling thread watches the clock, stop requests and
    progress."""

    def __init__(
        self, fac: CholeskyFactor, side: SideTables, best: BestStates, threads: int, node_limit: int | None
    ) -> None:
        self.fac, self.side, self.best, self.threads = fac, side, best, threads
        self.node_limit = np.inf if node_limit is None else int(node_limit)
        n = len(fac.order)
        depth = 0
        tasks = [np.zeros(0, dtype=np.int8)]
        while threads > 1 and len(tasks) < TASKS_PER_THREAD * threads and depth < min(n, MAX_SPLIT_DEPTH):
            depth += 1
            tasks = split(fac, depth, best.kth(), side)
        self.depth, self.tasks = depth, tasks
        self.weight = 2.0**-depth
        # the part of the tree the split already closed (pruned nodes above the tasks' depth)
        self.closed = 1.0 - len(tasks) * self.weight
        self.next_task = 0
        self.finished = 0
        self.finished_nodes = 0
        self.leaves = 0
        self.running: dict[int, SubtreeSearch] = {}
        self.halt = False
        self.lock = threading.Lock()
        self.failure: list[BaseException] = []

    @property
    def complete(self) -> bool:
        return self.finished == len(self.tasks)

    @property
    def nodes(self) -> int:
        with self.lock:
            return self.finished_nodes + sum(run.nodes for run in self.running.values())

    def covered(self) -> float:
        with self.lock:
            part = sum(run.covered for run in self.running.values())
            return min(1.0, self.closed + self.weight * (self.finished + part))

    def work(self, wid: int) -> None:
        try:
            while not self.halt:
                with self.lock:
                    if self.next_task >= len(self.tasks):
                        return
                    decided = self.tasks[self.next_task]
                    self.next_task += 1
                run = SubtreeSearch(self.fac, self.best.k, self.best.kth(), decided, self.side)
                with self.lock:
                    self.running[wid] = run
                while not run.done and not self.halt:
                    run.threshold = min(run.threshold, self.best.kth())
                    run.step(int(min(CHUNK, max(1, self.node_limit - self.nodes))))
                    self.best.offer(run.found()[1])
                    if self.nodes >= self.node_limit:
                        self.halt = True
                self.best.offer(run.found()[1])  # a subtree that is one leaf is done before any step
                with self.lock:
                    del self.running[wid]
                    self.finished_nodes += run.nodes
                    self.leaves += int(run.st[3])
                    self.finished += int(run.done)
        except BaseException as exc:  # re-raised in the calling thread
            self.failure.append(exc)
            self.halt = True

    def run(
        self, stopped: Callable[[], bool], progress: Callable[[float, int, float], None] | None, info: dict[str, Any]
    ) -> None:
        workers = [
            threading.Thread(target=self.work, args=(w,), name=f"cbo-relaxation-{w}", daemon=True)
            for w in range(min(self.threads, max(1, len(self.tasks))))
        ]
        for t in workers:
            t.start()
        last = time.perf_counter()
        try:
            while any(t.is_alive() for t in workers):
                alive = next(t for t in workers if t.is_alive())
                alive.join(timeout=POLL_SECONDS)
                if stopped():
                    self.halt = True
                    break
                now = time.perf_counter()
                if progress is not None and now - last >= 0.1:
                    last = now
                    progress(self.covered(), self.nodes, self.best.kth())
        except KeyboardInterrupt:
            info["interrupted"] = True
            self.halt = True
        for t in workers:
            t.join()
        if self.failure:
            raise self.failure[0]
        if self.node_limit < np.inf and self.nodes >= self.node_limit and not self.complete:
            info["node_limit"] = True
