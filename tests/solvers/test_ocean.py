"""dwave-samplers SA/tabu and generic dimod samplers: penalties, feasibility filtering, errors."""

from __future__ import annotations

import dimod
import numpy as np
import pytest
from dwave.samplers import SimulatedAnnealingSampler
from reference import brute_force_topk

from cbo import BlockQUBO, solve
from cbo.errors import SolverError
from cbo.qubo.instances import random_block_qubo
from cbo.solvers.base import Problem
from cbo.solvers.penalty import penalty_bqm, reduced_safe_penalty


@pytest.mark.parametrize("solver", ["sa", "tabu"])
@pytest.mark.parametrize("n,M,seed", [(12, 4, 0), (16, 8, 1), (16, 3, 2)])
def test_default_settings_find_brute_force_ground_state(solver, n, M, seed):
    q = random_block_qubo(n, seed)
    _, E = brute_force_topk(q, M, 1)
    res = solve(q, M, solver, k=5, seed=seed)
    assert res.energies[0] == pytest.approx(E[0], abs=1e-9)
    assert q.feasible(res.states, M).all()
    assert 0 < res.info["feasible_fraction"] <= 1
    assert res.info["num_reads"] > 0


def test_penalty_bqm_is_the_energy_on_feasible_states_with_keep_force_fixed():
    q = random_block_qubo(10, 3).with_constraints(keep=[0], force=[9])
    p = Problem(q, 4, 5, 0, None)
    lam = reduced_safe_penalty(p)
    assert lam <= q.safe_penalty() + 1e-12
    bqm = penalty_bqm(p, lam)
    assert set(bqm.variables) == {q.names[i] for i in range(1, 9)}
    rng = np.random.default_rng(0)
    for _ in range(20):
        removed = rng.choice(np.arange(1, 9), 3, replace=False)
        x = np.zeros(10, dtype=np.uint8)
        x[removed] = 1
        x[9] = 1
        sample = {q.names[i]: int(x[i]) for i in range(1, 9)}
        assert bqm.energy(sample) == pytest.approx(q.energy(x), abs=1e-9)
        # one block too many costs exactly λ more than the energy
        extra = int(rng.choice([i for i in range(1, 9) if not x[i]]))
        y = x.copy()
        y[extra] = 1
        sample[q.names[extra]] = 1
        assert bqm.energy(sample) == pytest.approx(q.energy(y) + lam, abs=1e-9)


def test_adaptive_penalty_searches_downward_and_records_the_path():
    q = random_block_qubo(20, 0)
    res = solve(q, 6, "sa", k=10, seed=0, num_reads=30, num_sweeps=300)
    path = res.info["penalty_path"]
    assert len(path) >= 2
    lams = [p["penalty"] for p in path]
    assert lams[0] == pytest.approx(res.info["safe_penalty"])
    assert all(b == pytest.approx(a / 2) for a, b in zip(lams, lams[1:]))
    # every round but the last kept enough feasible samples to go on
    assert all(p["feasible_fraction"] >= 0.05 for p in path[:-1])
    assert res.info["penalty"] in lams
    assert res.info["sweeps"] == 300


@pytest.mark.parametrize("penalty", ["safe", 5.0])
def test_fixed_penalties(penalty):
    q = random_block_qubo(12, 1)
    res = solve(q, 4, "sa", k=5, seed=1, penalty=penalty, num_reads=20, num_sweeps=200)
    assert len(res.info["penalty_path"]) == 1
    assert res.info["penalty"] == pytest.approx(res.info["safe_penalty"] if penalty == "safe" else 5.0)


@pytest.mark.parametrize("penalty", ["big", -1.0, 0, True])
def test_bad_penalty(penalty):
    with pytest.raises(SolverError, match="penalty"):
        solve(random_block_qubo(8, 0), 3, "sa", k=2, seed=0, penalty=penalty)


def test_no_feasible_sample_says_so_and_suggests_a_penalty():
    q = random_block_qubo(16, 0)
    # a negligible penalty: the sampler removes whatever lowers the energy, never exactly M
    with pytest.raises(SolverError, match=r"no feasible state.*raise the penalty"):
        solve(q, 8, "sa", k=3, seed=0, penalty=1e-9, num_reads=10, num_sweeps=100)


@pytest.mark.parametrize("solver", ["sa", "tabu"])
def test_seeds_reproduce(solver):
    q = random_block_qubo(18, 2)
    a = solve(q, 6, solver, k=5, seed=7)
    b = solve(q, 6, solver, k=5, seed=7)
    np.testing.assert_array_equal(a.states, b.states)


def test_keep_force_and_caps_are_respected():
    base = random_block_qubo(12, 5)
    kinds = ["attention", "mlp"] * 6
    q = BlockQUBO(base.H, kinds=kinds, caps={"attention": 1}, keep=[0], force=[11])
    res = solve(q, 4, "sa", k=10, seed=0)
    assert q.feasible(res.states, 4).all()
    _, E = brute_force_topk(q, 4, 1)
    assert res.energies[0] == pytest.approx(E[0], abs=1e-9)


def test_any_dimod_sampler_instance():
    q = random_block_qubo(10, 4)
    res = solve(q, 3, SimulatedAnnealingSampler(), k=5, seed=3, num_reads=50)
    assert res.solver == "dimod:SimulatedAnnealingSampler"
    _, E = brute_force_topk(q, 3, 1)
    assert res.energies[0] == pytest.approx(E[0], abs=1e-9)
    # the exact solver of dimod takes no seed or num_reads: neither is passed
    ex = solve(q, 3, dimod.ExactSolver(), k=5)
    _, E5 = brute_force_topk(q, 3, 5)
    np.testing.assert_allclose(ex.energies, E5, atol=1e-9)
    by_name = solve(q, 3, "dimod", k=2, seed=0, sampler="dwave.samplers.SimulatedAnnealingSampler")
    assert by_name.energies[0] == pytest.approx(E[0], abs=1e-9)


class _ZeroSampler(dimod.Sampler):
    """Returns the all-zeros state: never feasible for M > 0."""

    parameters: dict = {}
    properties: dict = {}

    def sample(self, bqm, **kwargs):
        return dimod.SampleSet.from_samples_bqm({v: 0 for v in bqm.variables}, bqm)


def test_sampler_without_feasible_samples_raises_with_hint():
    with pytest.raises(SolverError, match="exactly M=2 blocks"):
        solve(random_block_qubo(6, 0), 2, _ZeroSampler(), k=2)


def test_dimod_needs_a_sampler():
    with pytest.raises(SolverError, match="needs a sampler"):
        solve(random_block_qubo(6, 0), 2, "dimod", k=2)
    with pytest.raises(SolverError, match="cannot build a sampler"):
        solve(random_block_qubo(6, 0), 2, "dimod", k=2, sampler="no.such.Sampler")


def test_aliases():
    q = random_block_qubo(8, 0)
    assert solve(q, 2, "neal", k=1, seed=0, num_reads=10, num_sweeps=100).solver == "sa"
    assert solve(q, 2, "dwave-tabu", k=1, seed=0, num_reads=2).solver == "tabu"
