"""The enumerator's backends: chosen by its options (``auto`` passes them on), checked before any work."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from reference import brute_force_topk

from cbo import solve
from cbo.errors import SolverError, SolverOptionError
from cbo.qubo.instances import random_block_qubo
from cbo.solvers import get
from cbo.solvers.enumerate.ray import RayBackend

needs_cxx = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("clang++") is None, reason="the kernel emulator needs a C++20 compiler"
)
EMULATED = {"emulate": True, "emulate_warps": 2}


@needs_cxx
@pytest.mark.parametrize("solver", ["enumerate", "auto"])
def test_gpu_backend_on_the_emulator_matches_brute_force(solver):
    q = random_block_qubo(12, 5).with_constraints(keep=[0], force=[3])
    _, E = brute_force_topk(q, 5, 8)
    res = solve(q, 5, solver, k=8, backend="gpu", backend_options=EMULATED)
    assert res.exact and res.info["backend"] == "gpu" and res.info["device"] == "CPU emulator"
    np.testing.assert_allclose(res.energies, E, atol=1e-9)
    assert res.options["backend"] == "gpu"
    if solver == "auto":
        assert res.solver == "auto→enumerate" and res.info["auto_choice"] == "enumerate"
        assert "backend" in res.info["auto_reason"]


@needs_cxx
def test_gpu_backend_takes_the_warm_start_of_the_enumerator():
    q = random_block_qubo(12, 6)
    _, E = brute_force_topk(q, 4, 10)
    res = solve(q, 4, "enumerate", k=10, warm_start=float(E[3]), backend="gpu", backend_options=EMULATED)
    np.testing.assert_allclose(res.energies, E[:4], atol=1e-9)


def test_local_is_the_default_and_records_it():
    q = random_block_qubo(10, 0)
    res = solve(q, 3, "enumerate", k=3)
    assert res.options["backend"] == "local" and "backend" not in res.info


@pytest.mark.parametrize(
    "options,match",
    [
        ({"backend": "dask"}, "unknown backend 'dask'"),
        ({"backend": 3}, "unknown backend 3"),
        ({"backend_options": {"workers": 2}}, "takes no backend_options"),
        ({"backend": "gpu", "backend_options": {"workers": 2}}, r"gpu backend has no option\(s\) \['workers'\]"),
        ({"backend": "gpu", "backend_options": {"batch_seconds": 0}}, "batch_seconds"),
        ({"backend": "ray", "backend_options": {"nodes": 3}}, r"ray backend has no option\(s\) \['nodes'\]"),
        ({"backend": "ray", "backend_options": {"workers": 0}}, "workers must be an integer >= 1"),
        ({"backend": RayBackend(workers=2), "backend_options": {"workers": 2}}, "not both"),
    ],
)
@pytest.mark.parametrize("solver", ["enumerate", "auto"])
def test_bad_backend_settings_are_refused_before_any_work(solver, options, match):
    with pytest.raises(SolverOptionError, match=match):
        get(solver).make_options(options)
    with pytest.raises(SolverError, match=match):
        solve(random_block_qubo(8, 0), 3, solver, k=2, **options)


def test_a_ray_backend_object_becomes_its_options():
    opts = get("enumerate").make_options({"backend": RayBackend(workers=3, worker_threads=2)})
    assert opts.backend == "ray"
    assert opts.backend_options["workers"] == 3 and opts.backend_options["worker_threads"] == 2


def test_other_solvers_have_no_backend():
    with pytest.raises(SolverError, match="no option"):
        solve(random_block_qubo(8, 0), 3, "swap-tabu", k=2, backend="ray")
