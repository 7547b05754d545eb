"""GPU enumeration: host-side logic, the kernel source run on the CPU emulator, and (with a GPU) the real thing."""

from __future__ import annotations

import itertools
import math
import shutil
import subprocess

import numpy as np
import pytest
from reference import brute_force_topk

from cbo import BlockQUBO, solve
from cbo.errors import SolverError, SolverUnavailableError
from cbo.qubo.instances import random_block_qubo
from cbo.qubo.states import RankedStates
from cbo.solvers.base import Problem
from cbo.solvers.enumerate.gpu import (
    EnumerateGPU,
    Plan,
    cuda_device_status,
    enumerate_on_device,
    lex_rank,
    merge,
    states_before,
    unrank,
)
from cbo.solvers.enumerate.gpu_kernel import binomial_table, cuda_source

HAS_CXX = shutil.which("g++") is not None or shutil.which("clang++") is not None
HAS_GPU = cuda_device_status()[0]
needs_cxx = pytest.mark.skipif(not HAS_CXX, reason="the kernel emulator needs a C++20 compiler")


# ----------------------------------------------------------------------------- host-side logic
@pytest.mark.parametrize("n,m", [(7, 0), (7, 1), (8, 3), (9, 5)])
def test_unrank_follows_itertools_lexicographic_order(n, m):
    for rank, comb in enumerate(itertools.combinations(range(n), m)):
        assert unrank(rank, n, m) == list(comb)
        assert lex_rank(list(comb), n) == rank


def test_binomial_table():
    T = binomial_table(12, 5)
    for a in range(13):
        for b in range(6):
            assert int(T[a, b]) == math.comb(a, b)
    assert int(binomial_table(127, 63)[127, 63]) == 2**64 - 1  # clamped, never read by the kernel


def test_prefix_split_counts_every_state_once():
    # prefix = first r-1 blocks (a combination of 0..n-2), leaves = later blocks
    q = random_block_qubo(9, 0)
    plan = Plan.from_problem(Problem(q, 4, 3, 0, None))
    assert plan.total_prefixes == math.comb(8, 3) and plan.total_states == math.comb(9, 4)
    seen = []
    for rank in range(plan.total_prefixes):
        prefix = unrank(rank, 8, 3)
        assert states_before(plan, rank) == len(seen)
        seen += [tuple(prefix) + (j,) for j in range(prefix[-1] + 1, 9)]
    assert seen == list(itertools.combinations(range(9), 4))
    assert states_before(plan, plan.total_prefixes) == plan.total_states


def test_complement_keeps_energy_differences():
    q = random_block_qubo(8, 1)
    p = Problem(q, 6, 3, 0, None)
    plan = Plan.from_problem(p)
    assert plan.complemented and plan.r == 2
    energies = []
    for kept in itertools.combinations(range(8), 2):
        z = np.zeros(8)
        z[list(kept)] = 1
        e_z = z @ plan.D + 0.5 * z @ plan.Qoff @ z
        y = plan.states(np.array([kept]))[0]
        energies.append((e_z, q.energy(y)))
    E = np.array(energies)
    np.testing.assert_allclose(E[:, 1] - E[:, 0], (E[0, 1] - E[0, 0]) * np.ones(len(E)), atol=1e-9)


def test_merge_takes_the_best_over_warp_lists():
    K, R = 3, 2
    outE = np.array([5.0, 1.0, np.inf, 2.0, 0.5, 3.0])
    outS = np.arange(12, dtype=np.uint8)
    outN = np.array([2, 3], dtype=np.int32)
    e, s = merge(outE, outS, outN, K, R, keep=3)
    np.testing.assert_array_equal(e, [0.5, 1.0, 2.0])
    np.testing.assert_array_equal(s, [[8, 9], [2, 3], [6, 7]])


# ----------------------------------------------------------------------------- the kernel on the emulator
def _emulated(q, M, k, **opts):
    p = Problem(q, M, k, 0, opts.pop("time_limit", None))
    out = enumerate_on_device(p, EnumerateGPU.Options(emulate=True, **opts))
    return out, RankedStates.from_candidates(q, out.candidates, M, k, solver="enumerate-gpu", exact=out.exact)


@needs_cxx
@pytest.mark.parametrize(
    "n,M,k,warps",
    [
        (10, 1, 5, 2),  # prefix length 0
        (12, 4, 10, 3),
        (12, 9, 7, 2),  # complement
        (13, 6, 25, 4),
        (40, 3, 12, 3),  # two register slots
        (6, 3, 30, 2),  # k above the number of states
    ],
)
def test_emulated_kernel_matches_brute_force(n, M, k, warps):
    q = random_block_qubo(n, n + M)
    X, E = brute_force_topk(q, M, k)
    out, res = _emulated(q, M, k, emulate_warps=warps)
    assert out.exact and out.info["states"] == math.comb(n, M)
    np.testing.assert_allclose(res.energies, E, atol=1e-9)
    assert {tuple(res.removed(i)) for i in range(len(res))} == {tuple(np.flatnonzero(x)) for x in X}


@needs_cxx
def test_emulated_kernel_with_keep_force_and_warm_start():
    q = random_block_qubo(12, 3).with_constraints(keep=[0], force=[11, 4])
    _, E = brute_force_topk(q, 5, 6)
    _, res = _emulated(q, 5, 6, warm_start=float(E[-1]))
    np.testing.assert_allclose(res.energies, E, atol=1e-9)
    # a complemented problem with a warm start
    _, E2 = brute_force_topk(q, 8, 4)
    _, res2 = _emulated(q, 8, 4, warm_start=float(E2[-1]))
    np.testing.assert_allclose(res2.energies, E2, atol=1e-9)


@needs_cxx
def test_emulated_time_limit_returns_partial_inexact():
    q = random_block_qubo(40, 0)
    out, res = _emulated(q, 4, 5, time_limit=1e-6)
    assert out.exact is False and out.info["timed_out"]
    assert 0 < out.info["fraction_done"] < 1
    assert 0 < out.info["states"] < math.comb(40, 4)
    assert len(res) == 5


def test_side_constraints_and_sizes_are_refused():
    base = random_block_qubo(8, 0)
    q = BlockQUBO(base.H, kinds=["a", "b"] * 4, caps={"a": 1})
    with pytest.raises(SolverError, match="caps"):
        enumerate_on_device(Problem(q, 3, 2, 0, None), EnumerateGPU.Options(emulate=True))
    with pytest.raises(SolverError, match="at most 128"):
        enumerate_on_device(Problem(random_block_qubo(130, 0), 3, 2, 0, None), EnumerateGPU.Options(emulate=True))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("n,m", [(80, 7), (20, 0), (128, 63)])
def test_kernel_source_compiles_for_hopper(tmp_path, n, m):
    src = tmp_path / "k.cu"
    src.write_text(cuda_source(n, m))
    proc = subprocess.run(
        ["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", str(src), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------------------------------- availability and the real GPU
@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_without_a_gpu_it_is_unavailable_with_a_reason():
    ok, reason = EnumerateGPU.availability()
    assert not ok and reason
    with pytest.raises(SolverUnavailableError, match="enumerate-gpu"):
        solve(random_block_qubo(8, 0), 3, "enumerate-gpu", k=2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU with CuPy")
@pytest.mark.parametrize("n,M,seed", [(20, 5, 0), (24, 17, 1), (40, 3, 2), (64, 4, 3), (100, 2, 4), (16, 1, 5)])
def test_gpu_matches_cpu_enumerator(n, M, seed):
    q = random_block_qubo(n, seed)
    cpu = solve(q, M, "enumerate", k=10)
    gpu = solve(q, M, "enumerate-gpu", k=10)
    assert gpu.exact
    np.testing.assert_allclose(gpu.energies, cpu.energies, atol=1e-9)
