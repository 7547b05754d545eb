"""``solver="auto"``: exact enumeration when it fits the time budget, else the swap heuristics.

The feasible space has C(n_free, r) states. Full enumeration visits them at roughly
``GPU_RATE`` states/s on a data-centre GPU and ``CPU_RATE_PER_THREAD`` per CPU thread (the CPU
enumerator's lower bound usually prunes most of them, so the CPU estimate is conservative). If the
estimate fits the budget (the call's ``time_limit``, else ``budget`` seconds), the exact enumerator
runs — on the GPU when one is usable and no caps/parameter budget apply — otherwise the heuristic:
``swap-sa`` and ``swap-tabu`` both run (sharing a time limit) and their states are merged. On the
default model's sublayer QUBO (N = 60, M = 30) swap-sa with its default schedule missed part of the
best-known top-10 (recall 0.3–0.8 over seeds); with a 3x longer schedule (1000 sweeps) and swap-tabu's
states merged in, the top-10 was found on all six seeds tried, in about 2 s (``benchmarks/solvers.py``
measures it).
The choice and the reason are recorded in ``info["auto_choice"]`` / ``info["auto_reason"]``, and
the result's solver name reads e.g. ``"auto→enumerate"``. A ``backend`` other than ``"local"`` (Ray, the
GPU) is a backend of the exact enumerator: auto then runs the enumerator on it.

Between the two, when full enumeration would take up to ``ATTEMPT_FACTOR`` times the budget, the
CPU enumerator (whose lower bound often prunes most of the space at small M) is tried for the
budget; if it does not finish, the heuristic runs as well and the states of all are merged (inexact).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cbo.errors import SolverOptionError
from cbo.solvers.base import Problem, Solver, SolverOutput, get, register, run_solver

GPU_RATE = 2e10
CPU_RATE_PER_THREAD = 1e9
ATTEMPT_FACTOR = 100.0
HEURISTIC = "swap-sa+swap-tabu"  # the choice's name: both swap heuristics, states merged
# the annealer's schedule inside auto: 1000 sweeps per restart instead of its default 300 (on the sublayer
# QUBO at M = 30 the default schedule missed the best-known ground state on most seeds, 1000 sweeps did not)
HEURISTIC_OPTIONS: dict[str, dict[str, Any]] = {"swap-sa": {"sweeps": 1000}, "swap-tabu": {}}


def plan_choice(problem: Problem, budget: float, use_gpu: bool = True) -> tuple[str, str, float]:
    """(choice, reason, estimated full-enumeration seconds) for a problem and a time budget.

    choice is ``"enumerate-gpu"`` or ``"enumerate"`` when full enumeration fits the budget,
    ``"attempt"`` when it does not but is within ``ATTEMPT_FACTOR`` of it (the CPU enumerator's lower
    bound often prunes enough: try it for the budget, fall back to the heuristic), else ``HEURISTIC``.
    """
    n, r = problem.n_free, problem.r
    states = math.comb(n, r)
    gpu_ok = False
    gpu_reason = "GPU not considered"
    if use_gpu:
        gpu_ok, gpu_reason = get("enumerate-gpu").availability()
        gpu_reason = gpu_reason.split(";")[0]
        if gpu_ok and problem.has_side_constraints:
            gpu_ok, gpu_reason = False, "caps/parameter budget need the CPU enumerator"
        if gpu_ok and n > 128:
            gpu_ok, gpu_reason = False, "more than 128 free blocks"
    space = f"C({n},{r}) = {states:.3g} states"
    if gpu_ok:
        est = states / GPU_RATE
        if est <= budget:
            return "enumerate-gpu", f"{space}, about {est:.3g} s on the GPU, within the {budget:.3g} s budget", est
    threads = os.cpu_count() or 1
    est = states / (CPU_RATE_PER_THREAD * threads)
    cpu = f"{est:.3g} s to enumerate fully on {threads} CPU thread(s)"
    nogpu = "" if gpu_ok or not use_gpu else f" (no GPU: {gpu_reason})"
    if est <= budget:
        return "enumerate", f"{space}, at most {cpu}, within the {budget:.3g} s budget{nogpu}", est
    if est <= ATTEMPT_FACTOR * budget:
        return (
            "attempt",
            f"{space}, up to {cpu}; the bounded CPU enumerator gets the {budget:.3g} s budget{nogpu}",
            est,
        )
    return HEURISTIC, f"{space} would take {cpu}, far over the {budget:.3g} s budget{nogpu}; heuristic", est


@register
class AutoSolver(Solver):
    """Pick exact enumeration (GPU if usable) when it fits the time budget, else swap-sa + swap-tabu."""

    name = "auto"
    description = "exact enumeration when it fits the time budget (GPU if available), else swap-sa + swap-tabu"

    @dataclass
    class Options:
        """Settings of the automatic choice.

        Attributes:
            budget: seconds enumeration may take when ``solve`` gets no time_limit.
            use_gpu: consider the GPU enumerator.
            backend / backend_options: passed to the exact enumerator; any backend but ``"local"``
                (e.g. ``"ray"``) makes auto run the enumerator there.
        """

        budget: float = 10.0
        use_gpu: bool = True
        backend: Any = "local"
        backend_options: dict[str, Any] | None = None

        def validate(self) -> None:
            if isinstance(self.budget, bool) or not isinstance(self.budget, (int, float)) or not self.budget > 0:
                raise SolverOptionError(f"budget must be > 0 seconds, got {self.budget!r}.")
            if self.backend != "local" or self.backend_options is not None:
                # the enumerator checks (and normalizes) its backend settings before any work starts
                checked = get("enumerate").make_options(
                    {"backend": self.backend, "backend_options": self.backend_options}
                )
                self.backend, self.backend_options = checked.backend, checked.backend_options

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        if options.backend != "local":
            out = run_solver("enumerate", problem, backend=options.backend, backend_options=options.backend_options)
            reason = f"backend={options.backend!r} is a backend of the exact enumerator"
            return _recorded(out, "enumerate", reason, None, {})
        limited = problem.time_limit is not None
        budget = problem.time_left() if limited else float(options.budget)
        choice, reason, est = plan_choice(problem, budget, bool(options.use_gpu))
        extra: dict[str, Any] = {}
        if choice == "attempt":
            # leave part of a user time limit for the fallback
            sub = replace(problem, time_limit=problem.elapsed() + (0.7 * budget if limited else budget))
            out = run_solver("enumerate", sub)
            extra["auto_attempt_seconds"] = sub.elapsed()
            if out.exact:
                choice, reason = "enumerate", reason + f"; it finished in {sub.elapsed():.3g} s (exact)"
            else:
                fallback = _heuristic(problem)
                reason += "; it did not finish, so the heuristics ran too and the states of all are merged"
                out = SolverOutput(
                    np.concatenate([out.candidates, fallback.candidates]),
                    exact=False,
                    info={**fallback.info, "enumerate_info": out.info},
                )
                choice = HEURISTIC
        elif choice == HEURISTIC:
            out = _heuristic(problem)
        else:
            if not get(choice).availability()[0]:  # e.g. the GPU went away after the check
                choice, reason = HEURISTIC, f"{choice} became unavailable; heuristic"
                out = _heuristic(problem)
            else:
                out = run_solver(choice, problem)
        return _recorded(out, choice, reason, est, extra)


def _recorded(out: SolverOutput, choice: str, reason: str, est: float | None, extra: dict[str, Any]) -> SolverOutput:
    """The chosen solver's output with the choice, its reason and the estimate in the info."""
    info: dict[str, Any] = dict(out.info)
    inner = info.pop("solver_name", choice)
    info.update(extra)
    info["auto_choice"] = choice
    info["auto_reason"] = reason
    info["auto_estimate_seconds"] = est
    info["solver_name"] = f"auto→{inner}"
    return SolverOutput(out.candidates, exact=out.exact, info=info)


def _heuristic(problem: Problem) -> SolverOutput:
    """swap-sa (with half of what is left of a time limit), then swap-tabu (the rest), their states merged."""
    first = problem
    if problem.time_limit is not None:
        first = replace(problem, time_limit=problem.elapsed() + 0.5 * problem.time_left())
    sa = run_solver("swap-sa", first, **HEURISTIC_OPTIONS["swap-sa"])
    tabu = run_solver("swap-tabu", problem, **HEURISTIC_OPTIONS["swap-tabu"])
    info = {**sa.info, "swap_tabu_info": tabu.info, "solver_name": HEURISTIC}
    return SolverOutput(np.concatenate([sa.candidates, tabu.candidates]), exact=False, info=info)
