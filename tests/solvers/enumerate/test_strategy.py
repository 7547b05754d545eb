"""The enumerator's two strategies: the choice, the relaxation search under every constraint against brute force,
threads, warm starts, seeding by the heuristic, and a time-limited run never worse than ``auto``."""

from __future__ import annotations

import numpy as np
import pytest
from reference import brute_force_topk, make_constrained, make_instance

import cbo.solvers.enumerate.strategy as strategy
from cbo import BlockQUBO, solve
from cbo.errors import InfeasibleError, SolverError
from cbo.qubo.instances import fisher_block_qubo, random_block_qubo
from cbo.solvers.base import Problem
from cbo.solvers.constraints import FreeConstraints
from cbo.solvers.enumerate.relaxation_search import search_top_k
from cbo.solvers.heuristic import HEURISTIC_OPTIONS


def _relaxed(q, M, k, **options):
    return solve(q, M, "enumerate", k=k, strategy="relaxation", **options)


def test_the_choice_follows_the_size_of_the_space(monkeypatch):
    small = Problem(random_block_qubo(30, 0), 15, 10, 0, None)  # C(30, 15) = 1.6e8
    large = Problem(random_block_qubo(60, 0), 16, 10, 0, None)
    assert strategy.choose_strategy(small)[0] == "lexicographic"
    assert strategy.choose_strategy(large)[0] == "relaxation"
    assert strategy.choose_strategy(large, bound=False)[0] == "lexicographic"
    assert strategy.choose_strategy(small, "relaxation") == ("relaxation", "strategy='relaxation' was asked for")
    monkeypatch.setattr(strategy, "RELAXATION_MAX_N", 50)
    assert strategy.choose_strategy(large)[0] == "lexicographic"
    res = solve(random_block_qubo(60, 0), 16, "enumerate", k=3)
    assert (
        res.info["strategy"] == "lexicographic"
        and "more than the relaxation search takes" in res.info["strategy_reason"]
    )


def test_results_say_which_strategy_ran():
    q = random_block_qubo(40, 2)
    lex = solve(q, 12, "enumerate", k=5, strategy="lexicographic")
    rel = solve(q, 12, "enumerate", k=5)
    assert lex.info["strategy"] == "lexicographic" and rel.info["strategy"] == "relaxation"
    assert lex.exact and rel.exact
    np.testing.assert_allclose(lex.energies, rel.energies, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "options,match",
    [
        ({"strategy": "fastest"}, "strategy"),
        ({"strategy": "relaxation", "bound": False}, "bound=False"),
        ({"alpha": 0}, "alpha"),
        ({"alpha": "big"}, "alpha"),
    ],
)
def test_bad_strategy_options(options, match):
    with pytest.raises(SolverError, match=match):
        solve(random_block_qubo(8, 0), 3, "enumerate", **options)


@pytest.mark.parametrize("seed", range(3))
def test_relaxation_with_keep_force_caps_and_budget_equals_brute_force(seed):
    for n in (11, 14):
        q = make_constrained(n, seed)
        for M in range(2, n - 2):
            try:
                q.check_remove(M)
            except InfeasibleError:
                continue
            X, E = brute_force_topk(q, M, 6)
            if not len(E):
                with pytest.raises(SolverError, match="no feasible state"):
                    _relaxed(q, M, 6)
                continue
            res = _relaxed(q, M, 6)
            assert res.exact and res.info["strategy"] == "relaxation"
            np.testing.assert_allclose(res.energies, E, rtol=1e-9, atol=1e-9)
            assert np.all(q.feasible(res.states, M))


@pytest.mark.parametrize("kind", ["block", "integer", "negative", "heavy_ends"])
def test_relaxation_caps_on_both_kinds_and_a_minimum_budget(kind):
    base = make_instance(kind, 13, 4)
    kinds = ["attention", "mlp"] * 6 + ["attention"]
    sizes = np.arange(1, 14)
    q = BlockQUBO(base.H, base.g, kinds=kinds, sizes=sizes, caps={"attention": 3, "mlp": 4}, min_removed_params=30)
    for M in (3, 5, 7):
        _, E = brute_force_topk(q, M, 5)
        res = _relaxed(q, M, 5)
        np.testing.assert_allclose(res.energies, E, rtol=1e-9, atol=1e-9)


def test_search_top_k_drops_seed_states_that_break_the_constraints():
    q = make_constrained(12, 1)
    problem = Problem(q, 5, 4, 0, None)
    fc = FreeConstraints.from_problem(problem)
    rng = np.random.default_rng(0)
    seeds = np.zeros((30, problem.n_free), dtype=np.uint8)
    for row in seeds:
        row[rng.choice(problem.n_free, problem.r, replace=False)] = 1
    res = search_top_k(problem.Q, problem.r, 4, constraints=fc, seed_states=seeds)
    assert res.info["seeded"] == int(fc.ok(seeds).sum()) < 30
    _, E = brute_force_topk(q, 5, 4)
    np.testing.assert_allclose(res.energies + problem.const, E, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("threads", [2, 3])
def test_threads_split_the_tree_and_agree_with_one_and_brute_force(threads):
    for q, M, k in ((fisher_block_qubo(16, 1, samples=6), 6, 9), (make_constrained(14, 0), 6, 5)):
        problem = Problem(q, M, k, 0, None)
        fc = FreeConstraints.from_problem(problem) if problem.has_side_constraints else None
        _, E = brute_force_topk(q, M, k)
        runs = [
            search_top_k(problem.Q, problem.r, k, constraints=fc, alpha=0.05, race_nodes=50, threads=t)
            for t in (1, threads)
        ]
        assert runs[1].info["subtrees"] > 1 and runs[1].info["threads"] == threads
        for res in runs:
            assert res.exact
            np.testing.assert_allclose(res.energies + problem.const, E, rtol=1e-9, atol=1e-9)
    q = fisher_block_qubo(40, 3, samples=12)
    one, many = (_relaxed(q, 14, 8, threads=t, alpha=0.05) for t in (1, 2))
    assert one.exact and many.exact and many.info["threads"] == 2
    np.testing.assert_allclose(one.energies, many.energies, rtol=1e-12, atol=1e-12)


def test_relaxation_warm_start():
    q = make_instance("negative", 15, 2, force=[3])
    _, E = brute_force_topk(q, 6, 10)
    res = _relaxed(q, 6, 10, warm_start=float(E[4]))
    assert res.exact
    np.testing.assert_allclose(res.energies, E[E <= E[4] + 1e-12], rtol=1e-12)


def test_a_search_that_runs_long_is_seeded_by_the_heuristic(monkeypatch):
    q = fisher_block_qubo(60, 0, samples=16)
    res = solve(q, 20, "enumerate", k=10, seed=0, time_limit=30.0)
    assert res.info["heuristic_seeds"] >= 10
    assert "heuristic_info" in res.info
    off = solve(q, 20, "enumerate", k=10, seed=0, seed_heuristic=False, time_limit=30.0)
    assert off.info["heuristic_seeds"] is None
    if res.exact and off.exact:
        np.testing.assert_allclose(res.energies, off.energies, rtol=1e-12)


@pytest.mark.slow
def test_a_time_limited_enumerate_is_never_worse_than_auto_or_its_heuristic(monkeypatch):
    """On an instance nothing proves in seconds (80 blocks, 32 samples: rank 32). With one thread the search
    visits its nodes in a fixed order, so a longer time limit than auto's budget can only add states."""
    numba = pytest.importorskip("numba")
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        q = fisher_block_qubo(80, 0, samples=32)
        M, k = 32, 10
        auto = solve(q, M, "auto", k=k, seed=0, budget=5.0)
        exact = solve(q, M, "enumerate", k=k, seed=0, time_limit=10.0)
    finally:
        numba.set_num_threads(threads)
    assert not exact.exact and exact.info["timed_out"] and exact.info["heuristic_seeds"] >= k
    assert len(exact) == k == len(auto)
    assert np.all(exact.energies <= auto.energies + 1e-12)
    # and never worse than the states of auto's heuristic alone (what auto returned before)
    alone = [solve(q, M, name, k=k, seed=0, **o).energies for name, o in HEURISTIC_OPTIONS.items()]
    merged = np.sort(np.unique(np.concatenate(alone)))[:k]
    assert np.all(exact.energies <= merged + 1e-12)


def test_relaxation_stops_on_the_problems_stop_event():
    q = fisher_block_qubo(80, 0, samples=32)
    problem = Problem(q, 32, 5, 0, None)
    calls = []

    def stop() -> bool:
        calls.append(1)
        if len(calls) > 20:
            problem.stop.set()
        return problem.interrupted

    res = search_top_k(problem.Q, problem.r, 5, alpha=0.1, stop=stop)
    assert not res.exact and res.info["interrupted"] and len(res.energies) == 5
    assert problem.time_left() == 0.0
