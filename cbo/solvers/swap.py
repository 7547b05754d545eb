"""Constraint-native annealing and tabu search: swap moves that never leave Σx = M.

A move removes one kept free block and keeps one removed free block, so every visited state has
exactly M blocks removed and no penalty λ is needed. Energy changes cost O(1) from maintained
local fields ``h = Q_off y``; an accepted move updates the fields in O(n). Keep/force are honoured
by working on the reduced problem (``Problem.Q`` over the free blocks), and per-kind caps and the
parameter budget by rejecting moves that would break them. The numba kernels are in
:mod:`cbo.solvers.swap_kernels`.

Both solvers keep a pool of the best distinct states seen (Zobrist-hashed) and finish with a
*closure* pass: every pooled state's whole single- and double-swap neighbourhood is scanned (each
in O(1) per neighbour from the fields) and any neighbour good enough for the pool is added, until
the pool no longer changes. Low-lying excited states of these energies are mostly one or two swaps
apart, so the closure turns a found ground state into a complete low-energy list. Runs are seeded
per restart, so a given seed gives the same states whatever the time limit cuts (unless it cuts).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np

from cbo.checks import is_int, is_number
from cbo.errors import SolverError, SolverOptionError
from cbo.solvers.base import Problem, Solver, SolverOutput, register
from cbo.solvers.constraints import FreeConstraints
from cbo.solvers.swap_kernels import anneal, closure, tabu_search


class SwapRun:
    """Arrays of one swap-solver run: the reduced problem, the pool of best states, the statistics."""

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
        """The hashes of the current top-k, to detect when restarts stop helping."""
        order = np.argsort(self.pool_E, kind="stable")[:k]
        return tuple(int(h) for h in self.pool_H[order])

    def close(self, max_expand: int, depth: int, stop: Callable[[], bool] | None = None) -> int:
        """Expand pooled states (best first) until the pool is stable, ``max_expand`` were expanded, or
        ``stop()`` (checked before each one: one expansion scans a whole double-swap neighbourhood)."""
        done = 0
        while done < max_expand and not (stop is not None and stop()):
            got = int(closure(*self.constraint_args, *self.pool_args, 1, depth))
            done += got
            if not got:
                break
        return done

    def candidates(self, problem: Problem) -> np.ndarray:
        filled = self.pool_E < np.inf
        return problem.expand(self.pool_X[filled])

    def drive(
        self, problem: Problem, step: Callable[[int, int], None], restarts: int, patience: int, batch: int = 4
    ) -> dict[str, Any]:
        """Run restarts in batches until ``restarts`` are done, ``patience`` restarts in a row leave the
        top-k unchanged, the time limit passes, or Ctrl-C. Returns facts for the result's info."""
        done = 0
        stale = 0
        timed_out = False
        interrupted = False
        sig = self.signature(problem.k)
        try:
            while done < restarts:
                count = min(batch, restarts - done)
                step(done, count)
                done += count
                new = self.signature(problem.k)
                stale = stale + count if new == sig else 0
                sig = new
                if patience and stale >= patience:
                    break
                if problem.time_left() <= 0:  # the time limit, or Ctrl-C (problem.interrupted)
                    interrupted = problem.interrupted
                    timed_out = done < restarts and not interrupted
                    break
        except KeyboardInterrupt:
            interrupted = True
        if self.stats[3] and not np.isfinite(self.pool_E).any():
            raise SolverError(
                "no starting state satisfies the caps and parameter budget for "
                f"M={problem.remove}; loosen max_removed_params/min_removed_params or the caps."
            )
        return {"restarts": done, "timed_out": timed_out, "interrupted": interrupted}


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


@dataclass
class SwapOptions:
    """Settings both swap solvers have (each solver's ``Options`` extend them and set their defaults).

    Attributes:
        restarts: maximum number of restarts.
        patience: stop once this many restarts in a row leave the top-k unchanged (0: never).
        pool: size of the kept best-state pool (default max(2k, k + 20)).
        closure: 2 (default) scans the single- and double-swap neighbourhood of every kept
            state until the pool is stable; 1 single swaps only; 0 off.
    """

    restarts: int = 100
    patience: int = 16
    pool: int | None = None
    closure: int = 2

    def validate(self) -> None:
        _check_counts(self, ("restarts",))
        if not _is_count(self.patience, 0):
            raise SolverOptionError(f"option 'patience' must be an integer >= 0, got {self.patience!r}.")
        if self.pool is not None and not _is_count(self.pool, 1):
            raise SolverOptionError(f"pool must be an integer >= k, got {self.pool!r}.")
        if isinstance(self.closure, bool):
            self.closure = 2 if self.closure else 0
        if not isinstance(self.closure, (int, np.integer)) or self.closure not in (0, 1, 2):
            raise SolverOptionError(f"closure must be 0, 1 or 2, got {self.closure!r}.")


class _SwapSolver(Solver):
    """The run both swap solvers share: restarts (``search``), then the closure of the pool."""

    counters: ClassVar[tuple[str, str]] = ("", "")  # names of stats[1] and stats[2] in the info

    def settings(self, problem: Problem, options: Any) -> dict[str, Any]:
        """Settings derived from the problem (recorded in the info); default: none."""
        return {}

    @abc.abstractmethod
    def search(
        self, run: SwapRun, problem: Problem, options: Any, settings: dict[str, Any], first: int, count: int
    ) -> None:
        """Run the solver's kernel for restarts ``first`` .. ``first + count - 1`` (seeded by their index)."""

    def run(self, problem: Problem, options: Any) -> SolverOutput:
        if problem.n_free > 0 and problem.r > problem.n_free:
            raise SolverError(f"cannot remove {problem.r} of {problem.n_free} free blocks.")
        settings = self.settings(problem, options)
        run = SwapRun(problem, _pool_size(options.pool, problem.k), problem.seed)

        def step(first: int, count: int) -> None:
            self.search(run, problem, options, settings, first, count)

        info = run.drive(problem, step, int(options.restarts), int(options.patience))
        expanded = run.close(10**9 if options.closure else 0, int(options.closure), lambda: problem.interrupted)
        info.update(settings)
        info.update({self.counters[0]: int(run.stats[1]), self.counters[1]: int(run.stats[2])})
        info.update({"closure_expanded": expanded, "feasible_fraction": 1.0})
        return SolverOutput(run.candidates(problem), exact=False, info=info)


@register
class SwapAnnealer(_SwapSolver):
    """Simulated annealing over swap moves (optionally parallel tempering), with restarts."""

    name = "swap-sa"
    aliases = ("swap", "swap-anneal")
    description = "constraint-native simulated annealing (swap moves keep Σx = M; numba)"
    counters = ("proposals", "accepted")

    @dataclass
    class Options(SwapOptions):
        """Settings of the swap annealer (and those of :class:`SwapOptions`).

        Attributes:
            sweeps: sweeps per restart (a sweep proposes n_free swaps).
            replicas: 1 for annealing; >1 for parallel tempering over that many temperatures.
            t_hot / t_cold: temperature range; None derives it from random swap energy changes.
        """

        restarts: int = 200
        patience: int = 24
        sweeps: int = 300
        replicas: int = 1
        t_hot: float | None = None
        t_cold: float | None = None

        def validate(self) -> None:
            super().validate()
            _check_counts(self, ("sweeps", "replicas"))
            for t in (self.t_hot, self.t_cold):
                if t is not None and (not is_number(t) or not t > 0):
                    raise SolverOptionError(
                        f"temperatures must be > 0, got t_hot={self.t_hot!r}, t_cold={self.t_cold!r}."
                    )

    def settings(self, problem: Problem, options: Options) -> dict[str, Any]:
        t_hot, t_cold = default_temperatures(problem, problem.seed)
        t_hot = float(options.t_hot) if options.t_hot is not None else t_hot
        t_cold = float(options.t_cold) if options.t_cold is not None else t_cold
        return {"t_hot": t_hot, "t_cold": t_cold}

    def search(self, run, problem, options, settings, first, count):
        anneal(
            *run.constraint_args, problem.seed, first, count, int(options.sweeps), settings["t_hot"],
            settings["t_cold"], int(options.replicas), *run.pool_args, run.stats,
        )  # fmt: skip


@register
class SwapTabu(_SwapSolver):
    """Tabu search over the swap neighbourhood, with restarts."""

    name = "swap-tabu"
    description = "constraint-native tabu search over swap moves (keeps Σx = M; numba)"
    counters = ("evaluated", "moves")

    @dataclass
    class Options(SwapOptions):
        """Settings of the swap tabu search (and those of :class:`SwapOptions`).

        Attributes:
            iterations: moves per restart.
            tenure: iterations a moved block stays tabu (default max(2, min(M, n−M) // 4)).
        """

        restarts: int = 100
        patience: int = 16
        iterations: int = 400
        tenure: int | None = None

        def validate(self) -> None:
            super().validate()
            _check_counts(self, ("iterations",))
            if self.tenure is not None and not _is_count(self.tenure, 0):
                raise SolverOptionError(f"tenure must be an integer >= 0, got {self.tenure!r}.")

    def settings(self, problem: Problem, options: Options) -> dict[str, Any]:
        n, r = problem.n_free, problem.r
        tenure = options.tenure if options.tenure is not None else max(2, min(r, n - r) // 4)
        return {"tenure": int(tenure)}

    def search(self, run, problem, options, settings, first, count):
        tabu_search(
            *run.constraint_args, problem.seed, first, count, int(options.iterations), settings["tenure"],
            *run.pool_args, run.stats,
        )  # fmt: skip


def _pool_size(pool: int | None, k: int) -> int:
    if pool is None:
        return max(2 * k, k + 20)
    if pool < k:
        raise SolverError(f"pool must be an integer >= k={k}, got {pool!r}.")
    return int(pool)


def _is_count(v: Any, low: int) -> bool:
    return is_int(v) and v >= low


def _check_counts(options: Any, names: tuple[str, ...]) -> None:
    for name in names:
        v = getattr(options, name)
        if not _is_count(v, 1):
            raise SolverOptionError(f"option {name!r} must be an integer >= 1, got {v!r}.")
