"""QAOA: the Dicke start state and XY mixer, both forms on tiny problems, limits and errors."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
from reference import brute_force_topk

from cbo import solve
from cbo.errors import SolverError, SolverUnavailableError
from cbo.qubo.instances import random_block_qubo

pytest.importorskip("qiskit_optimization")

from qiskit.quantum_info import Statevector  # noqa: E402
from scipy.linalg import expm  # noqa: E402

from cbo.solvers.qaoa import MAX_QUBITS, dicke_circuit, xy_mixer  # noqa: E402

FAST = {"reps": 1, "maxiter": 15, "shots": 1024}


def _weights(n):
    return np.array([bin(b).count("1") for b in range(2**n)])


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_dicke_circuit_is_the_uniform_superposition_of_weight_r(n):
    w = _weights(n)
    for r in range(n + 1):
        sv = Statevector(dicke_circuit(n, r)).data
        want = np.where(w == r, 1 / np.sqrt(comb(n, r)), 0.0)
        np.testing.assert_allclose(sv, want, atol=1e-9)


@pytest.mark.parametrize("graph", ["ring", "complete"])
def test_xy_mixer_conserves_the_number_of_ones(graph):
    n = 5
    H = xy_mixer(n, graph).to_matrix()
    U = expm(-1j * 0.7 * H)
    w = _weights(n)
    rng = np.random.default_rng(0)
    psi = np.where(w == 2, rng.normal(size=2**n) + 1j * rng.normal(size=2**n), 0)
    psi /= np.linalg.norm(psi)
    out = U @ psi
    assert np.abs(out[w != 2]).max() < 1e-12
    # and it does mix: the state changed
    assert np.abs(out - psi).max() > 1e-3


def test_xy_form_samples_are_all_feasible_and_find_the_ground_state():
    q = random_block_qubo(8, 0)
    _, E = brute_force_topk(q, 3, 1)
    res = solve(q, 3, "qaoa", k=5, seed=1, **FAST)
    assert res.info["form"] == "xy"
    assert res.info["feasible_fraction"] == pytest.approx(1.0)
    assert all(s["feasible"] and len(s["removed"]) == 3 for s in res.info["samples"])
    assert res.energies[0] == pytest.approx(E[0], abs=1e-9)
    probs = [s["probability"] for s in res.info["samples"]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-9


def test_penalty_form_filters_infeasible_samples():
    q = random_block_qubo(6, 1).with_constraints(keep=[0])
    res = solve(q, 2, "qaoa", k=3, seed=0, form="penalty", penalty="safe", **FAST)
    assert q.feasible(res.states, 2).all()
    assert 0 < res.info["feasible_fraction"] < 1
    assert res.info["qubits"] == 5  # the kept block is fixed, not a qubit
    assert res.info["penalty"] > 0


def test_seed_reproduces():
    q = random_block_qubo(6, 2)
    a = solve(q, 2, "qaoa", k=3, seed=4, **FAST)
    b = solve(q, 2, "qaoa", k=3, seed=4, **FAST)
    assert a.info["samples"] == b.info["samples"]
    np.testing.assert_array_equal(a.states, b.states)


def test_too_many_qubits_is_refused_with_the_limit():
    q = random_block_qubo(MAX_QUBITS + 1, 0)
    with pytest.raises(SolverUnavailableError, match=f"limited to {MAX_QUBITS} qubits.*force=True"):
        solve(q, 3, "qaoa", k=2, seed=0)
    # fixing a block brings it back under the limit (the check passes; the run is not needed here)
    with pytest.raises(SolverError, match="form"):
        solve(q.with_constraints(keep=[0]), 3, "qaoa", k=2, seed=0, form="adiabatic")


@pytest.mark.parametrize(
    "opts,match",
    [({"form": "x"}, "form"), ({"reps": 0}, "reps"), ({"mixer": "star"}, "mixer"), ({"cvar": 2.0}, "cvar")],
)
def test_bad_options(opts, match):
    with pytest.raises(SolverError, match=match):
        solve(random_block_qubo(5, 0), 2, "qaoa", k=2, seed=0, **{**FAST, **opts})


def test_missing_qiskit_names_the_extra(monkeypatch):
    import cbo.solvers.base as base
    from cbo.solvers.qaoa import QAOASolver

    monkeypatch.setattr(base, "has_module", lambda name: name != "qiskit_optimization")
    ok, reason = QAOASolver.availability()
    assert not ok and "cbo[qaoa]" in reason
    with pytest.raises(SolverUnavailableError, match=r"cbo\[qaoa\]"):
        solve(random_block_qubo(5, 0), 2, "qaoa", k=2)


@pytest.mark.slow
def test_default_settings_find_the_ground_state_at_n12():
    q = random_block_qubo(12, 0)
    _, E = brute_force_topk(q, 4, 1)
    res = solve(q, 4, "qaoa", k=5, seed=0)
    assert res.energies[0] == pytest.approx(E[0], abs=1e-9)


def test_time_limit_stops_the_optimizer_and_keeps_the_samples():
    q = random_block_qubo(8, 3)
    # the set-up alone takes longer: no optimizer step, the starting angles are sampled once
    res = solve(q, 3, "qaoa", k=3, seed=0, time_limit=1e-3, reps=1, maxiter=200, shots=256)
    assert res.info["timed_out"] and res.info["evaluations"] == 0
    assert res.exact is False and len(res) == 3


@pytest.mark.slow
def test_time_limit_is_kept_from_a_fresh_process(tmp_path):
    """As a user calls it: `cbo solve --solver qaoa --time-limit 3` in a new process (qiskit not yet imported).
    The import happens before the clock starts, an evaluation starts only while it still fits, and the final
    sampling reuses the best step's shots, so the solve ends within about one evaluation of its limit."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "q14.cboq"
    random_block_qubo(14, 0).save(path)
    limit = 3.0
    proc = subprocess.run(
        [sys.executable, "-c", "from cbo.cli import main; main()", "solve", str(path), "--remove", "4", "--solver",
         "qaoa", "--time-limit", str(limit), "--json", "-o", "maxiter=100000", "-o", "shots=8192"],
        capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                          "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    info = data["info"]
    assert info["evaluations"] >= 1 and info["final_sampling_reused"]
    assert data["wall_time"] <= limit + 1.5 * info["slowest_evaluation_seconds"] + 1.0, data["wall_time"]
