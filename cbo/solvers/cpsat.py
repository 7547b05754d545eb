"""OR-Tools CP-SAT: exact top-K with a proof, by repeated solves with no-good cuts.

The energy over the free blocks is ``Σ_i Q_ii y_i + Σ_{i<j} Q_ij y_i y_j``. CP-SAT works on
integers, so every coefficient is scaled by ``s`` and rounded; a state's scaled energy is then off
by at most ``ε = ½(r + r(r−1)/2)`` units, i.e. ``ε/s`` in energy (``info["energy_precision"]``).
Products are linearized with one boolean ``z_ij`` per non-zero coupling, constrained only in the
direction the objective needs (``z ≥ y_i + y_j − 1`` when the coupling costs, ``z ≤ y_i, z ≤ y_j``
when it pays); the ``"rlt"`` formulation makes every ``z`` an exact product and adds
``Σ_j z_ij = (r−1) y_i`` (the cardinality constraint multiplied by ``y_i``), which tightens the
relaxation. Σx = M, caps and the parameter budget are native linear constraints.

Top-K: solve, cut the optimum off (``Σ_{i∈S} y_i ≤ r − 1``), solve again, K times. Because of the
rounding, solving continues past K while a state not yet found could still beat the K-th by exact
energy; the found states are then re-ranked by exact energy. Pairs of returned states whose
energies differ by less than the precision are listed in ``info["close_pairs"]``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from cbo.checks import check_int
from cbo.errors import SolverError
from cbo.extras import require
from cbo.solvers.base import Problem, Solver, SolverOutput, register
from cbo.solvers.constraints import FreeConstraints

_DEFAULT_MAX_TIME = 60.0


@register
class CPSat(Solver):
    """Exact top-K by OR-Tools CP-SAT branch-and-bound with no-good cuts."""

    name = "cpsat"
    aliases = ("ortools", "cp-sat")
    exact = True
    description = "OR-Tools CP-SAT: proven top-K by no-good cuts (integer-scaled energies)"
    requires = ("ortools",)

    @dataclass
    class Options:
        """Settings of the CP-SAT solver.

        Attributes:
            scale: integer scale of the energies; None picks 1e6 / (largest |coefficient|).
            precision: wanted bound on a state's energy error (overrides ``scale``).
            formulation: "rlt" (exact products + Σ_j z_ij = (r−1) y_i) or "minimal" (one-sided).
            workers: CP-SAT search workers (default: the CPU count, at most 8).
            max_time: seconds for the whole top-K when ``solve`` gets no time_limit.
            max_extra: most extra solves past K spent proving that no state within the precision of
                the K-th was missed (default 0: the result is the proven top-K of the scaled
                energy, exact up to ``energy_precision``; info["settled"] says whether it was proven
                for the exact energy too).
        """

        scale: float | None = None
        precision: float | None = None
        formulation: str = "rlt"
        workers: int | None = None
        max_time: float = _DEFAULT_MAX_TIME
        max_extra: int = 0

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        cp = require("ortools.sat.python.cp_model", "the CP-SAT solver")
        if options.formulation not in ("rlt", "minimal"):
            raise SolverError(f"formulation must be 'rlt' or 'minimal', got {options.formulation!r}.")
        workers = options.workers if options.workers is not None else min(8, os.cpu_count() or 1)
        workers = check_int("workers", workers, 1, error=SolverError)
        if not (options.max_time and options.max_time > 0):
            raise SolverError(f"max_time must be > 0 seconds, got {options.max_time!r}.")
        deadline = problem.time_limit if problem.time_limit is not None else float(options.max_time)
        n, r, k = problem.n_free, problem.r, problem.k
        Q = problem.Q
        n_terms = r + r * (r - 1) // 2
        scale = _scale(Q, n_terms, options.scale, options.precision)
        eps_units = 0.5 * n_terms
        precision = eps_units / scale

        model = cp.CpModel()
        y = [model.new_bool_var(f"y{i}") for i in range(n)]
        lin = np.rint(np.diag(Q) * scale).astype(np.int64)
        terms_v: list[Any] = list(y)
        terms_c: list[int] = [int(c) for c in lin]
        iu, ju = np.triu_indices(n, 1)
        quad = np.rint(Q[iu, ju] * scale).astype(np.int64)
        rows: list[list[Any]] = [[] for _ in range(n)]
        for i, j, c in zip(iu.tolist(), ju.tolist(), quad.tolist()):
            if c == 0 and options.formulation == "minimal":
                continue
            z = model.new_bool_var(f"z{i}_{j}")
            if c > 0 or options.formulation == "rlt":
                model.add_bool_or([y[i].Not(), y[j].Not(), z])  # z ≥ y_i + y_j − 1
            if c < 0 or options.formulation == "rlt":
                model.add_implication(z, y[i])
                model.add_implication(z, y[j])
            rows[i].append(z)
            rows[j].append(z)
            if c != 0:
                terms_v.append(z)
                terms_c.append(int(c))
        model.add(sum(y) == r)
        if options.formulation == "rlt" and r >= 1:
            for i in range(n):
                if rows[i]:
                    model.add(sum(rows[i]) == (r - 1) * y[i])
        fc = FreeConstraints.from_problem(problem)
        for g in range(len(fc.cap)):
            members = [y[i] for i in range(n) if fc.kind[i] == g]
            if fc.cap[g] < len(members):
                model.add(sum(members) <= int(fc.cap[g]))
        if fc.has_max_params:
            model.add(sum(int(s) * v for s, v in zip(fc.size, y)) <= int(fc.pmax))
        if fc.has_min_params:
            model.add(sum(int(s) * v for s, v in zip(fc.size, y)) >= int(fc.pmin))
        model.minimize(cp.LinearExpr.weighted_sum(terms_v, terms_c))

        solver = cp.CpSolver()
        solver.parameters.num_workers = int(workers)
        solver.parameters.random_seed = int(problem.seed % (2**31))
        solver.parameters.catch_sigint_signal = False  # Ctrl-C reaches solve()'s handler: see solve_stoppable
        max_extra = int(options.max_extra)
        if max_extra < 0:
            raise SolverError(f"max_extra must be >= 0, got {options.max_extra!r}.")
        found: list[np.ndarray] = []
        objs: list[int] = []
        proven = True
        settled = False
        stop_reason = "k states proven"
        statuses: list[str] = []
        while True:
            left = deadline - problem.elapsed()
            if left <= 0 or problem.interrupted:
                proven, stop_reason = False, "interrupted" if problem.interrupted else "time limit"
                break
            solver.parameters.max_time_in_seconds = float(left)
            status = solve_stoppable(solver, model, problem)
            statuses.append(solver.status_name(status))
            if problem.interrupted and status != cp.OPTIMAL:
                proven, stop_reason = False, "interrupted"
                if status == cp.FEASIBLE:
                    found.append(np.array([solver.boolean_value(v) for v in y], dtype=np.uint8))
                    objs.append(int(round(solver.objective_value)))
                break
            if status == cp.INFEASIBLE:
                stop_reason = f"only {len(found)} feasible states exist"
                settled = True
                break
            if status not in (cp.OPTIMAL, cp.FEASIBLE):
                proven, stop_reason = False, "time limit" if problem.elapsed() >= deadline else "no solution"
                break
            if status != cp.OPTIMAL:
                proven = False
            state = np.array([solver.boolean_value(v) for v in y], dtype=np.uint8)
            found.append(state)
            objs.append(int(round(solver.objective_value)))
            ones = [y[i] for i in np.flatnonzero(state)]
            if r == 0 or r == n:
                stop_reason = "the only feasible state"
                settled = True
                break
            model.add(sum(ones) <= r - 1)
            if status != cp.OPTIMAL:
                proven, stop_reason = False, "time limit"
                break
            if len(found) >= k:
                # a state not found yet has scaled energy >= objs[-1] - eps; once that cannot beat
                # the k-th best exact energy among the found states, the exact top-k is settled
                e_k = np.sort(_energies(Q, found))[k - 1] * scale
                if objs[-1] - eps_units > e_k:
                    settled = True
                    break
                if len(found) >= k + max_extra:
                    break
        if found:
            Y = np.array(found)
            E = _energies(Q, Y) + problem.const
        else:
            Y = np.zeros((0, n), dtype=np.uint8)
            E = np.zeros(0)
        info: dict[str, Any] = {
            "scale": scale,
            "energy_precision": precision,
            "formulation": options.formulation,
            "solves": len(statuses),
            "statuses": statuses,
            "stop_reason": stop_reason,
            "proven": proven and len(found) > 0,
            # settled: no state missing from the list can beat the k-th by exact energy; otherwise the
            # list is the proven top-k of the scaled energy, exact up to energy_precision
            "settled": settled,
            "close_pairs": _close_pairs(problem, Y, E, 2 * precision, k),
            "workers": int(workers),
            "feasible_fraction": 1.0,
        }
        if not found:
            info["hint"] = f"CP-SAT found no state within {deadline:.3g} s; raise time_limit"
        return SolverOutput(problem.expand(Y), exact=bool(info["proven"]), info=info)


def solve_stoppable(solver: Any, model: Any, problem: Problem) -> Any:
    """``solver.solve(model)`` in a worker thread (CP-SAT releases the GIL) while this thread watches for
    Ctrl-C (``problem.interrupted``) and stops the search, which then returns its best solution so far."""
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["status"] = solver.solve(model)
        except BaseException as exc:  # re-raised in the calling thread
            result["error"] = exc

    worker = threading.Thread(target=work, name="cbo-cpsat", daemon=True)
    worker.start()
    stopped = False
    while worker.is_alive():
        worker.join(timeout=0.05)
        if problem.interrupted and not stopped:
            solver.stop_search()
            stopped = True
    if "error" in result:
        raise result["error"]
    return result["status"]


def _scale(Q: np.ndarray, n_terms: int, scale: float | None, precision: float | None) -> float:
    if precision is not None:
        if not (precision > 0):
            raise SolverError(f"precision must be > 0, got {precision!r}.")
        s = 0.5 * max(1, n_terms) / float(precision)
    elif scale is not None:
        if not (scale > 0) or not np.isfinite(scale):
            raise SolverError(f"scale must be a finite number > 0, got {scale!r}.")
        s = float(scale)
    else:
        m = float(np.abs(Q).max()) if Q.size else 0.0
        s = 1e6 / m if m > 0 else 1.0
    biggest = float(np.abs(Q).max()) * s if Q.size else 0.0
    if biggest * max(1, Q.shape[0] ** 2) > 2**62:
        raise SolverError(
            f"scale {s:.3g} makes integer coefficients up to {biggest:.3g}, which overflows CP-SAT's int64 "
            "objective; use a smaller scale or a coarser precision."
        )
    return s


def _energies(Q: np.ndarray, Y: Any) -> np.ndarray:
    Y = np.atleast_2d(np.asarray(Y, dtype=np.float64))
    D = np.diag(Q)
    off = Q - np.diag(D)
    return Y @ D + 0.5 * np.einsum("bi,ij,bj->b", Y, off, Y)


def _close_pairs(problem: Problem, Y: np.ndarray, E: np.ndarray, tol: float, k: int) -> list[dict[str, Any]]:
    """Neighbouring states (by exact energy, among the best k) closer in energy than ``tol``."""
    if len(E) < 2:
        return []
    order = np.argsort(E, kind="stable")[:k]
    out = []
    for a, b in zip(order[:-1], order[1:]):
        d = float(E[b] - E[a])
        if d < tol:
            out.append(
                {
                    "removed_a": [int(problem.free[i]) for i in np.flatnonzero(Y[a])] + list(map(int, problem.forced)),
                    "removed_b": [int(problem.free[i]) for i in np.flatnonzero(Y[b])] + list(map(int, problem.forced)),
                    "energy_difference": d,
                }
            )
    return out
