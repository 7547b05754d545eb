"""Scaling past one process: exact enumeration sharded over Ray, and resumable solver sweeps.

Nothing here imports Ray until it is used; Ray is the optional extra ``cbo[ray]``.

* ``cbo.solve(q, M, "enumerate", backend="ray", backend_options={"workers": 8})`` shards the exact
  top-K over Ray workers (:mod:`cbo.distributed.ray_enumerate`); the result equals the local one.
* :func:`run_sweep` runs a grid of solver × M × seed × instance, locally or on Ray, appending each
  finished cell to a JSONL file so that an interrupted sweep resumes where it stopped
  (:mod:`cbo.distributed.sweep`, the ``cbo sweep`` command).
"""

from __future__ import annotations

from typing import Any

from cbo.distributed.ray_enumerate import RayBackend, init_ray, shutdown
from cbo.distributed.sweep import (
    COLUMNS,
    Cell,
    load_instance,
    make_grid,
    read_records,
    results_table,
    run_sweep,
    solver_row,
    write_table,
)
from cbo.errors import SolverError


def run_on_backend(backend: Any, backend_options: dict[str, Any] | None, cls: type, problem: Any, opts: Any) -> Any:
    """Run ``cls`` on ``problem`` with a non-local backend (called by ``cbo.solve``)."""
    from cbo.distributed.ray_enumerate import run_enumeration

    if isinstance(backend, RayBackend):
        if backend_options:
            raise SolverError("pass either a RayBackend or backend_options, not both.")
        config = backend
    else:
        config = RayBackend.from_options(backend_options)
    if cls.name != "enumerate":
        raise SolverError(
            f"backend='ray' shards the exact enumeration only (solver 'enumerate'), not {cls.name!r}; "
            "run other solvers locally, or spread many runs over Ray with `cbo sweep --backend ray`."
        )
    return run_enumeration(problem, opts, config)


__all__ = [
    "COLUMNS",
    "Cell",
    "RayBackend",
    "init_ray",
    "load_instance",
    "make_grid",
    "read_records",
    "results_table",
    "run_on_backend",
    "run_sweep",
    "shutdown",
    "solver_row",
    "write_table",
]
