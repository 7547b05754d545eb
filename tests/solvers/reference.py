"""Brute-force reference for solver tests: every state with Σx = M, filtered and sorted.

Import it from solver tests as ``from reference import brute_force_topk`` (``tests/solvers`` is on
``sys.path`` through its conftest), or use the ``brute_force`` fixture.
"""

from __future__ import annotations

import itertools

import numpy as np

from cbo.qubo import BlockQUBO


def all_feasible(qubo: BlockQUBO, M: int) -> tuple[np.ndarray, np.ndarray]:
    """Every feasible state with exactly M removed, sorted by energy: (states (B, N) uint8, energies)."""
    n = qubo.n
    combos = list(itertools.combinations(range(n), M))
    X = np.zeros((len(combos), n), dtype=np.uint8)
    for row, removed in enumerate(combos):
        X[row, list(removed)] = 1
    X = X[qubo.feasible(X, M)] if len(X) else X
    E = np.asarray(qubo.energy(X), dtype=np.float64) if len(X) else np.zeros(0)
    order = np.argsort(E, kind="stable")
    return X[order], E[order]


def brute_force_topk(qubo: BlockQUBO, M: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k lowest-energy feasible states with exactly M removed (ties in any order)."""
    X, E = all_feasible(qubo, M)
    return X[:k], E[:k]
