"""Compile the solvers' numba kernels ahead of the first solve: ``cbo setup`` runs :func:`compile_kernels`, so the
first exact solve of ``make demo`` does not spend its 17-24 s compiling without a word. numba caches the machine
code beside the modules (``cache=True``), so this is paid once per installation.

Example:
    >>> seconds = compile_kernels()   # doctest: +SKIP
"""

from __future__ import annotations

import time


def compile_kernels() -> float:
    """Run one tiny solve down each kernel path (the lexicographic search's fused and generic kernels, the
    relaxation search, the swap heuristics); returns the seconds it took (well under one once compiled)."""
    from cbo.qubo.instances import random_block_qubo
    from cbo.solvers.base import solve

    start = time.perf_counter()
    q = random_block_qubo(14, seed=0)
    solve(q, 5, "enumerate", 3, seed=0, strategy="lexicographic")  # the fused kernel
    solve(q, 2, "enumerate", 3, seed=0, strategy="lexicographic")  # the generic kernel
    solve(q.with_constraints(max_removed_params=10**12), 5, "enumerate", 3, seed=0)  # side constraints
    solve(q, 5, "enumerate", 3, seed=0, strategy="relaxation")
    for heuristic in ("swap-sa", "swap-tabu"):
        solve(q, 5, heuristic, 3, seed=0, time_limit=5.0)
    return time.perf_counter() - start
