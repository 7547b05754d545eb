"""Exact enumeration sharded over a local 2-worker Ray instance equals the single-process search."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray_session

from cbo.errors import SolverError
from cbo.qubo.instances import random_block_qubo
from cbo.solvers import solve
from cbo.solvers.enumerate.ray import (
    RayBackend,
    balanced_chunks,
    kept_workers,
    release_workers,
    split_tasks,
    subtree_leaves,
)

ray_local = ray_session.ray_local  # the shared local Ray instance (a fixture)

pytestmark = pytest.mark.slow

POOL = {"workers": 2, "keep_workers": True}


def _same(local, sharded):
    np.testing.assert_array_equal(sharded.energies, local.energies)
    # random instances have no ties: the states are the same too
    np.testing.assert_array_equal(sharded.states, local.states)
    assert sharded.exact and local.exact


@pytest.mark.parametrize(
    "n, m, k, opts",
    [
        (24, 6, 10, {}),  # fused kernel with the bound
        (34, 9, 25, {}),
        (21, 2, 10, {}),  # generic kernel (r <= 2)
        (18, 5, 10, {"bound": False}),
        (26, 7, 10, {"order": "natural", "seed_heuristic": False}),
        (22, 20, 5, {}),  # r = n - 2
    ],
)
def test_sharded_equals_single_process(ray_local, n, m, k, opts):
    q = random_block_qubo(n, seed=n + m)
    local = solve(q, m, "enumerate", k=k, threads=1, **opts)
    sharded = solve(q, m, "enumerate", k=k, backend="ray", backend_options=POOL, **opts)
    _same(local, sharded)
    info = sharded.info
    assert info["backend"] == "ray" and info["workers"] == 2
    assert info["tasks_done"] == info["tasks"] and info["chunks"] >= 2
    assert info["board_offers"] >= info["chunks"]  # every chunk offers its K-th best to the others
    assert sharded.options["backend"] == "ray"


def test_sharded_with_keep_force_caps_and_budget(ray_local):
    kinds = ["attention", "mlp"] * 10
    q = random_block_qubo(20, seed=5, kinds=kinds)
    q = q.with_constraints(keep=[0], force=[19], caps={"attention": 3})
    local = solve(q, 7, "enumerate", k=12, threads=1)
    sharded = solve(q, 7, "enumerate", k=12, backend="ray", backend_options=POOL)
    _same(local, sharded)
    assert all(s.removed[-1] == 19 and 0 not in s.removed for s in sharded)


def test_warm_start_and_brute_force(ray_local):
    import itertools

    q = random_block_qubo(16, seed=2)
    combos = list(itertools.combinations(range(16), 5))
    X = np.zeros((len(combos), 16), dtype=np.uint8)
    for i, c in enumerate(combos):
        X[i, list(c)] = 1
    brute = np.sort(q.energy(X))
    sharded = solve(q, 5, "enumerate", k=10, backend="ray", backend_options=POOL)
    np.testing.assert_allclose(sharded.energies, brute[:10], rtol=1e-12)
    # a warm start at the 4th energy: only the 4 states at or below it
    warm = solve(q, 5, "enumerate", k=10, warm_start=float(brute[3]), backend="ray", backend_options=POOL)
    np.testing.assert_allclose(warm.energies, brute[:4], rtol=1e-12)


def test_fresh_workers_and_backend_object(ray_local):
    release_workers()  # the kept pool would be reused; this solve starts (and then removes) its own
    q = random_block_qubo(28, seed=9)
    local = solve(q, 8, "enumerate", k=10, threads=1)
    sharded = solve(q, 8, "auto", k=10, backend=RayBackend(workers=2, worker_threads=1, chunks_per_worker=3))
    _same(local, sharded)
    assert sharded.info["chunks"] >= 2 and sharded.info["worker_processes"] == 2
    assert kept_workers() == 0  # removed after the solve: the CPUs are free again
    deadline = time.time() + 60
    while ray_local.available_resources().get("CPU", 0) < 2 and time.time() < deadline:
        time.sleep(0.5)  # the cluster learns of removed actors asynchronously
    assert ray_local.available_resources().get("CPU", 0) == 2


def test_backend_errors(ray_local):
    q = random_block_qubo(10, seed=0)
    with pytest.raises(SolverError, match="no option"):  # a backend is an option of the enumerator only
        solve(q, 3, "swap-sa", backend="ray")
    with pytest.raises(SolverError, match="unknown backend"):
        solve(q, 3, "enumerate", backend="dask")
    with pytest.raises(SolverError, match="no option"):
        solve(q, 3, "enumerate", backend="ray", backend_options={"nodes": 3})
    with pytest.raises(SolverError, match="CPUs"):
        solve(q, 3, "enumerate", backend="ray", backend_options={"workers": 64})
    with pytest.raises(SolverError, match="worker_threads"):
        solve(q, 3, "enumerate", threads=2, backend="ray")


def test_balanced_chunks_cover_every_task_once():
    rng = np.random.default_rng(0)
    for m in (1, 5, 37, 400):
        leaves = rng.integers(1, 1000, size=m).astype(float)
        leaves[0] = 1e6  # one task larger than a share
        for parts in (1, 2, 7, 50):
            chunks = balanced_chunks(leaves, parts)
            covered = [i for lo, hi in chunks for i in range(lo, hi)]
            assert covered == list(range(m))
            assert len(chunks) <= parts
            # a chunk exceeds an equal share by at most one of its tasks
            share = leaves.sum() / parts
            for lo, hi in chunks:
                assert leaves[lo:hi].sum() <= share + leaves[lo:hi].max() + 1e-9


@pytest.mark.parametrize("n, r, depth", [(9, 4, 1), (10, 6, 2), (8, 3, 0)])
def test_split_tasks_cover_every_state_once_in_search_order(n, r, depth):
    import itertools

    combos = list(itertools.combinations(range(n - r + depth), depth))
    tasks = np.array(combos, dtype=np.int32).reshape(len(combos), depth)
    total = subtree_leaves(n, r, ())
    for max_leaves in (total, total / 7, total / 40, 1):
        runs = split_tasks(n, r, tasks, max_leaves, max_depth=r - 1)
        prefixes = [tuple(int(c) for c in t) for run in runs for t in run]
        assert prefixes == sorted(prefixes)  # lexicographic: the search order
        assert all(len({len(t) for t in run}) == 1 for run in runs)  # one depth per run
        assert all(subtree_leaves(n, r, p) <= max_leaves or len(p) == r - 1 for p in prefixes)
        states = [
            p + rest for p in prefixes for rest in itertools.combinations(range(p[-1] + 1 if p else 0, n), r - len(p))
        ]
        assert sorted(states) == list(itertools.combinations(range(n), r))  # each state under one task
