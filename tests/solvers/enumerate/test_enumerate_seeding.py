"""Seeding the exact search: given states set the starting threshold and join the result, never cut it."""

from __future__ import annotations

import numpy as np
import pytest
from reference import brute_force_topk, make_constrained, make_instance

from cbo import solve
from cbo.solvers.base import Problem
from cbo.solvers.enumerate import SearchOptions, enumerate_tasks, merge_task_results, plan_enumeration
from cbo.solvers.enumerate.seeding import Seeds, merge_seeds, seeds_from_positions


def _solve_plan(plan):
    res = enumerate_tasks(plan, threads=1)
    return merge_task_results(plan, [res]), res


@pytest.mark.parametrize("kind", ["block", "negative", "integer"])
def test_given_states_seed_the_threshold_and_the_result_stays_exact(kind):
    q = make_instance(kind, 14, 3, force=[2])
    M, k = 6, 8
    X, E = brute_force_topk(q, M, 40)
    problem = Problem(q, M, k, 0, None)
    # seeds: the true 5th..12th best states (K of them: their K-th energy bounds the true K-th best)
    plan = plan_enumeration(problem, SearchOptions(seed_heuristic=False), seeds=X[4:12])
    assert plan.info["given_seeds"] == 8
    assert plan.cap == pytest.approx(E[11] - problem.const + plan.slack, abs=1e-9)
    (energies, positions), _ = _solve_plan(plan)
    np.testing.assert_allclose(np.sort(q.energy(plan.states(positions))), E[:k], rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(energies + plan.const, q.energy(plan.states(positions)), rtol=1e-9, atol=1e-9)


def test_seeds_tighten_the_search():
    q = make_instance("block", 24, 1)
    M, k = 8, 10
    problem = Problem(q, M, k, 0, None)
    settings = SearchOptions(seed_heuristic=False, tail=0, relaxation=False)  # the per-row bound alone
    plain_plan = plan_enumeration(problem, settings)
    (plain_energies, plain_positions), plain = _solve_plan(plain_plan)
    plan = plan_enumeration(problem, settings, seeds=plain_plan.states(plain_positions))
    (energies, _), seeded = _solve_plan(plan)
    np.testing.assert_allclose(energies, plain_energies, rtol=1e-12, atol=1e-12)
    assert seeded.states < plain.states  # the threshold starts at the true K-th best


def test_infeasible_and_repeated_given_states_are_ignored():
    q = make_constrained(12, 2)
    M, k = 5, 4
    X, E = brute_force_topk(q, M, k)
    problem = Problem(q, M, k, 0, None)
    bad = np.zeros((3, q.n), dtype=np.uint8)
    bad[:, :M] = 1  # removes a kept block (block 0)
    plan = plan_enumeration(problem, seeds=np.concatenate([bad, X[:1], X[:1]]))
    assert plan.info["given_seeds"] == 1
    (energies, _), _ = _solve_plan(plan)
    np.testing.assert_allclose(energies + plan.const, E, rtol=1e-12, atol=1e-9)


def test_seeds_from_a_heuristic_solver():
    q = make_instance("negative", 15, 4)
    heuristic = solve(q, 6, "swap-tabu", k=10, seed=0)
    problem = Problem(q, 6, 10, 0, None)
    plan = plan_enumeration(problem, seeds=heuristic.states)
    (energies, positions), _ = _solve_plan(plan)
    exact = solve(q, 6, "enumerate", k=10)
    np.testing.assert_allclose(np.sort(q.energy(plan.states(positions))), exact.energies, rtol=1e-12)


def test_seed_energies_and_threshold_by_hand():
    Q = np.array([[1.0, 2.0, 0.0], [2.0, 3.0, -1.0], [0.0, -1.0, 5.0]])
    s = seeds_from_positions(Q, np.array([[1, 2], [0, 1], [1, 0], [0, 2]]), K=2)
    # {0,1}: 1 + 3 + 2 = 6, {0,2}: 1 + 5 + 0 = 6, {1,2}: 3 + 5 - 1 = 7; {1,0} repeats {0,1}
    np.testing.assert_allclose(s.energies, [6.0, 6.0])
    assert s.threshold == 6.0 and s.positions.tolist() == [[0, 1], [0, 2]]
    assert seeds_from_positions(Q, np.array([[1, 2]]), K=2).threshold == np.inf
    # merging seeds built for the same K: the K best distinct states and the threshold they prove
    one = seeds_from_positions(Q, np.array([[1, 2]]), K=3)
    two = seeds_from_positions(Q, np.array([[0, 1], [0, 2]]), K=3)
    assert one.threshold == two.threshold == np.inf
    merged = merge_seeds(one, two, K=3)
    assert merged.energies.tolist() == [6.0, 6.0, 7.0] and merged.threshold == 7.0
    assert merged.positions.tolist() == [[0, 1], [0, 2], [1, 2]]
    alone = merge_seeds(Seeds.empty(2), two, K=3)
    assert alone.energies.tolist() == [6.0, 6.0] and alone.threshold == np.inf
