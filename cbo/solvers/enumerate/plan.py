"""The plan of an exact search: the free blocks' QUBO in search order, its settings, and its tasks.

The free blocks (not kept, not forced) are reordered (by ascending diagonal by default, so that good
states come early) and the states are visited in lexicographic order of their removed positions. The
tasks are the prefixes of a fixed depth; their subtrees partition the search space, so any split of the
task list can be searched separately (threads, processes, machines: :mod:`cbo.solvers.enumerate.search`,
:mod:`cbo.solvers.enumerate.ray`) and the results merged. The pruning threshold starts at the smallest
of a warm start and what the seed states prove (:mod:`cbo.solvers.enumerate.seeding`).

Example:
    >>> plan = plan_enumeration(problem, SearchOptions())                                  # doctest: +SKIP
    >>> halves = [enumerate_tasks(plan, part) for part in np.array_split(plan.tasks, 2)]  # doctest: +SKIP
    >>> energies, positions = merge_task_results(plan, halves)                            # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from cbo.checks import is_int
from cbo.errors import SolverOptionError
from cbo.solvers.base import Problem
from cbo.solvers.constraints import UNBOUNDED, FreeConstraints
from cbo.solvers.enumerate.bounds import bound_table, relaxation_shift, relaxation_tables
from cbo.solvers.enumerate.fused import pair_tables
from cbo.solvers.enumerate.seeding import Seeds, greedy_seeds, merge_seeds, seeds_from_positions
from cbo.solvers.enumerate.tail import tail_tables

# Largest pair table (C(n, 3) doubles) the fused kernel may allocate; larger n use the generic kernel.
MAX_PAIR_TABLE = 8_000_000
# Largest bound table (n * (r + 1) * n doubles); above it the bound is switched off.
MAX_BOUND_TABLE = 8_000_000
ORDERS = ("diagonal", "natural")


@dataclass
class SearchOptions:
    """Settings of the exact search.

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

    def validate(self) -> None:
        if self.threads is not None:
            limit = numba.config.NUMBA_NUM_THREADS
            if not is_int(self.threads):
                raise SolverOptionError(f"threads must be an integer in 1..{limit}, got {self.threads!r}.")
            if not 1 <= self.threads <= limit:
                raise SolverOptionError(f"threads={self.threads} is out of range; use 1..{limit} (NUMBA_NUM_THREADS).")
        if self.order not in ORDERS:
            raise SolverOptionError(f"order={self.order!r} is not valid; use one of {list(ORDERS)}.")
        if self.warm_start is not None and not (
            isinstance(self.warm_start, (int, float, np.number)) and math.isfinite(self.warm_start)
        ):
            raise SolverOptionError(f"warm_start must be a finite energy or None, got {self.warm_start!r}.")
        if self.task_depth is not None and not _count(self.task_depth, 0):
            raise SolverOptionError(f"task_depth must be an integer >= 0 or None, got {self.task_depth!r}.")
        if not (isinstance(self.batch_seconds, (int, float)) and self.batch_seconds > 0):
            raise SolverOptionError(f"batch_seconds must be > 0, got {self.batch_seconds!r}.")
        if not _count(self.relax_iters, 1):
            raise SolverOptionError(f"relax_iters must be an integer >= 1, got {self.relax_iters!r}.")
        if not (isinstance(self.relax_min_states, (int, float)) and self.relax_min_states >= 0):
            raise SolverOptionError(f"relax_min_states must be a number >= 0, got {self.relax_min_states!r}.")
        if not (_count(self.tail, 0) and self.tail <= 20):
            raise SolverOptionError(f"tail must be an integer in 0..20, got {self.tail!r}.")


def _count(v: Any, low: int) -> bool:
    return is_int(v) and v >= low


@dataclass
class EnumerationPlan:
    """A prepared exact search: the free blocks' QUBO in search order, the settings, and the tasks.

    The tasks are the prefixes (removed-block positions in search order) of depth ``task_depth``;
    their subtrees partition the search space, so any split of the task list can be searched
    separately and the results merged with :func:`cbo.solvers.enumerate.search.merge_task_results`.
    Energies inside the plan are *reduced*: without ``const`` (the energy of the forced blocks). A plan
    pickles without its lookup tables; :meth:`tables` rebuilds them.
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

    @property
    def deepest_task(self) -> int:
        """The deepest prefix the plan's kernel takes as a task."""
        return max(self.r - 4, 0) if self.fast else self.r - 1

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
            T = bound_table(self.Q, self.r) if self.use_bound else np.zeros((1, 1, 1))
            pairs = pair_tables(self.Q) if self.fast else None
            shift = self.relax_shift if self.use_bound else None
            relax = relaxation_tables(self.Q, self.r, shift, self.relax_iters, self.relax_min_states)
            tail = tail_tables(self.Q, min(self.tail_window, self.n) if self.fast else 0)
            self._tables = (T, pairs, relax, tail)
        return self._tables

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


def plan_enumeration(problem: Problem, options: SearchOptions | None = None, *, seeds: Any = None) -> EnumerationPlan:
    """Prepare the exact search of ``problem`` (reordering, bound switch, seeded threshold, tasks).

    Args:
        problem: a reduced solve request (see :class:`cbo.solvers.base.Problem`).
        options: the search settings (defaults when None; the enumerator's ``Options`` extend them).
        seeds: full (B, N) states known in advance (e.g. a heuristic's): the feasible ones seed the
            threshold (the K-th best of them bounds the true K-th best) and join the result.
    """
    opts = SearchOptions() if options is None else options
    n, r, K = problem.n_free, problem.r, problem.k
    Q0 = np.asarray(problem.Q, dtype=np.float64)
    perm = np.argsort(np.diag(Q0), kind="stable") if opts.order == "diagonal" else np.arange(n)
    Q = np.ascontiguousarray(Q0[np.ix_(perm, perm)])
    side = problem.has_side_constraints
    fast = (not side) and r >= 3 and math.comb(n, 3) <= MAX_PAIR_TABLE
    use_bound = bool(opts.bound)
    info: dict[str, Any] = {"kernel": "fused" if fast else "generic", "order": opts.order}
    if use_bound and n * (r + 1) * n > MAX_BOUND_TABLE:
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
    seeded = Seeds.empty(r)
    if opts.seed_heuristic and not side and not trivial:
        seeded = greedy_seeds(Q, r, K)
        thr = seeded.threshold
        info["seed_threshold"] = float(thr + problem.const) if np.isfinite(thr) else None
    if seeds is not None and not trivial:
        given = _given_seeds(problem, perm, Q, seeds)
        info["given_seeds"] = len(given.energies)
        seeded = merge_seeds(seeded, given, K)
    cap = min(cap, float(seeded.threshold) + slack)

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
        relax_shift = relaxation_shift(Q)
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
        seed_energies=seeded.energies,
        seed_positions=seeded.positions,
        relax_shift=relax_shift,
        relax_iters=int(opts.relax_iters),
        relax_min_states=float(opts.relax_min_states),
        tail_window=int(opts.tail),
    )


def _given_seeds(problem: Problem, perm: np.ndarray, Q: np.ndarray, states: Any) -> Seeds:
    """Seeds from full states: the feasible ones, as removed positions in search order."""
    q = problem.qubo
    X = np.asarray(states, dtype=np.uint8).reshape(-1, q.n)
    X = X[q.feasible(X, problem.remove)] if len(X) else X
    where = np.empty(len(perm), dtype=np.int64)
    where[perm] = np.arange(len(perm))
    _, cols = np.nonzero(X[:, problem.free])
    positions = np.sort(where[cols].reshape(len(X), problem.r), axis=1) if len(X) else np.zeros((0, problem.r))
    return seeds_from_positions(Q, positions, problem.k)


def _side_arrays(problem: Problem, perm: np.ndarray, r: int) -> dict[str, Any]:
    """Cap groups, caps, sizes and budget of the free blocks (in search order), net of the forced ones,
    with the tables the generic kernel prunes infeasible prefixes with."""
    fc = FreeConstraints.from_problem(problem)
    kind = fc.kind[perm]
    size = fc.size[perm]
    n = len(kind)
    groups = len(fc.cap)
    minsum = np.full((n + 1, r + 1), UNBOUNDED, dtype=np.int64)
    maxsum = np.full((n + 1, r + 1), -UNBOUNDED, dtype=np.int64)
    avail = np.zeros((n + 1, groups), dtype=np.int64)
    for s in range(n, -1, -1):
        tail = np.sort(size[s:])
        m = min(len(tail), r)
        minsum[s, : m + 1] = np.concatenate([[0], np.cumsum(tail[:m])])
        maxsum[s, : m + 1] = np.concatenate([[0], np.cumsum(tail[::-1][:m])])
        if s < n:
            avail[s] = avail[s + 1]
            avail[s, kind[s]] += 1
    return {
        "kind": np.ascontiguousarray(kind),
        "capk": fc.cap,
        "size": np.ascontiguousarray(size),
        "pmin": np.int64(fc.pmin),
        "pmax": np.int64(fc.pmax),
        "minsum": minsum,
        "maxsum": maxsum,
        "avail": avail,
    }


def _side_arrays_none(n: int, r: int) -> dict[str, Any]:
    """Neutral side-constraint arrays (no caps, no budget) of the types the generic kernel expects."""
    return {
        "kind": np.zeros(n, dtype=np.int64),
        "capk": np.full(1, UNBOUNDED, dtype=np.int64),
        "size": np.zeros(n, dtype=np.int64),
        "pmin": np.int64(-UNBOUNDED),
        "pmax": np.int64(UNBOUNDED),
        "minsum": np.zeros((n + 1, r + 1), dtype=np.int64),
        "maxsum": np.zeros((n + 1, r + 1), dtype=np.int64),
        "avail": np.zeros((n + 1, 1), dtype=np.int64),
    }


def _choose_task_depth(n: int, r: int, dmax: int, requested: int | None) -> int:
    if requested is not None:
        return min(int(requested), dmax)
    d = 0
    # tasks are the prefixes of depth d: C(n - r + d, d) of them; aim for a few thousand
    while d < dmax and math.comb(n - r + d + 1, d + 1) <= 6000:
        d += 1
    return d


def only_state(problem: Problem) -> np.ndarray:
    """The one full state when nothing is left to choose: no free block removed (r = 0) or all (r = n)."""
    Y = np.zeros((1, problem.n_free), dtype=np.uint8)
    Y[:, : problem.r] = 1
    return problem.expand(Y)
