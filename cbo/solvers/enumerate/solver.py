"""The ``enumerate`` solver: exact top-K by branch and bound, with a strategy and a backend it chooses.

Strategies (option ``strategy``, :mod:`.strategy`): ``"lexicographic"`` enumeration with prefix bounds
(:mod:`.plan`, :mod:`.search`) or the ``"relaxation"`` branch and bound (:mod:`.relaxation_run`); ``"auto"``
chooses from the problem's size. A search that may run long is seeded with the states of ``auto``'s heuristic
(the relaxation search when its race did not prove the answer in a fraction of a second; the lexicographic one
before it starts, when its space is beyond :data:`~.strategy.LEXICOGRAPHIC_MAX_STATES`), so a time-limited run
is never worse than ``auto``.

Backends (option ``backend``): ``"local"`` (this process, numba threads), ``"ray"`` (the lexicographic
search sharded over Ray workers, the same result: :mod:`ray`), ``"gpu"`` (full enumeration on a CUDA GPU:
:mod:`gpu`). ``backend_options`` hold the backend's own settings (:class:`RayBackend` fields for Ray,
:class:`GPUOptions` fields for the GPU); a :class:`RayBackend` may be passed as the backend itself.
Everything is checked before the search starts.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numba
import numpy as np

from cbo.checks import check_float
from cbo.errors import SolverOptionError
from cbo.progress import progress_bar
from cbo.solvers.base import Problem, Solver, SolverOutput, register
from cbo.solvers.enumerate.plan import SearchOptions, only_state, plan_enumeration
from cbo.solvers.enumerate.relaxation_run import enumerate_by_relaxation
from cbo.solvers.enumerate.search import enumerate_tasks, merge_task_results
from cbo.solvers.enumerate.strategy import LEXICOGRAPHIC_MAX_STATES, check_strategy, choose_strategy
from cbo.solvers.heuristic import run_heuristic

#: The backends of the enumerator and the modules that run them (each has ``BACKEND_OPTIONS``, the
#: dataclass its ``backend_options`` build, and ``run_backend(problem, options, config)``).
BACKENDS: dict[str, str | None] = {
    "local": None,
    "gpu": "cbo.solvers.enumerate.gpu",
    "ray": "cbo.solvers.enumerate.ray",
}


@register
class EnumerateSolver(Solver):
    """Exact top-K by depth-first enumeration with a K-best threshold and lower bounds (CPU, numba)."""

    name = "enumerate"
    aliases = ("exact",)
    exact = True
    description = "exact top-K by branch-and-bound enumeration of all states with Σx = M (CPU, numba, threads)"

    @dataclass
    class Options(SearchOptions):
        """Settings of the enumerator: those of :class:`SearchOptions` (``order``, ``task_depth``,
        ``batch_seconds``, ``relaxation``, ``relax_iters``, ``relax_min_states`` and ``tail`` concern the
        lexicographic search only; ``threads``, ``warm_start`` and ``seed_heuristic`` both), and

        Attributes:
            strategy: ``"auto"`` (chosen from the problem, see :mod:`cbo.solvers.enumerate.strategy`),
                ``"lexicographic"`` or ``"relaxation"`` (the shifted least-squares branch and bound).
            alpha: the relaxation search's extra shift (> 0, in units of the energy scale); None races
                a few values and keeps the best.
            backend: ``"local"`` (this process), ``"ray"`` (sharded over Ray workers; the ``ray`` extra),
                ``"gpu"`` (full enumeration on a CUDA GPU; the ``gpu`` extra), or a ``RayBackend``.
            backend_options: the backend's settings, e.g. ``{"workers": 8}`` for Ray.
        """

        strategy: str = "auto"
        alpha: float | None = None
        backend: Any = "local"
        backend_options: dict[str, Any] | None = None

        def validate(self) -> None:
            super().validate()
            check_float("alpha", self.alpha, 0, lo_open=True, none_ok=True, error=SolverOptionError, hint="E.g. 0.05.")
            if dataclasses.is_dataclass(self.backend) and not isinstance(self.backend, type):
                ray = backend_module("ray")
                if not isinstance(self.backend, ray.BACKEND_OPTIONS):
                    raise SolverOptionError(f"a backend given as an object must be a RayBackend, got {self.backend!r}.")
                if self.backend_options:
                    raise SolverOptionError("pass either a RayBackend or backend_options, not both.")
                self.backend, self.backend_options = "ray", dataclasses.asdict(self.backend)
            if not isinstance(self.backend, str) or self.backend not in BACKENDS:
                raise SolverOptionError(
                    f"unknown backend {self.backend!r}; valid: {', '.join(map(repr, BACKENDS))} (or a RayBackend)."
                )
            check_strategy(self.strategy, bool(self.bound), self.backend)
            if self.backend == "local":
                if self.backend_options:
                    raise SolverOptionError(f"backend 'local' takes no backend_options, got {self.backend_options!r}.")
                return
            backend_config(self.backend, self.backend_options)

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        if options.backend == "local":
            n, r = problem.n_free, problem.r
            if r == 0 or r == n:
                info = {"states": 1, "nodes": 0, "pruned": 0, "threads": 1}
                return SolverOutput(only_state(problem), exact=True, info=info)
            strategy, reason = choose_strategy(problem, options.strategy, bool(options.bound))
            warn_if_hopeless(problem, strategy)
            if strategy == "relaxation":
                return enumerate_by_relaxation(problem, options, reason)
            out = enumerate_locally(problem, options)
            out.info.update(strategy="lexicographic", strategy_reason=reason)
            return out
        config = backend_config(options.backend, options.backend_options)
        if options.backend == "ray":  # the lexicographic search, sharded
            warn_if_hopeless(problem, "lexicographic")
        return backend_module(options.backend).run_backend(problem, options, config)


# a lexicographic space beyond this many states without a time limit: say at once that it may never finish
# (bounds prune whole subtrees, but at C(300, 150) = 9e88 even a pruned search outlives the user)
HOPELESS_STATES = 1e15


def warn_if_hopeless(problem: Problem, strategy: str) -> None:
    """A warning before a lexicographic search of more than :data:`HOPELESS_STATES` states without a time limit."""
    n, r = problem.n_free, problem.r
    states = math.comb(n, r)
    if strategy != "lexicographic" or states <= HOPELESS_STATES or problem.time_limit is not None:
        return
    import warnings

    warnings.warn(
        f"exact enumeration of C({n}, {r}) = {float(states):.2g} removal sets may never finish: bounds prune part "
        f"of the space, but nothing proves a problem of {n} free blocks this size. Give a time limit (--time-limit "
        "SECONDS; the best states found are returned, marked inexact), use a heuristic (--solver swap-sa) or "
        "--solver auto; Ctrl-C stops it with the best states so far.",
        stacklevel=2,
    )


def backend_module(name: str) -> ModuleType:
    """The module that runs backend ``name`` (imported on first use)."""
    return importlib.import_module(BACKENDS[name])


def backend_config(name: str, backend_options: dict[str, Any] | None) -> Any:
    """The settings of backend ``name`` built from ``backend_options`` and checked."""
    cls = backend_module(name).BACKEND_OPTIONS
    options = dict(backend_options or {})
    valid = [f.name for f in dataclasses.fields(cls)]
    bad = sorted(set(options) - set(valid))
    if bad:
        raise SolverOptionError(f"{name} backend has no option(s) {bad}; valid options: {valid}.")
    config = cls(**options)
    check = getattr(config, "validate", None)
    if check is not None:
        check()
    return config


def enumerate_locally(problem: Problem, opts: SearchOptions) -> SolverOutput:
    """The lexicographic search in this process on numba threads, with a progress bar when asked for.

    A space beyond ``LEXICOGRAPHIC_MAX_STATES`` is seeded with ``auto``'s heuristic first (with
    ``seed_heuristic``): this search cannot resume with a new threshold, and it may not finish.
    """
    n, r = problem.n_free, problem.r
    if r == 0 or r == n:
        info = {"states": 1, "nodes": 0, "pruned": 0, "threads": 1}
        return SolverOutput(only_state(problem), exact=True, info=info)
    seeds = None
    if opts.seed_heuristic and math.comb(n, r) > LEXICOGRAPHIC_MAX_STATES:
        seeds = run_heuristic(problem).candidates
    plan = plan_enumeration(problem, opts, seeds=seeds)
    nth = int(opts.threads) if opts.threads is not None else numba.get_num_threads()
    desc = f"enumerate C({n},{r})"
    bar = progress_bar(problem.progress, eta=False, total=len(plan.tasks), unit="tasks", desc=desc, dynamic_ncols=True)
    try:
        res = enumerate_tasks(
            plan,
            threads=nth,
            batch_seconds=opts.batch_seconds,
            time_left=problem.time_left,
            progress=bar.update if problem.progress else None,
            stop=lambda: problem.interrupted,
        )
        # bounds may close the last tasks in one batch, after the bar last drew: show the true end before closing
        if res.done > bar.n:
            bar.update(res.done - bar.n)
        bar.refresh()
    finally:
        bar.close()
    E, S = merge_task_results(plan, [res])
    info = dict(plan.info)
    if seeds is not None:
        info["heuristic_seeds"] = int(np.sum(seeds.sum(1) == problem.remove))
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
