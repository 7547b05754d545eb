"""Fixtures for solver tests; the helpers themselves live in ``reference.py`` (importable directly)."""

from __future__ import annotations

import pytest
from reference import all_feasible, brute_force_topk, make_constrained, make_instance


@pytest.fixture
def brute_force():
    """``brute_force(qubo, M, k)`` -> (states, energies) of the k best feasible states."""
    return brute_force_topk


@pytest.fixture
def feasible_states():
    """``feasible_states(qubo, M)`` -> every feasible state and its energy, sorted."""
    return all_feasible


@pytest.fixture
def instance():
    """Factory: ``instance(kind, n, seed, **constraints)`` -> BlockQUBO (kinds: reference.INSTANCE_KINDS)."""
    return make_instance


@pytest.fixture
def constrained_instance():
    """Factory: ``constrained_instance(n, seed)`` -> BlockQUBO with keep/force/caps/budget."""
    return make_constrained
