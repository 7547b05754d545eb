"""Exact CPU enumeration (the lexicographic strategy, which ``auto`` takes for spaces this small): every top-K
against itertools brute force, constraints, threads, limits."""

from __future__ import annotations

import itertools
import math
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import INSTANCE_KINDS, all_feasible, brute_force_topk, make_constrained, make_instance

import cbo.solvers.enumerate.plan as en_plan
from cbo import BlockQUBO, solve
from cbo.errors import InfeasibleError, SolverError
from cbo.qubo.instances import random_block_qubo
from cbo.solvers.base import Problem
from cbo.solvers.enumerate import EnumerateSolver, enumerate_tasks, merge_task_results, plan_enumeration
from cbo.solvers.enumerate.bounds import relax_bound, relaxation_shift
from cbo.solvers.enumerate.seeding import seed_threshold


def _check_against_reference(q, M, k, res):
    """Same energies as brute force, every state feasible, energies exact and sorted."""
    _, E = brute_force_topk(q, M, k)
    assert len(res) == len(E)
    np.testing.assert_allclose(res.energies, E, rtol=1e-9, atol=1e-9)
    assert np.all(q.feasible(res.states, M))
    np.testing.assert_allclose(res.energies, q.energy(res.states), rtol=1e-12, atol=1e-12)
    assert np.all(np.diff(res.energies) >= 0)
    assert len({tuple(s) for s in res.states}) == len(res)


@pytest.mark.parametrize("kind", INSTANCE_KINDS)
@pytest.mark.parametrize("n,seed", [(9, 0), (12, 1), (14, 2)])
@pytest.mark.parametrize("tail", [0, 6, 16])
def test_all_M_match_brute_force(kind, n, seed, tail):
    # tail=0: the fused kernels alone; 6: fused above, flat tail below; 16: the flat tail alone
    q = make_instance(kind, n, seed)
    for M in range(n + 1):
        res = solve(q, M, "enumerate", k=7, tail=tail)
        assert res.exact
        _check_against_reference(q, M, 7, res)


@pytest.mark.parametrize("n,seed,k", [(16, 3, 10), (16, 4, 1), (15, 5, 25)])
def test_sixteen_blocks_all_M(n, seed, k):
    q = make_instance("block", n, seed)
    for M in range(n + 1):
        _check_against_reference(q, M, k, solve(q, M, "enumerate", k=k))


@pytest.mark.parametrize("seed", range(4))
def test_ties_integer_energies(seed):
    # integer couplings: many equal energies straddle the K-th place; the energies must still match
    q = make_instance("integer", 13, seed)
    for M in (3, 6, 9):
        for k in (1, 4, 11):
            _check_against_reference(q, M, k, solve(q, M, "enumerate", k=k))


@pytest.mark.parametrize("n,seed", [(10, 0), (12, 1), (13, 2), (14, 3)])
def test_keep_force_caps_budget(n, seed):
    q = make_constrained(n, seed)
    for M in range(n + 1):
        try:
            q.check_remove(M)
        except InfeasibleError:
            with pytest.raises(InfeasibleError):
                solve(q, M, "enumerate", k=5)
            continue
        _, E = brute_force_topk(q, M, 5)
        if not len(E):  # caps and budget together exclude every state; solve() says so
            with pytest.raises(SolverError, match="no feasible state"):
                solve(q, M, "enumerate", k=5)
            continue
        res = solve(q, M, "enumerate", k=5)
        assert res.exact
        _check_against_reference(q, M, 5, res)
        assert not res.states[:, 0].any()  # keep
        assert res.states[:, list(q.constraints.force)].all()  # force


@pytest.mark.parametrize("kind", ["block", "negative"])
def test_keep_and_force_only(kind):
    q = make_instance(kind, 13, 7, keep=[0, 12], force=[5, 6])
    for M in range(2, 12):
        res = solve(q, M, "enumerate", k=6)
        _check_against_reference(q, M, 6, res)


def test_budget_minimum_and_caps_on_both_kinds():
    q = random_block_qubo(12, 3)
    sizes = np.arange(1, 13)
    q2 = BlockQUBO(
        q.H,
        q.g,
        kinds=["a", "b", "c"] * 4,
        sizes=sizes,
        caps={"a": 2, "b": 1},
        min_removed_params=20,
        max_removed_params=40,
    )
    for M in range(1, 9):
        try:
            q2.check_remove(M)
        except InfeasibleError:
            continue
        _, E = brute_force_topk(q2, M, 6)
        if not len(E):
            continue
        _check_against_reference(q2, M, 6, solve(q2, M, "enumerate", k=6))


def test_m_zero_and_all_free_blocks():
    q = make_instance("block", 10, 0, keep=[3])
    r0 = solve(q, 0, "enumerate", k=5)
    assert len(r0) == 1 and r0.exact and not r0.states.any()
    rall = solve(q, 9, "enumerate", k=5)
    assert len(rall) == 1 and rall.removed(0) == [i for i in range(10) if i != 3]


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5])
def test_k_larger_than_the_number_of_states(M):
    q = make_instance("negative", 8, 1)
    res = solve(q, M, "enumerate", k=500)
    assert len(res) == math.comb(8, M)
    _check_against_reference(q, M, 500, res)


@pytest.mark.parametrize(
    "options",
    [{"bound": False}, {"order": "natural"}, {"seed_heuristic": False}, {"tail": 0, "bound": False}, {"tail": 9}],
)
def test_settings_do_not_change_the_answer(options):
    q = make_instance("block", 16, 11)
    for M in (3, 5, 8, 12):
        res = solve(q, M, "enumerate", k=9, **options)
        _check_against_reference(q, M, 9, res)


@pytest.mark.parametrize("task_depth", [0, 1, 3])
def test_task_depth(task_depth):
    q = make_instance("negative", 14, 2)
    for M in (4, 7):
        res = solve(q, M, "enumerate", k=8, task_depth=task_depth)
        assert res.info["task_depth"] == min(task_depth, M - 4)
        _check_against_reference(q, M, 8, res)


def test_generic_kernel_without_side_constraints(monkeypatch):
    # large n falls back to the generic kernel; force it on a small instance
    monkeypatch.setattr(en_plan, "MAX_PAIR_TABLE", 0)
    q = make_instance("block", 13, 4)
    for M in (3, 6, 10):
        res = solve(q, M, "enumerate", k=6)
        assert res.info["kernel"] == "generic"
        _check_against_reference(q, M, 6, res)


def test_bound_switched_off_when_its_table_is_too_large(monkeypatch):
    monkeypatch.setattr(en_plan, "MAX_BOUND_TABLE", 0)
    q = make_instance("block", 12, 5)
    res = solve(q, 6, "enumerate", k=5)
    assert res.info["bound"] is False and "bound_note" in res.info
    _check_against_reference(q, 6, 5, res)


def test_threads_one_and_two_agree():
    q = random_block_qubo(24, 1)
    for M in (5, 9, 12):
        a = solve(q, M, "enumerate", k=10, threads=1)
        b = solve(q, M, "enumerate", k=10, threads=2)
        np.testing.assert_allclose(a.energies, b.energies, rtol=1e-12, atol=1e-12)
        assert a.info["threads"] == 1 and b.info["threads"] == 2


def test_plain_enumeration_counts_every_state():
    q = random_block_qubo(20, 2)
    res = solve(q, 8, "enumerate", k=3, bound=False)
    assert res.info["states"] == math.comb(20, 8)
    assert res.info["pruned"] == 0


def test_bound_prunes():
    q = random_block_qubo(30, 2)
    res = solve(q, 10, "enumerate", k=10)
    plain = solve(q, 10, "enumerate", k=10, bound=False)
    np.testing.assert_allclose(res.energies, plain.energies, rtol=1e-12)
    assert res.info["states"] < plain.info["states"] / 100
    assert res.info["pruned"] > 0


def test_time_limit_returns_best_so_far_marked_inexact():
    q = random_block_qubo(80, 0)
    t0 = time.perf_counter()
    res = solve(q, 16, "enumerate", k=10, time_limit=0.3, bound=False, seed_heuristic=False)
    wall = time.perf_counter() - t0
    assert wall < 5.0  # stops within a node, not at the end of a task
    assert res.exact is False
    assert res.info["timed_out"] is True and res.info["interrupted"] is False
    assert 1 <= len(res) <= 10
    assert np.all(q.feasible(res.states, 16))
    assert res.info["tasks_done"] < res.info["tasks"]


def test_ctrl_c_returns_best_so_far(monkeypatch):
    options = EnumerateSolver.make_options({"bound": False, "seed_heuristic": False})
    EnumerateSolver().run(Problem(random_block_qubo(20, 0), 4, 10, 0, None), options)  # the kernels compiled
    q = random_block_qubo(80, 0)
    problem = Problem(q, 16, 10, 0, None)
    start, cpu = time.perf_counter(), time.process_time()

    def time_left() -> float:
        # Ctrl-C arrives in the caller's thread after 0.2 CPU seconds of search (CPU time, not wall time: on a
        # loaded machine 0.2 s of wall time may pass before the search has found a state)
        if threading.current_thread() is threading.main_thread() and time.process_time() - cpu > 0.2:
            raise KeyboardInterrupt
        return float("inf")

    monkeypatch.setattr(problem, "time_left", time_left)
    out = EnumerateSolver().run(problem, options)
    assert out.exact is False
    assert out.info["interrupted"] is True
    assert len(out.candidates) >= 1
    assert time.perf_counter() - start < 60.0


def test_warm_start_limits_the_search():
    q = random_block_qubo(16, 6)
    _, E = brute_force_topk(q, 6, 10)
    res = solve(q, 6, "enumerate", k=10, warm_start=float(E[4]))
    assert res.exact
    np.testing.assert_allclose(res.energies, E[E <= E[4] + 1e-12])
    full = solve(q, 6, "enumerate", k=10, warm_start=float(E[-1]) + 1.0)
    np.testing.assert_allclose(full.energies, E)
    with pytest.raises(SolverError, match="no feasible state"):
        solve(q, 6, "enumerate", k=10, warm_start=float(E[0]) - 1.0)


def test_warm_start_with_forced_blocks_uses_full_energies():
    q = make_instance("block", 12, 3, force=[4])
    _, E = brute_force_topk(q, 5, 8)
    res = solve(q, 5, "enumerate", k=8, warm_start=float(E[2]))
    np.testing.assert_allclose(res.energies, E[:3])


@pytest.mark.parametrize(
    "options,match",
    [
        ({"threads": 0}, "threads"),
        ({"threads": 10_000}, "threads"),
        ({"threads": 1.5}, "threads"),
        ({"order": "random"}, "order"),
        ({"warm_start": float("nan")}, "warm_start"),
        ({"task_depth": -1}, "task_depth"),
        ({"batch_seconds": 0}, "batch_seconds"),
        ({"relax_iters": 0}, "relax_iters"),
        ({"relax_min_states": -1}, "relax_min_states"),
        ({"tail": 21}, "tail"),
        ({"bogus": 1}, "no option"),
    ],
)
def test_bad_options(options, match):
    q = make_instance("block", 8, 0)
    with pytest.raises(SolverError, match=match):
        solve(q, 3, "enumerate", **options)


def test_exact_alias_and_progress_bar(capsys):
    q = make_instance("block", 14, 2)
    res = solve(q, 6, "exact", k=4, progress=True)
    assert res.solver == "enumerate"
    _check_against_reference(q, 6, 4, res)


def test_split_tasks_merge_to_the_same_result():
    q = random_block_qubo(22, 4)
    problem = Problem(q, 9, 8, 0, None)
    plan = plan_enumeration(problem)
    parts = [enumerate_tasks(plan, part, threads=1) for part in np.array_split(plan.tasks, 3)]
    assert sum(p.done for p in parts) == len(plan.tasks)
    E, S = merge_task_results(plan, parts)
    X = plan.states(S)
    np.testing.assert_allclose(q.energy(X), E + plan.const, rtol=1e-9, atol=1e-12)
    ref = solve(q, 9, "enumerate", k=8)
    np.testing.assert_allclose(np.sort(q.energy(X)), ref.energies, rtol=1e-12)


def test_seed_threshold_is_an_upper_bound_on_the_kth_best():
    for seed in range(5):
        q = make_instance("negative", 12, seed)
        problem = Problem(q, 5, 6, 0, None)
        Q = np.ascontiguousarray(problem.Q)
        thr, best = seed_threshold(Q, 5, 6)
        _, E = brute_force_topk(q, 5, 6)
        assert thr + problem.const >= E[-1] - 1e-9
        assert best.sum() == 5


# ----------------------------------------------------------------------------------- properties
@st.composite
def _problems(draw):
    n = draw(st.integers(1, 10))
    vals = st.floats(-5, 5, allow_nan=False, allow_infinity=False, width=32)
    A = np.array(draw(st.lists(vals, min_size=n * n, max_size=n * n)), dtype=float).reshape(n, n)
    g = np.array(draw(st.lists(vals, min_size=n, max_size=n)), dtype=float)
    M = draw(st.integers(0, n))
    k = draw(st.integers(1, 12))
    keep = draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True))
    return BlockQUBO(A + A.T, g, keep=keep), M, k


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_problems())
def test_property_matches_reference(problem):
    q, M, k = problem
    try:
        q.check_remove(M)
    except InfeasibleError:
        return
    res = solve(q, M, "enumerate", k=k)
    X, E = all_feasible(q, M)
    assert res.exact
    assert len(res) == min(k, len(E))
    np.testing.assert_allclose(res.energies, q.energy(res.states), rtol=1e-12, atol=1e-12)
    assert np.all(q.feasible(res.states, M))
    assert np.all(np.diff(res.energies) >= 0)
    np.testing.assert_allclose(res.energies, E[:k], rtol=1e-9, atol=1e-6)


def test_seed_states_are_real_states_with_their_energies():
    for kind in ("block", "negative", "integer"):
        q = make_instance(kind, 12, 3, force=[2])
        problem = Problem(q, 6, 7, 0, None)
        plan = plan_enumeration(problem)
        X = plan.states(plan.seed_positions)
        assert len(X) == 7
        assert np.all(q.feasible(X, 6))
        np.testing.assert_allclose(q.energy(X), plan.seed_energies + plan.const, rtol=1e-9, atol=1e-9)
        assert len({tuple(x) for x in X}) == len(X)


@pytest.mark.parametrize("kind", INSTANCE_KINDS)
def test_relaxation_at_every_node_matches_brute_force(kind):
    q = make_instance(kind, 14, 8)
    for M in range(2, 13):
        res = solve(q, M, "enumerate", k=6, relax_min_states=0, relax_iters=200)
        assert res.info["relaxation"] is True
        _check_against_reference(q, M, 6, res)
    cons = make_constrained(14, 8)
    for M in range(2, 8):
        _, E = brute_force_topk(cons, M, 6)
        if len(E):
            _check_against_reference(cons, M, 6, solve(cons, M, "enumerate", k=6, relax_min_states=0))


@pytest.mark.parametrize("kind", INSTANCE_KINDS)
def test_relaxation_bound_never_exceeds_the_best_completion(kind):
    # at random prefixes, the convex bound is below the best completion (itertools over the rest)
    n = 13
    q = make_instance(kind, n, 5)
    problem = Problem(q, 6, 1, 0, None)
    plan = plan_enumeration(problem, EnumerateSolver.make_options({"relax_min_states": 0, "relax_iters": 500}))
    _, _, rx, _ = plan.tables()
    Q = plan.Q
    rng = np.random.default_rng(0)
    work = (np.zeros((5, n)), np.zeros(n + 1, dtype=np.int64), np.zeros(n + 1))
    for _ in range(40):
        depth = int(rng.integers(0, 4))
        prefix = np.sort(rng.choice(7, size=depth, replace=False))
        c0 = int(prefix[-1]) + 1 if depth else 0
        rho = 6 - depth
        F = np.zeros((1, n))
        F[0] = np.diag(Q) + Q[prefix].sum(0)
        e = float(np.diag(Q)[prefix].sum() + np.triu(Q[np.ix_(prefix, prefix)], 1).sum())
        lb = relax_bound(rx, work, F, 0, c0, n, rho, np.inf)
        best = np.inf
        for rest in itertools.combinations(range(c0, n), rho):
            S = np.concatenate([prefix, rest]).astype(int)
            best = min(best, float(np.diag(Q)[S].sum() + np.triu(Q[np.ix_(S, S)], 1).sum()))
        assert e + lb <= best + 1e-9


def test_relaxation_shift_convexifies_on_the_cardinality_plane():
    for kind in INSTANCE_KINDS:
        Q = Problem(make_instance(kind, 15, 2), 5, 1, 0, None).Q
        lam = relaxation_shift(Q)
        A = Q - np.diag(np.diag(Q)) + lam * np.eye(15)
        P = np.eye(15) - 1.0 / 15
        assert np.linalg.eigvalsh(P @ A @ P).min() >= -1e-9


def test_relaxation_prunes_large_M():
    q = random_block_qubo(40, 0)
    res = solve(q, 20, "enumerate", k=10, strategy="lexicographic")
    assert res.exact and res.info["relax_pruned"] > 0
    plain = solve(q, 20, "enumerate", k=10, relaxation=False, strategy="lexicographic")
    np.testing.assert_allclose(res.energies, plain.energies, rtol=1e-12)
    assert res.info["nodes"] < plain.info["nodes"] / 10


def test_tasks_deeper_than_the_kernel_allows_are_refused():
    problem = Problem(random_block_qubo(20, 1), 6, 3, 0, None)
    plan = plan_enumeration(problem)
    with pytest.raises(SolverError, match="depth <= 2"):
        enumerate_tasks(plan, np.array([[0, 1, 2]], dtype=np.int32))
