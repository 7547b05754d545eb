"""The shared solver battery: every registered solver that is usable here, tested the day it registers.

Modelled on dimod's ``load_sampler_bqm_tests(sampler, max_num_variables=...)``: the battery, not the
solver, owns the sizes and settings it tests with. It parametrizes over ``cbo.solvers.available()`` and
runs each usable solver through the same checks: result shape (a ``RankedStates`` of at most k distinct
states, sorted, with energies that equal ``qubo.energy``), feasibility including keep/force, a problem
with nothing left to choose, reproducible seeds, bad input (an unknown option raises ``SolverError``,
M out of range raises ``InfeasibleError``), exact solvers reproduce the brute-force top-K, and heuristics
find the brute-force ground state of small instances.

:data:`SETTINGS` gives a solver the options the battery passes on every call (for a solver that needs
one, like the ``dimod`` wrapper's ``sampler``, or whose defaults are too slow for a unit test) and the
largest instance it is given (QAOA simulates 2^n amplitudes). A registered solver missing from the
table runs with :data:`DEFAULT`. Solvers that are registered but not usable here (a missing extra, no
GPU) are reported as skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from reference import brute_force_topk, make_instance

from cbo import RankedStates, solve
from cbo.errors import InfeasibleError, SolverError
from cbo.qubo.instances import random_block_qubo
from cbo.solvers import available, get, names


@dataclass(frozen=True)
class Settings:
    """How the battery runs one solver: options passed on every call, and the largest instance."""

    options: dict[str, Any] = field(default_factory=dict)
    max_n: int = 16


DEFAULT = Settings()
SETTINGS: dict[str, Settings] = {
    "sa": Settings({"num_reads": 50, "num_sweeps": 500}),
    "tabu": Settings({"num_reads": 10}),
    "dimod": Settings({"sampler": "dwave.samplers.SimulatedAnnealingSampler"}, max_n=12),
    "cpsat": Settings({"workers": 1}, max_n=12),
    "qaoa": Settings({"shots": 2048, "maxiter": 30}, max_n=8),
    "enumerate-gpu": Settings(max_n=20),
}


def _all_solvers() -> list:
    params = []
    for name, avail in available().items():
        marks = [] if avail.ok else [pytest.mark.skip(reason=f"{name} unavailable: {avail.reason}")]
        params.append(pytest.param(name, marks=marks, id=name))
    return params


SOLVERS = _all_solvers()


def _settings(name: str) -> Settings:
    return SETTINGS.get(name, DEFAULT)


def _size(name: str, want: int) -> int:
    return max(4, min(want, _settings(name).max_n))


def _run(name, q, M, k=5, seed=0, **extra):
    return solve(q, M, name, k=k, seed=seed, **{**_settings(name).options, **extra})


def test_the_table_names_registered_solvers():
    assert set(SETTINGS) <= set(names()), sorted(set(SETTINGS) - set(names()))
    for name, settings in SETTINGS.items():
        get(name).make_options(settings.options)  # the battery's options are valid for that solver


@pytest.mark.parametrize("name", SOLVERS)
def test_result_shape_and_exact_energies(name):
    n = _size(name, 10)
    q = random_block_qubo(n, 1)
    M = n // 3
    res = _run(name, q, M, k=5)
    assert isinstance(res, RankedStates)
    assert 1 <= len(res) <= 5
    assert res.states.shape == (len(res), n)
    assert res.states.dtype == np.uint8
    assert np.all(np.diff(res.energies) >= 0)
    np.testing.assert_allclose(res.energies, q.energy(res.states), rtol=1e-12, atol=1e-12)
    assert np.all(res.states.sum(1) == M)
    assert np.all(q.feasible(res.states, M))
    assert len({tuple(s) for s in res.states}) == len(res)
    assert isinstance(res.exact, bool)
    assert res.wall_time >= 0


@pytest.mark.parametrize("name", SOLVERS)
def test_keep_and_force_are_respected(name):
    n = _size(name, 10)
    q = make_instance("negative", n, 2, keep=[0, n - 1], force=[1])
    M = max(2, n // 3)
    res = _run(name, q, M, k=4)
    assert len(res) >= 1
    assert not res.states[:, [0, n - 1]].any()
    assert res.states[:, 1].all()
    assert np.all(q.feasible(res.states, M))


@pytest.mark.parametrize("name", SOLVERS)
def test_nothing_left_to_choose(name):
    # every block is kept or forced: the one feasible state is the answer
    n = _size(name, 6)
    q = make_instance("block", n, 4, keep=list(range(0, n, 2)), force=list(range(1, n, 2)))
    res = _run(name, q, n // 2, k=3)
    assert len(res) == 1
    assert res.removed(0) == list(range(1, n, 2))
    np.testing.assert_allclose(res.energies, q.energy(res.states), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", SOLVERS)
def test_same_seed_same_result(name):
    n = _size(name, 10)
    q = random_block_qubo(n, 3)
    M = n // 2
    a = _run(name, q, M, k=4, seed=7)
    b = _run(name, q, M, k=4, seed=7)
    np.testing.assert_array_equal(a.states, b.states)
    np.testing.assert_array_equal(a.energies, b.energies)


@pytest.mark.parametrize("name", SOLVERS)
def test_unknown_option_is_refused(name):
    q = random_block_qubo(_size(name, 6), 0)
    with pytest.raises(SolverError, match="no option"):
        _run(name, q, 2, definitely_not_an_option=1)


@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("bad_M", [-1, "n+1", "n-keep+1"])
def test_remove_out_of_range(name, bad_M):
    n = _size(name, 6)
    q = random_block_qubo(n, 0).with_constraints(keep=[0])
    M = {-1: -1, "n+1": n + 1, "n-keep+1": n}[bad_M]
    with pytest.raises(InfeasibleError):
        _run(name, q, M)


@pytest.mark.parametrize("name", SOLVERS)
def test_exact_solvers_reproduce_brute_force(name):
    if not get(name).exact:
        pytest.skip(f"{name} is a heuristic")
    n = _size(name, 12)
    for kind, seed in (("block", 0), ("integer", 1), ("negative", 2)):
        q = make_instance(kind, n, seed)
        for M in sorted({1, n // 3, n // 2, n - 2}):
            _, E = brute_force_topk(q, M, 6)
            res = _run(name, q, M, k=6)
            assert res.exact, f"{name} did not prove its result for {kind} M={M}"
            np.testing.assert_allclose(res.energies, E, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", SOLVERS)
def test_heuristics_find_the_ground_state(name):
    if get(name).exact:
        pytest.skip(f"{name} is exact (checked against the full top-K)")
    n = _size(name, 12)
    for seed, M in ((0, n // 3), (1, n // 2)):
        q = random_block_qubo(n, seed)
        _, E = brute_force_topk(q, M, 1)
        res = _run(name, q, M, k=3, seed=seed)
        assert res.energies[0] == pytest.approx(E[0], rel=1e-9, abs=1e-9), f"{name} missed the ground state"


@pytest.mark.parametrize("name", SOLVERS)
def test_keep_and_force_as_one_block_index_or_name(name):
    n = _size(name, 8)
    q = random_block_qubo(n, 5)
    by_index = _run(name, q, 2, k=3, keep=1, force=n - 1)
    by_name = _run(name, q, 2, k=3, keep=q.names[1], force=q.names[n - 1])
    for res in (by_index, by_name):
        assert not res.states[:, 1].any() and res.states[:, n - 1].all()
    with pytest.raises(SolverError, match="keep must be a block index"):
        _run(name, q, 2, keep=1.5)
