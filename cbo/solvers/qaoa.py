"""QAOA through qiskit-optimization, simulated (qiskit-aer when installed, else qiskit's reference sampler).

Two forms (option ``form``):

* ``"xy"`` (default): constraint-preserving. The circuit starts in the Dicke state |D^n_r⟩ (the
  uniform superposition of all states with r removed free blocks, prepared exactly with the
  split-and-cyclic-shift construction of Bärtschi and Eidenbenz) and mixes with the XY Hamiltonian
  ``Σ (X_iX_j + Y_iY_j)/2`` over a ring or the complete graph, which conserves the number of ones.
  Every sample removes exactly M blocks.
* ``"penalty"``: the textbook form: the constrained QuadraticProgram is turned into a QUBO with
  ``QuadraticProgramToQubo`` (penalty λ) and solved with the standard X mixer; most samples are
  infeasible and are dropped.

Both run qiskit-optimization's ``QAOA`` eigensolver on the Ising form of the (converted) program
with a seeded sampler and a seeded initial point (COBYLA; an evaluation starts only while it fits the
time limit, and Ctrl-C stops it, with the best angles so far; the final distribution reuses the shots of
the best step), and keep every state of the final
distribution as a candidate; the most probable ones are kept with their probabilities in
``info["samples"]``. State-vector simulation is exponential in the number of qubits, so
problems above ``MAX_QUBITS`` free blocks (qubits) are refused unless ``force=True``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cbo.checks import check_int, is_number
from cbo.errors import SolverError, SolverUnavailableError
from cbo.extras import has_module, require
from cbo.solvers.base import Problem, Solver, SolverOutput, register
from cbo.solvers.constraints import FreeConstraints
from cbo.solvers.penalty import reduced_safe_penalty

MAX_QUBITS = 20
_KEEP_SAMPLES = 64


def dicke_circuit(n: int, r: int) -> Any:
    """A circuit preparing |D^n_r⟩ from |0…0⟩ with O(n·r) gates (Bärtschi & Eidenbenz 2019).

    Qubit q is position q+1 of the construction. Start from |0^{n−r}1^r⟩ and apply
    SCS_{m,min(r,m−1)} for m = n … 2; SCS_{m,l} turns |0…01^j⟩ (j ≤ l ones at the end of the first
    m positions) into √(j/m)|…01^j⟩ + √((m−j)/m)|…1^j0⟩.
    """
    qiskit = require("qiskit", "the Dicke-state circuit")
    from qiskit.circuit.library import RYGate

    qc = qiskit.QuantumCircuit(n, name=f"dicke_{n}_{r}")
    if r == 0 or n == 0:
        return qc
    for q in range(n - r, n):
        qc.x(q)
    for m in range(n, 1, -1):
        ell = min(r, m - 1)
        b = m - 1  # position m
        # two-qubit block on positions m-1, m
        a = m - 2
        theta = 2 * math.acos(math.sqrt(1.0 / m))
        qc.cx(a, b)
        qc.cry(theta, b, a)
        qc.cx(a, b)
        # three-qubit blocks: positions m-j (target), m-j+1 and m (controls)
        for j in range(2, ell + 1):
            c = m - 1 - j  # position m-j
            d = c + 1  # position m-j+1
            theta = 2 * math.acos(math.sqrt(j / m))
            qc.cx(c, b)
            qc.append(RYGate(theta).control(2), [b, d, c])
            qc.cx(c, b)
    return qc


def xy_mixer(n: int, graph: str) -> Any:
    """The XY mixer ``Σ_{(i,j)∈graph} (X_iX_j + Y_iY_j)/2`` as a SparsePauliOp (ring or complete)."""
    qi = require("qiskit.quantum_info", "the XY mixer")
    if graph == "ring":
        edges = [(i, (i + 1) % n) for i in range(n)] if n > 2 else ([(0, 1)] if n == 2 else [])
    elif graph == "complete":
        edges = [(i, j) for i in range(n) for j in range(i + 1, n)]
    else:
        raise SolverError(f"mixer must be 'ring' or 'complete', got {graph!r}.")
    if not edges:
        return qi.SparsePauliOp("I" * max(n, 1), 0.0)
    terms = []
    for i, j in edges:
        for p in ("X", "Y"):
            label = ["I"] * n
            label[n - 1 - i] = p  # qiskit labels are little-endian: qubit 0 is the last character
            label[n - 1 - j] = p
            terms.append(("".join(label), 0.5))
    return qi.SparsePauliOp.from_list(terms).simplify()


def make_sampler(shots: int, seed: int, backend: str, threads: int = 1) -> tuple[Any, Any, str]:
    """(sampler, pass manager or None, backend name) for ``backend`` in auto / aer / statevector.

    Aer runs with ``threads`` OpenMP threads: on a busy machine more threads than free cores make
    each circuit many times slower.
    """
    if backend not in ("auto", "aer", "statevector"):
        raise SolverError(f"backend must be 'auto', 'aer' or 'statevector', got {backend!r}.")
    if backend in ("auto", "aer") and has_module("qiskit_aer"):
        from qiskit.transpiler.preset_passmanagers import generate_preset_pass_manager
        from qiskit_aer import AerSimulator
        from qiskit_aer.primitives import SamplerV2

        sim = AerSimulator(method="statevector", seed_simulator=seed)
        pm = generate_preset_pass_manager(optimization_level=1, backend=sim, seed_transpiler=seed)
        opts = {"backend_options": {"max_parallel_threads": int(threads), "seed_simulator": seed}}
        return SamplerV2(default_shots=shots, seed=seed, options=opts), pm, "aer"
    if backend == "aer":
        raise SolverUnavailableError("backend='aer' needs qiskit-aer; install it with: pip install 'cbo[qaoa]'")
    from qiskit.primitives import StatevectorSampler

    return StatevectorSampler(default_shots=shots, seed=seed), None, "statevector"


@register
class QAOASolver(Solver):
    """QAOA (penalty or constraint-preserving XY form) simulated with qiskit."""

    name = "qaoa"
    aliases = ("qiskit",)
    description = f"QAOA via qiskit-optimization, XY mixer + Dicke start or penalty form (≤ {MAX_QUBITS} qubits)"
    requires = ("qiskit", "qiskit_optimization")

    @dataclass
    class Options:
        """Settings of QAOA.

        Attributes:
            form: "xy" (Dicke start + XY mixer, every sample feasible) or "penalty".
            reps: QAOA layers p.
            shots: samples per circuit evaluation and for the final distribution.
            maxiter: optimizer iterations (COBYLA).
            mixer: XY mixer graph, "ring" or "complete" (form="xy").
            penalty: λ for form="penalty": None (qiskit's default), "safe", or a number.
            cvar: optimize the mean of the best ``cvar`` fraction of samples (CVaR) instead of the mean.
            backend: "auto" (qiskit-aer if installed), "aer", or "statevector".
            threads: simulator threads (qiskit-aer).
            force: allow more than MAX_QUBITS qubits.
        """

        form: str = "xy"
        reps: int = 2
        shots: int = 4096
        maxiter: int = 60
        mixer: str = "ring"
        penalty: Any = None
        cvar: float | None = None
        backend: str = "auto"
        threads: int = 1
        force: bool = False

    @classmethod
    def load(cls) -> None:
        super().load()
        import qiskit_optimization.minimum_eigensolvers  # noqa: F401  (seconds on a first import)

        if has_module("qiskit_aer"):
            import qiskit_aer.primitives  # noqa: F401

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        ok, reason = super().availability()
        if ok and not has_module("qiskit_aer"):
            reason = "ok (qiskit-aer missing: reference sampler, slower)"
        return ok, reason

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        require("qiskit_optimization", "QAOA")
        from qiskit_optimization import QuadraticProgram
        from qiskit_optimization.converters import QuadraticProgramToQubo
        from qiskit_optimization.minimum_eigensolvers import QAOA

        if options.form not in ("xy", "penalty"):
            raise SolverError(f"form must be 'xy' or 'penalty', got {options.form!r}.")
        for label in ("reps", "shots", "maxiter"):
            check_int(f"option {label!r}", getattr(options, label), 1, error=SolverError)
        if options.cvar is not None and not (0 < options.cvar <= 1):
            raise SolverError(f"cvar must be in (0, 1] or None, got {options.cvar!r}.")
        n, r = problem.n_free, problem.r
        Q = problem.Q
        scale = float(np.abs(Q).max()) if Q.size else 1.0
        scale = scale if scale > 0 else 1.0

        # the reduced problem as a QuadraticProgram over the free blocks, energies divided by `scale`
        qp = QuadraticProgram("cbo_reduced")
        names = [f"y{i}" for i in range(n)]
        for v in names:
            qp.binary_var(v)
        iu, ju = np.triu_indices(n, 1)
        quad = {(names[i], names[j]): float(Q[i, j] / scale) for i, j in zip(iu, ju) if Q[i, j] != 0}
        qp.minimize(linear={v: float(Q[i, i] / scale) for i, v in enumerate(names)}, quadratic=quad)
        penalty = None
        if options.form == "penalty":
            qp.linear_constraint({v: 1 for v in names}, "==", r, "remove_M")
            _add_side_constraints(qp, problem, names)
            penalty = _penalty(options.penalty, problem, scale)
            qubo_qp = QuadraticProgramToQubo(penalty=penalty).convert(qp)
        else:
            qubo_qp = qp
        qubits = qubo_qp.get_num_vars()
        if qubits > MAX_QUBITS and not options.force:
            raise SolverUnavailableError(
                f"QAOA here is a state-vector simulation, limited to {MAX_QUBITS} qubits; this problem needs "
                f"{qubits} ({n} free blocks{' plus slack variables' if qubits > n else ''}). Use solver='swap-sa' "
                "or 'enumerate', fix blocks with keep/force, or pass force=True to simulate anyway."
            )
        if n == 0:
            Y = np.zeros((1, 0), dtype=np.uint8)
            return SolverOutput(problem.expand(Y), exact=False, info={"qubits": 0, "feasible_fraction": 1.0})

        seed = int(problem.seed % (2**31))
        sampler, pm, backend = make_sampler(int(options.shots), seed, options.backend, int(options.threads))
        sampler = ReusingSampler(sampler)
        rng = np.random.default_rng([problem.seed, 0x0A0A])
        p = int(options.reps)
        # linear-ramp start (γ rising, β falling), jittered by the seed
        ramp = (np.arange(p) + 0.5) / p
        initial = np.concatenate([0.8 * (1 - ramp), 0.8 * ramp]) + rng.normal(scale=0.05, size=2 * p)
        kwargs: dict[str, Any] = {"reps": p, "initial_point": initial, "pass_manager": pm}
        if options.cvar is not None:
            kwargs["aggregation"] = float(options.cvar)
        if options.form == "xy":
            kwargs["initial_state"] = dicke_circuit(n, r)
            kwargs["mixer"] = xy_mixer(n, options.mixer)
        operator, _ = qubo_qp.to_ising()
        record: dict[str, Any] = {"timed_out": False}
        qaoa = QAOA(sampler, _cobyla(int(options.maxiter), problem, record), **kwargs)
        try:
            result = qaoa.compute_minimum_eigenvalue(operator)
        except Exception as exc:  # qiskit raises its own error types; name the solver and the cause
            raise SolverError(f"QAOA failed: {type(exc).__name__}: {exc}") from exc
        dist = result.eigenstate
        keys = np.array(list(dist.keys()), dtype=np.int64)
        prob = np.array(list(dist.values()), dtype=np.float64)
        # bit q of an outcome is qubit q, which to_ising assigned to variable q of qubo_qp
        cols = np.array([qubo_qp.variables_index[v] for v in names], dtype=np.int64)
        Y = ((keys[:, None] >> cols[None, :]) & 1).astype(np.uint8)
        X = problem.expand(Y)
        ok = problem.qubo.feasible(X, problem.remove)
        E = problem.qubo.energy(X)
        p_feasible = float(prob[ok].sum())
        best = int(np.argmin(np.where(ok, E, np.inf))) if ok.any() else -1
        top = np.argsort(-prob, kind="stable")[:_KEEP_SAMPLES]
        info: dict[str, Any] = {
            "form": options.form,
            "qubits": int(qubits),
            "reps": p,
            "shots": int(options.shots),
            "backend": backend,
            "optimal_parameters": [float(v) for v in np.ravel(getattr(result, "optimal_point", []))],
            "evaluations": int(getattr(result, "cost_function_evals", 0) or 0),
            "timed_out": record["timed_out"],
            "slowest_evaluation_seconds": record.get("slowest_evaluation_seconds", 0.0),
            "final_sampling_reused": sampler.reused > 0,
            "mean_energy": float(prob @ E / prob.sum()),
            "mean_feasible_energy": float(prob[ok] @ E[ok] / prob[ok].sum()) if ok.any() else None,
            "distinct_samples": int(len(keys)),
            "feasible_fraction": p_feasible,
            "best_sample_probability": float(prob[best]) if best >= 0 else 0.0,
            "samples": [
                {
                    "removed": [int(i) for i in np.flatnonzero(X[t])],
                    "probability": float(prob[t]),
                    "energy": float(E[t]),
                    "feasible": bool(ok[t]),
                }
                for t in top
            ],
        }
        if options.form == "penalty":
            info["penalty"] = None if penalty is None else penalty * scale
        if not ok.any():
            info["hint"] = (
                f"no QAOA sample was feasible (P(feasible) = {p_feasible:.2g}); use form='xy', more shots, or "
                "a larger penalty"
            )
        return SolverOutput(X, exact=False, info=info)


class ReusingSampler:
    """A sampler (V2 interface) that answers a repeated one-pub run with the job that first sampled those
    parameters.

    QAOA samples the circuit at every optimizer step and once more at the best angles at the end; those angles
    were sampled at one of the steps, so the final distribution comes from that step's job (the same shots) at
    no cost, and a time limit loses no evaluation to it.
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.jobs: dict[bytes, Any] = {}
        self.reused = 0

    def run(self, pubs: Any, **options: Any) -> Any:
        pubs = list(pubs)
        key = None
        if len(pubs) == 1 and isinstance(pubs[0], tuple) and len(pubs[0]) == 2 and not options:
            key = np.asarray(pubs[0][1], dtype=np.float64).tobytes()
            if key in self.jobs:
                self.reused += 1
                return self.jobs[key]
        job = self.sampler.run(pubs, **options)
        if key is not None:
            self.jobs[key] = job
        return job


def _cobyla(maxiter: int, problem: Problem, record: dict[str, Any]) -> Any:
    """COBYLA (scipy) as a qiskit ``Minimizer`` that stops with the best angles so far on Ctrl-C or before the
    time limit: an evaluation starts only while it still fits, judged from the slowest evaluation so far (the
    final sampling reuses an evaluation's shots: :class:`ReusingSampler`)."""
    from qiskit_optimization.optimizers import OptimizerResult
    from scipy.optimize import minimize

    class _Stop(Exception):
        pass

    def minimizer(fun: Any, x0: Any, jac: Any = None, bounds: Any = None) -> Any:
        best = {"x": np.asarray(x0, dtype=float), "f": np.inf, "n": 0, "slowest": 0.0}

        def f(x: np.ndarray) -> float:
            if problem.interrupted or problem.time_left() < best["slowest"]:
                raise _Stop
            t0 = time.perf_counter()
            v = float(fun(x))
            best["slowest"] = max(best["slowest"], time.perf_counter() - t0)
            best["n"] += 1
            if v < best["f"]:
                best.update(x=np.array(x, dtype=float), f=v)
            return v

        try:
            if problem.time_left() <= 0:  # the set-up used the time: sample the starting angles only
                raise _Stop
            minimize(f, x0, method="COBYLA", options={"maxiter": maxiter})
        except _Stop:
            record["timed_out"] = not problem.interrupted
        record["slowest_evaluation_seconds"] = best["slowest"]
        res = OptimizerResult()
        res.x, res.fun, res.nfev = best["x"], best["f"], best["n"]
        return res

    return minimizer


def _penalty(penalty: Any, problem: Problem, scale: float) -> float | None:
    if penalty is None:
        return None
    if penalty == "safe":
        return reduced_safe_penalty(problem) / scale
    if not is_number(penalty) or not penalty > 0:
        raise SolverError(f"penalty must be None, 'safe' or a number > 0, got {penalty!r}.")
    return float(penalty) / scale


def _add_side_constraints(qp: Any, problem: Problem, names: list[str]) -> None:
    fc = FreeConstraints.from_problem(problem)
    for g in range(len(fc.cap)):
        members = {names[i]: 1 for i in range(len(names)) if fc.kind[i] == g}
        if members and fc.cap[g] < len(members):
            qp.linear_constraint(members, "<=", int(fc.cap[g]), f"cap_{g}")
    sizes = {v: int(s) for v, s in zip(names, fc.size)}
    if fc.has_max_params:
        qp.linear_constraint(sizes, "<=", int(fc.pmax), "max_params")
    if fc.has_min_params:
        qp.linear_constraint(sizes, ">=", int(fc.pmin), "min_params")
