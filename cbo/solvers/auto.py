"""``solver="auto"``: the exact enumerator when it can prove the answer in the time budget, else the heuristic.

If a GPU is usable and full enumeration fits the budget (the call's ``time_limit``, else ``budget`` seconds),
the GPU enumerator runs. Otherwise the CPU enumerator's strategy decides (:mod:`cbo.solvers.enumerate.strategy`):

* the relaxation branch and bound (large spaces, up to 256 free blocks): the enumerator runs for the budget,
  seeding itself with the heuristic's states when its first fraction of a second did not prove the answer; it
  returns the proven top-K when it finishes, else the best states of both (inexact) — never worse than the
  heuristic alone.
* lexicographic enumeration: full enumeration at roughly ``CPU_RATE_PER_THREAD`` states/s per thread (its
  lower bound usually prunes most of the space, so the estimate is conservative). If the estimate fits the
  budget the enumerator runs; up to ``ATTEMPT_FACTOR`` times the budget it is tried for the budget and, if it
  does not finish, the heuristic runs too and the states of all are merged (inexact); beyond that the
  heuristic (:mod:`cbo.solvers.heuristic`: ``swap-sa`` and ``swap-tabu``, sharing a time limit) runs alone.

The choice and the reason are recorded in ``info["auto_choice"]`` / ``info["auto_reason"]``, and the result's
solver name reads e.g. ``"auto→enumerate"``. A ``backend`` other than ``"local"`` (Ray, the GPU) is a backend of
the exact enumerator: auto then runs the enumerator on it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cbo.checks import is_number
from cbo.errors import SolverOptionError
from cbo.solvers.base import Problem, Solver, SolverOutput, get, register, run_solver
from cbo.solvers.enumerate.strategy import choose_strategy
from cbo.solvers.heuristic import HEURISTIC, run_heuristic

GPU_RATE = 2e10
CPU_RATE_PER_THREAD = 1e9
ATTEMPT_FACTOR = 100.0


def plan_choice(problem: Problem, budget: float, use_gpu: bool = True) -> tuple[str, str, float | None]:
    """(choice, reason, estimated full-enumeration seconds or None) for a problem and a time budget.

    choice is ``"enumerate-gpu"`` or ``"enumerate"`` when full enumeration fits the budget,
    ``"relaxation"`` when the CPU enumerator's relaxation search gets the budget (it seeds itself with the
    heuristic), ``"attempt"`` when lexicographic enumeration does not fit but is within ``ATTEMPT_FACTOR`` of
    it (its lower bound often prunes enough: try it for the budget, fall back to the heuristic), else
    ``HEURISTIC``.
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
    strategy, why = choose_strategy(problem)
    if strategy == "relaxation":
        nogpu = "" if gpu_ok or not use_gpu else f" (no GPU: {gpu_reason})"
        return (
            "relaxation",
            f"{why}{nogpu}; it gets the {budget:.3g} s budget, seeded with the heuristic ({HEURISTIC})",
            None,
        )
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
            if not is_number(self.budget) or not self.budget > 0:
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
        if choice == "relaxation":
            sub = problem if limited else replace(problem, time_limit=problem.elapsed() + budget)
            out = run_solver("enumerate", sub, strategy="relaxation")
            choice = "enumerate"
            if out.exact:
                reason += f"; it finished in {sub.elapsed():.3g} s (exact)"
            else:
                reason += "; it did not finish: its best states and the heuristic's (inexact)"
        elif choice == "attempt":
            # leave part of a user time limit for the fallback
            sub = replace(problem, time_limit=problem.elapsed() + (0.7 * budget if limited else budget))
            out = run_solver("enumerate", sub)
            extra["auto_attempt_seconds"] = sub.elapsed()
            if out.exact:
                choice, reason = "enumerate", reason + f"; it finished in {sub.elapsed():.3g} s (exact)"
            else:
                fallback = run_heuristic(problem)
                reason += "; it did not finish, so the heuristics ran too and the states of all are merged"
                out = SolverOutput(
                    np.concatenate([out.candidates, fallback.candidates]),
                    exact=False,
                    info={**fallback.info, "enumerate_info": out.info},
                )
                choice = HEURISTIC
        elif choice == HEURISTIC:
            out = run_heuristic(problem)
        else:
            if not get(choice).availability()[0]:  # e.g. the GPU went away after the check
                choice, reason = HEURISTIC, f"{choice} became unavailable; heuristic"
                out = run_heuristic(problem)
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
