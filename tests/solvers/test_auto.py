"""solver="auto": the choice between the exact enumerator (its relaxation search for large spaces) and the swap
heuristics, and its record."""

from __future__ import annotations

import numpy as np
import pytest
from reference import brute_force_topk

import cbo.solvers.auto as auto
import cbo.solvers.enumerate.strategy as strategy
import cbo.solvers.heuristic as heuristic
from cbo import BlockQUBO, solve
from cbo.errors import SolverError
from cbo.qubo.instances import fisher_block_qubo, random_block_qubo
from cbo.solvers.base import Problem, SolverOutput
from cbo.solvers.heuristic import HEURISTIC_OPTIONS


def test_small_problem_is_enumerated_exactly_and_recorded():
    q = random_block_qubo(12, 0)
    _, E = brute_force_topk(q, 4, 10)
    res = solve(q, 4, k=10, seed=0)  # "auto" is the default
    assert res.solver.startswith("auto→enumerate")
    assert res.exact
    assert res.info["auto_choice"] in ("enumerate", "enumerate-gpu")
    assert "C(12,4)" in res.info["auto_reason"]
    np.testing.assert_allclose(res.energies, E, atol=1e-9)


def test_large_space_is_proven_by_the_relaxation_search():
    q = random_block_qubo(80, 0)
    res = solve(q, 32, "auto", k=5, seed=0)
    assert res.solver == "auto→enumerate" and res.exact
    assert res.info["auto_choice"] == "enumerate" and res.info["strategy"] == "relaxation"
    assert "relaxation branch and bound" in res.info["auto_reason"] and "finished" in res.info["auto_reason"]
    lex = solve(q, 32, "enumerate", k=5, strategy="lexicographic")
    np.testing.assert_allclose(res.energies, lex.energies, rtol=1e-12)


@pytest.mark.slow
def test_a_search_that_does_not_finish_in_the_budget_returns_its_and_the_heuristics_best():
    q = fisher_block_qubo(80, 0, samples=32)  # rank 32: not proven in minutes
    res = solve(q, 32, "auto", k=5, seed=0, budget=10.0)  # enough for the heuristic to finish its restarts
    assert not res.exact and res.solver == "auto→enumerate"
    assert "did not finish" in res.info["auto_reason"] and res.info["heuristic_seeds"] >= 5
    assert res.wall_time < 10.0 + 3.0
    for name, options in HEURISTIC_OPTIONS.items():  # never worse than either swap heuristic alone
        alone = solve(q, 32, name, k=5, seed=0, **options)
        assert np.all(res.energies <= alone.energies + 1e-12)


def test_beyond_the_relaxation_search_the_swap_heuristics_run(monkeypatch):
    monkeypatch.setattr(strategy, "RELAXATION_MAX_N", 50)
    q = random_block_qubo(80, 0)
    res = solve(q, 32, "auto", k=5, seed=0)
    assert res.solver == "auto→swap-sa+swap-tabu" and not res.exact
    assert res.info["auto_choice"] == auto.HEURISTIC
    assert "over the" in res.info["auto_reason"]
    # the heuristic's states are the merge of both swap solvers': at least as good as either alone
    for name, options in HEURISTIC_OPTIONS.items():
        alone = solve(q, 32, name, k=5, seed=0, **options)
        assert np.all(res.energies <= alone.energies + 1e-9)


def test_heuristic_shares_a_time_limit_between_both_swap_solvers(monkeypatch):
    monkeypatch.setattr(strategy, "RELAXATION_MAX_N", 50)
    real_run = heuristic.run_solver
    seen = []

    def recording_run(name, problem, **options):
        seen.append((name, problem.time_left()))
        return real_run(name, problem, **options)

    monkeypatch.setattr(heuristic, "run_solver", recording_run)
    res = solve(random_block_qubo(80, 0), 32, "auto", k=5, seed=0, time_limit=20.0)
    assert [name for name, _ in seen] == ["swap-sa", "swap-tabu"]
    assert seen[0][1] <= 10.0 + 1e-6 and seen[1][1] > 0  # half of the limit for the first, the rest for the second
    assert res.info["auto_choice"] == auto.HEURISTIC and "swap_tabu_info" in res.info


def test_time_limit_is_the_budget(monkeypatch):
    p = Problem(random_block_qubo(40, 0), 12, 5, 0, None)
    assert auto.plan_choice(p, budget=1e6)[0] == "relaxation"
    assert auto.plan_choice(p, budget=1e-3)[0] == "relaxation"  # it gets whatever budget there is
    monkeypatch.setattr(strategy, "RELAXATION_MAX_N", 30)
    assert auto.plan_choice(p, budget=1e6)[0] == "enumerate"
    assert auto.plan_choice(p, budget=1e-3)[0] in ("attempt", auto.HEURISTIC)


def test_gpu_preferred_when_usable_but_not_with_caps(monkeypatch):
    gpu = auto.get("enumerate-gpu")
    monkeypatch.setattr(gpu, "availability", classmethod(lambda cls: (True, "ok (fake)")))
    p = Problem(random_block_qubo(30, 0), 6, 5, 0, None)
    assert auto.plan_choice(p, budget=10.0)[0] == "enumerate-gpu"
    base = random_block_qubo(30, 0)
    capped = BlockQUBO(base.H, kinds=["a", "b"] * 15, caps={"a": 2})
    choice, reason, _ = auto.plan_choice(Problem(capped, 6, 5, 0, None), budget=10.0)
    assert choice == "enumerate"
    assert auto.plan_choice(p, budget=10.0, use_gpu=False)[0] == "enumerate"


def test_attempt_that_finishes_is_exact(monkeypatch):
    monkeypatch.setattr(auto, "CPU_RATE_PER_THREAD", 1.0)  # pretend full enumeration is slow
    q = random_block_qubo(14, 1)
    _, E = brute_force_topk(q, 5, 5)
    res = solve(q, 5, "auto", k=5, seed=0, budget=30.0)
    assert res.info["auto_choice"] == "enumerate" and res.exact
    assert "finished" in res.info["auto_reason"]
    np.testing.assert_allclose(res.energies, E, atol=1e-9)


def test_attempt_that_does_not_finish_falls_back_and_merges(monkeypatch):
    monkeypatch.setattr(auto, "CPU_RATE_PER_THREAD", 1.0)
    real_run = auto.run_solver

    def fake_run(name, problem, **options):
        out = real_run(name, problem, **options)
        if name == "enumerate":  # an enumerator stopped by the budget: one state, inexact
            return SolverOutput(out.candidates[:1], exact=False, info={"timed_out": True})
        return out

    monkeypatch.setattr(auto, "run_solver", fake_run)
    q = random_block_qubo(14, 2)
    _, E = brute_force_topk(q, 5, 5)
    res = solve(q, 5, "auto", k=5, seed=0, budget=30.0)
    assert res.info["auto_choice"] == auto.HEURISTIC and not res.exact
    assert "did not finish" in res.info["auto_reason"]
    assert res.info["enumerate_info"] == {"timed_out": True}
    np.testing.assert_allclose(res.energies, E, atol=1e-9)


def test_bad_budget():
    with pytest.raises(SolverError, match="budget"):
        solve(random_block_qubo(6, 0), 2, "auto", k=2, budget=0)
