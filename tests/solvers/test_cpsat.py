"""CP-SAT: proven top-K against brute force, constraints, precision and ties, time limits, errors."""

from __future__ import annotations

import numpy as np
import pytest
from reference import brute_force_topk

from cbo import BlockQUBO, solve
from cbo.errors import SolverError, SolverUnavailableError
from cbo.qubo.instances import random_block_qubo


@pytest.mark.parametrize("formulation", ["rlt", "minimal"])
@pytest.mark.parametrize("n,M,seed", [(9, 3, 0), (10, 5, 1), (11, 8, 2)])
def test_exact_top_k_matches_brute_force(formulation, n, M, seed):
    q = random_block_qubo(n, seed)
    X, E = brute_force_topk(q, M, 6)
    res = solve(q, M, "cpsat", k=6, seed=0, workers=1, formulation=formulation)
    assert res.exact is True and res.info["proven"]
    np.testing.assert_allclose(res.energies, E, atol=1e-9)
    assert {tuple(res.removed(i)) for i in range(6)} == {tuple(np.flatnonzero(x)) for x in X}
    assert res.info["energy_precision"] > 0


def test_keep_force_caps_and_budget_are_native():
    rng = np.random.default_rng(1)
    base = random_block_qubo(10, 3)
    q = BlockQUBO(
        base.H,
        kinds=["attention", "mlp"] * 5,
        sizes=rng.integers(1, 5, 10),
        caps={"mlp": 2},
        min_removed_params=6,
        keep=[0],
        force=[9],
    )
    _, E = brute_force_topk(q, 4, 5)
    res = solve(q, 4, "cpsat", k=5, seed=0, workers=1)
    assert res.exact
    assert q.feasible(res.states, 4).all()
    np.testing.assert_allclose(res.energies, E, atol=1e-9)


def test_fewer_feasible_states_than_k():
    q = random_block_qubo(5, 0)
    res = solve(q, 4, "cpsat", k=10, seed=0, workers=1)
    assert len(res) == 5 and res.exact
    assert "k=10 is more than the 5 ways to remove 4 of these 5 blocks" in res.info["k_capped"]


def test_ties_within_precision_are_reported():
    # blocks 0..3 identical: every state removing two of them has the same energy
    H = np.diag([1.0, 1.0, 1.0, 1.0, 5.0, 7.0])
    q = BlockQUBO(H)
    res = solve(q, 2, "cpsat", k=4, seed=0, workers=1)
    assert np.allclose(res.energies, 1.0)
    assert len(res.info["close_pairs"]) == 3
    assert all(p["energy_difference"] == 0 for p in res.info["close_pairs"])


def test_settling_past_k_proves_the_exact_order():
    q = random_block_qubo(9, 4)
    res = solve(q, 4, "cpsat", k=3, seed=0, workers=1, max_extra=5)
    assert res.info["settled"] is True
    _, E = brute_force_topk(q, 4, 3)
    np.testing.assert_allclose(res.energies, E, atol=1e-9)


def test_coarse_precision_is_stated():
    q = random_block_qubo(8, 2)
    res = solve(q, 3, "cpsat", k=3, seed=0, workers=1, precision=0.5)
    assert res.info["energy_precision"] == pytest.approx(0.5)
    assert res.info["scale"] == pytest.approx(0.5 * (3 + 3) / 0.5)


def test_time_limit_gives_best_so_far_marked_inexact():
    q = random_block_qubo(40, 0)
    res = solve(q, 12, "cpsat", k=5, seed=0, time_limit=1.0, workers=1)
    assert res.exact is False
    assert res.info["stop_reason"] == "time limit"
    assert q.feasible(res.states, 12).all() and len(res) >= 1


@pytest.mark.parametrize(
    "opts,match",
    [
        ({"formulation": "quadratic"}, "formulation"),
        ({"workers": 0}, "workers"),
        ({"precision": -1.0}, "precision"),
        ({"scale": 0.0}, "scale"),
        ({"max_extra": -1}, "max_extra"),
    ],
)
def test_bad_options(opts, match):
    with pytest.raises(SolverError, match=match):
        solve(random_block_qubo(6, 0), 2, "cpsat", k=2, seed=0, **opts)


def test_missing_ortools_names_the_extra(monkeypatch):
    import cbo.solvers.base as base
    from cbo.solvers.cpsat import CPSat

    monkeypatch.setattr(base, "has_module", lambda name: False)
    ok, reason = CPSat.availability()
    assert not ok and "cbo[cpsat]" in reason
    with pytest.raises(SolverUnavailableError, match=r"cbo\[cpsat\]"):
        solve(random_block_qubo(6, 0), 2, "cpsat", k=2)
