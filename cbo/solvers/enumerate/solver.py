"""The ``enumerate`` solver: exact top-K by branch and bound, on a backend it chooses from its options.

Backends (option ``backend``): ``"local"`` (this process, numba threads: :mod:`search`), ``"ray"``
(the same search sharded over Ray workers, the same result: :mod:`ray`), ``"gpu"`` (full enumeration
on a CUDA GPU: :mod:`gpu`). ``backend_options`` hold the backend's own settings (:class:`RayBackend`
fields for Ray, :class:`GPUOptions` fields for the GPU); a :class:`RayBackend` may be passed as the
backend itself. Everything is checked before the search starts.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numba

from cbo.errors import SolverOptionError
from cbo.solvers.base import Problem, Solver, SolverOutput, register
from cbo.solvers.enumerate.plan import SearchOptions, only_state, plan_enumeration
from cbo.solvers.enumerate.search import enumerate_tasks, merge_task_results

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
        """Settings of the enumerator: the search settings of :class:`SearchOptions`, and

        Attributes:
            backend: ``"local"`` (this process), ``"ray"`` (sharded over Ray workers; the ``ray`` extra),
                ``"gpu"`` (full enumeration on a CUDA GPU; the ``gpu`` extra), or a ``RayBackend``.
            backend_options: the backend's settings, e.g. ``{"workers": 8}`` for Ray.
        """

        backend: Any = "local"
        backend_options: dict[str, Any] | None = None

        def validate(self) -> None:
            super().validate()
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
            if self.backend == "local":
                if self.backend_options:
                    raise SolverOptionError(f"backend 'local' takes no backend_options, got {self.backend_options!r}.")
                return
            backend_config(self.backend, self.backend_options)

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        if options.backend == "local":
            return enumerate_locally(problem, options)
        config = backend_config(options.backend, options.backend_options)
        return backend_module(options.backend).run_backend(problem, options, config)


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
    """The exact search in this process on numba threads, with a progress bar when asked for."""
    n, r = problem.n_free, problem.r
    if r == 0 or r == n:
        info = {"states": 1, "nodes": 0, "pruned": 0, "threads": 1}
        return SolverOutput(only_state(problem), exact=True, info=info)
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
