"""Solvers for BlockQUBO: one module per family, all behind ``cbo.solve`` and one registry.

Importing this package registers every built-in solver; optional dependencies (qiskit, OR-Tools,
CuPy) are imported only when a solver runs or checks its availability.
"""

from cbo.solvers import auto as _auto  # noqa: F401  (registers "auto")
from cbo.solvers import cpsat as _cpsat  # noqa: F401  (registers "cpsat")
from cbo.solvers import enumerate as _enumerate  # noqa: F401  (registers "enumerate")
from cbo.solvers import enumerate_gpu as _enumerate_gpu  # noqa: F401  (registers "enumerate-gpu")
from cbo.solvers import ocean as _ocean  # noqa: F401  (registers "sa", "tabu", "dimod")
from cbo.solvers import qaoa as _qaoa  # noqa: F401  (registers "qaoa")
from cbo.solvers import swap as _swap  # noqa: F401  (registers "swap-sa", "swap-tabu")
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
