"""Solvers for BlockQUBO: one module per family, all behind ``cbo.solve`` and one registry.

The built-in solvers are registered when the registry is first looked up (``names()``, ``get()``,
``available()``, ``solve()``); optional dependencies (qiskit, OR-Tools, CuPy, Ray) are imported only when
a solver runs or checks its availability. ``register`` adds a user's own :class:`Solver` subclass.
"""

from cbo.solvers.base import (
    REGISTRY,
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
    "REGISTRY",
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
