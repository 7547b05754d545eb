"""Depth proposers: the paper's rule, the CBO QUBO's choice against brute force, torch threads kept."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from tiny_models import build_tiny_model, random_token_windows

from cbo.errors import InfeasibleError, UnknownNameError
from cbo.pipeline.proposers import Antepenultimate, CBOProposer, depth_proposer


@pytest.fixture(scope="module")
def setup():
    model = build_tiny_model("llama", n_layers=6)
    return model, random_token_windows(model, n=4, seq_len=16, seed=1)


def test_antepenultimate_takes_the_layers_before_the_last_two(setup):
    model, calib = setup
    rule = Antepenultimate()
    assert rule(model, calib) == 3
    assert rule.layers(model, calib, 1) == [3] and rule.layers(model, calib, 3) == [1, 2, 3]
    assert rule.layers(model, calib, 0) == []
    with pytest.raises(InfeasibleError, match="cannot remove 4 of 6 layers"):
        rule.layers(model, calib, 4)


def _ground_state(model, calib, n: int, proposer: CBOProposer) -> list[int]:
    """The lowest-energy removal set of the proposer's KL QUBO with the first and last layer kept, by brute force."""
    from cbo.hessian import estimate_hessian

    qubo = estimate_hessian(
        model,
        None,
        calib,
        estimator=proposer.estimator,
        loss="kl",
        granularity="layer",
        batch_size=4,
        seed=proposer.seed,
    )
    best = None
    for removed in itertools.combinations(range(1, qubo.n - 1), n):
        x = np.zeros(qubo.n)
        x[list(removed)] = 1
        e = float(qubo.energy(x))
        if best is None or e < best[0]:
            best = (e, list(removed))
    return best[1]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_cbo_proposer_returns_the_qubo_ground_state(setup, n):
    model, calib = setup
    proposer = CBOProposer(solver="enumerate")
    expected = _ground_state(model, calib, n, proposer)
    assert proposer.layers(model, calib, n) == expected
    if n == 1:
        assert proposer(model, calib) == expected[0]


def test_cbo_proposer_restores_torch_threads(setup, monkeypatch):
    """A solve that changes the process-wide thread count (as numba's OpenMP layer can) is undone."""
    import cbo.solvers

    model, calib = setup
    real = cbo.solvers.solve

    def solve_that_changes_threads(*args, **kwargs):
        states = real(*args, **kwargs)
        torch.set_num_threads(torch.get_num_threads() + 1)
        return states

    monkeypatch.setattr(cbo.solvers, "solve", solve_that_changes_threads)
    threads = torch.get_num_threads()
    try:
        CBOProposer(solver="enumerate").layers(model, calib, 1)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(threads)


def test_depth_proposer_by_name(setup):
    model, _ = setup
    assert depth_proposer("none") is None
    assert isinstance(depth_proposer("antepenultimate"), Antepenultimate)
    cbo = depth_proposer("cbo", estimator="fisher", solver="swap-tabu", seed=3)
    assert (cbo.estimator, cbo.solver, cbo.seed, cbo.name) == ("fisher", "swap-tabu", 3, "cbo")
    with pytest.raises(UnknownNameError, match="unknown depth method 'first'"):
        depth_proposer("first")
    assert CBOProposer()(build_tiny_model("llama", n_layers=2), None) is None  # too shallow: no depth step
