"""Solvers for BlockQUBO: one module per family, all behind ``cbo.solve`` and one registry.

Importing this package registers every built-in solver; optional dependencies (qiskit, OR-Tools,
CuPy) are imported only when a solver runs or checks its availability.
"""

from cbo.solvers.base import (
    Availability,
    Problem,
    Solver,
    SolverOutput,
    available,
    get,
    names,
    register,
    solve,
)
from cbo.solvers import enumerate as _enumerate  # noqa: F401  (registers "enumerate")

__all__ = [
    "Availability",
    "Problem",
    "Solver",
    "SolverOutput",
    "available",
    "get",
    "names",
    "register",
    "solve",
]
