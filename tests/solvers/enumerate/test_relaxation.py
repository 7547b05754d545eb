"""The relaxation bound and its branch and bound, against brute force over small instances."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from reference import INSTANCE_KINDS, all_feasible, make_instance

from cbo.errors import SolverError
from cbo.qubo.block_qubo import BlockQUBO
from cbo.qubo.instances import fisher_block_qubo
from cbo.solvers.enumerate.relaxation import (
    completion_bound,
    convexity_shift,
    energy_scale,
    factor,
    plane_minimum,
    processing_order,
    relaxation_value,
    shor_shift,
)
from cbo.solvers.enumerate.relaxation_search import SubtreeSearch, search_top_k, split


def _qubos(n: int, seed: int) -> list[tuple[str, BlockQUBO]]:
    """Every reference kind plus Fisher matrices of low rank (4 samples), medium and full rank."""
    out = [(kind, make_instance(kind, n, seed)) for kind in INSTANCE_KINDS]
    out += [(f"fisher{s}", fisher_block_qubo(n, seed, samples=s)) for s in (4, n // 2, 4 * n)]
    return out


def _energy(Q: np.ndarray, x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.diag(Q) @ x + x @ np.triu(Q, 1) @ x)


def _best_completion(Q: np.ndarray, chosen: list[int], cand: list[int], r: int) -> float:
    n = Q.shape[0]
    best = np.inf
    for extra in itertools.combinations(cand, r):
        x = np.zeros(n)
        x[chosen + list(extra)] = 1
        best = min(best, _energy(Q, x))
    return best


def _shifts(Q: np.ndarray, r: int) -> list[np.ndarray]:
    n = Q.shape[0]
    s = energy_scale(Q)
    shor = shor_shift(Q, r).w
    return [shor, shor + 0.2 * s, np.full(n, convexity_shift(Q) + 0.05 * s)]


@pytest.mark.parametrize("seed", range(3))
def test_completion_bound_never_exceeds_the_best_completion(seed):
    rng = np.random.default_rng(seed)
    n = 10
    for name, q in _qubos(n, seed):
        Q = q.qubo_matrix()
        for r in (2, 5):
            shifts = _shifts(Q, r)
            for _ in range(6):
                perm = rng.permutation(n)
                nc = int(rng.integers(0, 3))
                chosen = perm[:nc].tolist()
                cand = perm[nc : nc + int(rng.integers(r - nc, n - nc + 1))].tolist()
                left = r - nc
                truth = _best_completion(Q, chosen, cand, left)
                for w in shifts:
                    b = completion_bound(Q, chosen, cand, left, w)
                    assert b <= truth + 1e-9 * (1 + abs(truth)), (name, r, chosen, cand, b, truth)


def test_completion_bound_edge_cases():
    q = fisher_block_qubo(8, 1, samples=20)
    Q = q.qubo_matrix()
    w = shor_shift(Q, 3).w
    # nothing left to choose, or every candidate taken: the bound is the energy itself
    assert completion_bound(Q, [1, 4], [0, 2], 0, w) == pytest.approx(_energy(Q, np.isin(np.arange(8), [1, 4])))
    assert completion_bound(Q, [1], [0, 2], 2, w) == pytest.approx(_energy(Q, np.isin(np.arange(8), [0, 1, 2])))
    assert completion_bound(Q, [1], [0, 2], 3, w) == np.inf
    # a shift that leaves the relaxation non-convex gives the trivially valid -inf
    assert completion_bound(Q, [], np.arange(8), 3, np.full(8, -100.0)) == -np.inf
    with pytest.raises(SolverError, match="disjoint"):
        completion_bound(Q, [1], [1, 2], 1, w)
    with pytest.raises(SolverError, match="0..7"):
        completion_bound(Q, [9], [1, 2], 1, w)


def test_plane_minimum_matches_a_dense_kkt_solve():
    rng = np.random.default_rng(0)
    B = rng.normal(size=(6, 6))
    P = B @ B.T + 0.1 * np.eye(6)
    b = rng.normal(size=6)
    value, y = plane_minimum(P, b, 2.0)
    K = np.block([[P, np.ones((6, 1))], [np.ones((1, 6)), np.zeros((1, 1))]])
    ref = np.linalg.solve(K, np.concatenate([-b, [2.0]]))[:6]
    assert np.allclose(y, ref)
    assert value == pytest.approx(0.5 * ref @ P @ ref + b @ ref)


@pytest.mark.parametrize("seed", range(3))
def test_shor_shift_is_a_valid_and_locally_optimal_root_bound(seed):
    for name, q in _qubos(9, seed):
        Q = q.qubo_matrix()
        for r in (2, 4, 7):
            res = shor_shift(Q, r)
            truth = all_feasible(q, r)[1][0]
            assert res.bound <= truth + 1e-9, (name, r)
            assert res.bound == pytest.approx(relaxation_value(Q, r, res.w), abs=1e-9 * (1 + abs(res.bound)))
            # at least as good as the best uniform shift on a grid, and no coordinate step improves it much
            lam = convexity_shift(Q)
            s = energy_scale(Q)
            uniform = max(relaxation_value(Q, r, np.full(9, lam + t * s)) for t in (1e-4, 1e-2, 0.1, 1.0))
            assert res.bound >= uniform - 1e-6 * s, (name, r)
            for i in range(9):
                for step in (1e-3 * s, -1e-3 * s):
                    w = res.w.copy()
                    w[i] += step
                    assert relaxation_value(Q, r, w) <= res.bound + 1e-6 * s, (name, r, i)


def test_factor_node_bound_equals_completion_bound():
    """The incremental (triangular) form and the stateless form of the bound are the same number."""
    rng = np.random.default_rng(3)
    for name, q in _qubos(10, 2):
        Q = q.qubo_matrix()
        r = 4
        w = shor_shift(Q, r).w + 0.1 * energy_scale(Q)
        order = rng.permutation(10)
        fac = factor(Q, r, w, order)
        assert fac.root_bound() == pytest.approx(relaxation_value(Q, r, w), rel=1e-7, abs=1e-9)
        for _ in range(20):
            p = int(rng.integers(1, 10))
            decided = rng.integers(0, 2, size=10 - p)
            if decided.sum() > r or decided.sum() + p < r:
                assert fac.node_bound(decided) == np.inf
                continue
            pos = order[p:]
            chosen = pos[decided == 1].tolist()
            left = r - len(chosen)
            ref = completion_bound(Q, chosen, order[:p].tolist(), left, w)
            if 0 < left < p:
                assert fac.node_bound(decided) == pytest.approx(ref, rel=1e-7, abs=1e-9), name
            else:  # the completion is unique: the stateless form returns its energy, the factor a lower bound
                assert fac.node_bound(decided) <= ref + 1e-9, name
        full = rng.permutation(np.r_[np.ones(r), np.zeros(10 - r)])
        x = np.zeros(10)
        x[order] = full
        assert fac.node_bound(full) == pytest.approx(_energy(Q, x), abs=1e-9)


def test_factor_refuses_a_nonconvex_shift():
    Q = fisher_block_qubo(8, 0, samples=3).qubo_matrix()
    with pytest.raises(SolverError, match="convex"):
        factor(Q, 3, np.full(8, convexity_shift(Q) - 1.0), processing_order(Q))


@pytest.mark.parametrize("seed", range(4))
def test_search_top_k_equals_brute_force(seed):
    for name, q in _qubos(11, seed):
        Q = q.qubo_matrix()
        for r in (1, 3, 6, 10):
            X, E = all_feasible(q, r)
            for k in (1, 7):
                res = search_top_k(Q, r, k)
                assert res.exact, (name, r)
                assert np.allclose(res.energies, E[:k], atol=1e-9), (name, r, k)
                assert np.all(res.states.sum(1) == r)
                assert np.allclose(q.energy(res.states), res.energies, atol=1e-9)
                assert len({s.tobytes() for s in res.states}) == len(res.states)


@pytest.mark.parametrize("alpha", [1e-4, 1e-3, 0.3])
def test_search_with_a_fixed_alpha_or_order(alpha):
    q = fisher_block_qubo(12, 5, samples=6)
    Q = q.qubo_matrix()
    X, E = all_feasible(q, 5)
    res = search_top_k(Q, 5, 6, alpha=alpha, order=np.arange(12)[::-1])
    assert res.exact and res.alpha == alpha
    assert np.allclose(res.energies, E[:6])


def test_search_all_or_nothing_and_fewer_states_than_k():
    q = fisher_block_qubo(6, 0)
    Q = q.qubo_matrix()
    for r in (0, 6):
        res = search_top_k(Q, r, 3)
        assert res.exact and len(res.energies) == 1 and res.states[0].sum() == r
    res = search_top_k(Q, 5, 10)  # only C(6, 5) = 6 states exist
    assert res.exact and len(res.energies) == 6
    assert np.allclose(res.energies, all_feasible(q, 5)[1])


def test_seeded_threshold_and_time_limited_search_are_never_worse_than_the_seed():
    q = fisher_block_qubo(40, 0)
    Q = q.qubo_matrix()
    exact = search_top_k(Q, 12, 5)
    assert exact.exact
    # a threshold at the true 5th best finds exactly the same states
    seeded = search_top_k(Q, 12, 5, threshold=float(exact.energies[-1]))
    assert seeded.exact and np.allclose(seeded.energies, exact.energies)
    # seed states merged in: a search stopped after a few nodes still returns states at least as good
    seed = exact.states[[1, 3]]
    early = search_top_k(Q, 12, 5, seed_states=seed, alpha=0.05, node_limit=10)
    assert not early.exact
    assert early.energies[0] <= exact.energies[1] + 1e-12
    assert set(map(bytes, seed)) <= set(map(bytes, early.states))
    again = search_top_k(Q, 12, 5, seed_states=seed)
    assert again.exact and np.allclose(again.energies, exact.energies)


def test_search_progress_and_bad_input():
    Q = fisher_block_qubo(10, 0).qubo_matrix()
    seen = []
    search_top_k(Q, 4, 2, alpha=0.1, progress=lambda c, nodes, kth: seen.append((c, nodes, kth)))
    assert seen and seen[-1][0] == 1.0
    with pytest.raises(SolverError, match="r must be"):
        search_top_k(Q, 11, 2)
    with pytest.raises(SolverError, match="k must be"):
        search_top_k(Q, 3, 0)
    for bad in (-1.0, 0.0):
        with pytest.raises(SolverError, match="alpha"):
            search_top_k(Q, 3, 2, alpha=bad)
    with pytest.raises(SolverError, match="seed_states"):
        search_top_k(Q, 3, 2, seed_states=np.ones((1, 10)))
    with pytest.raises(SolverError, match="square"):
        search_top_k(np.ones((3, 4)), 1)


@pytest.mark.parametrize("depth", [0, 3, 9, 12])
def test_split_search_merged_equals_brute_force(depth):
    """Subtrees of a split, searched one by one with a shared threshold, give the same top-k as one search."""
    q = fisher_block_qubo(12, 7, samples=5)
    Q = q.qubo_matrix()
    X, E = all_feasible(q, 5)
    fac = factor(Q, 5, shor_shift(Q, 5).w + 0.1 * energy_scale(Q), processing_order(Q))
    threshold = float(E[5])  # the 6th best: every subtree may use any upper bound on the k-th best
    tasks = split(fac, depth, threshold)
    assert 0 < len(tasks) <= 2**depth
    found = []
    for decided in tasks:
        run = SubtreeSearch(fac, 6, threshold, decided)
        run.step(10**7)
        assert run.done
        found.append(run.found())
    energies = np.sort(np.concatenate([e for e, _ in found]))
    assert np.allclose(energies[:6], E[:6])
    states = np.concatenate([s for _, s in found])
    assert np.all(states.sum(1) == 5) and np.allclose(np.sort(q.energy(states)), energies)
