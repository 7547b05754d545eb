"""The enumerator's relaxation strategy: one :class:`Problem` searched by :mod:`.relaxation_search`.

The free blocks' QUBO (``Problem.Q``, forced blocks folded in) is searched with the caps and the budget net of
the forced blocks; a warm start is the starting threshold. When the short race of the shift (a fraction of a
second) has not proven the answer, the heuristic of ``auto`` (:func:`cbo.solvers.heuristic.run_heuristic`, with
what is left of the time limit, as ``auto`` gives it) runs once before the main search: its states set the
threshold and join the answer, so a time-limited run is never worse than ``auto``'s heuristic. The result is exact only when the search finished. Progress is shown as the fraction of the tree
closed.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from cbo.progress import progress_bar
from cbo.solvers.base import Problem, SolverOutput
from cbo.solvers.constraints import FreeConstraints
from cbo.solvers.enumerate.relaxation_search import search_top_k
from cbo.solvers.heuristic import run_heuristic


def enumerate_by_relaxation(problem: Problem, opts: Any, reason: str = "") -> SolverOutput:
    """The exact top-K of a non-trivial problem (0 < r < n_free) by the relaxation search.

    ``opts`` is the enumerator's ``Options`` (``threads``, ``warm_start``, ``seed_heuristic``, ``alpha``);
    ``reason`` (why this strategy) goes into the info.
    """
    n, r = problem.n_free, problem.r
    constraints = FreeConstraints.from_problem(problem) if problem.has_side_constraints else None
    threshold = np.inf if opts.warm_start is None else float(opts.warm_start) - problem.const
    threads = int(opts.threads) if opts.threads is not None else numba.get_num_threads()
    heuristic_info: dict[str, Any] = {}

    def reseed() -> np.ndarray:
        out = run_heuristic(problem)
        heuristic_info.update(out.info)
        Y = out.candidates[:, problem.free]
        return Y[Y.sum(1) == r]

    bar = progress_bar(
        problem.progress,
        total=100,
        desc=f"enumerate C({n},{r})",
        dynamic_ncols=True,
        bar_format="{desc}: {percentage:5.1f}% of the tree closed |{bar}| {elapsed}{postfix}",
    )

    def progress(covered: float, nodes: int, kth: float) -> None:
        bar.n = round(100.0 * covered, 1)
        bar.set_postfix_str(f"{nodes:.3g} nodes", refresh=False)
        bar.refresh()

    left = problem.time_left()
    try:
        res = search_top_k(
            problem.Q,
            r,
            problem.k,
            constraints=constraints,
            alpha=opts.alpha,
            threshold=threshold,
            time_limit=max(left, 1e-6) if np.isfinite(left) else None,
            threads=threads,
            progress=progress if problem.progress else None,
            stop=lambda: problem.interrupted,
            reseed=reseed if opts.seed_heuristic else None,
        )
    finally:
        bar.close()
    energies, Y = res.energies, res.states
    if opts.warm_start is not None:
        keep = energies + problem.const <= float(opts.warm_start) + 1e-9 * max(1.0, abs(float(opts.warm_start)))
        Y = Y[keep]
    info: dict[str, Any] = {
        "strategy": "relaxation",
        "strategy_reason": reason,
        "threads": threads,
        "nodes": res.nodes,
        "covered": res.covered,
        "alpha": res.alpha,
        "root_bound": res.root_bound + problem.const,
        "shor_bound": None if res.info["shor_bound"] is None else res.info["shor_bound"] + problem.const,
        "subtrees": res.info.get("subtrees", 1),
        "race": res.info["race"],
        "heuristic_seeds": res.info["reseeded"],
        "interrupted": bool(res.info.get("interrupted", False)),
        "timed_out": bool(res.info.get("timed_out", False)),
        "search_seconds": res.seconds,
    }
    if heuristic_info:
        info["heuristic_info"] = {k: v for k, v in heuristic_info.items() if k != "solver_name"}
    if opts.warm_start is not None:
        info["warm_start"] = float(opts.warm_start)
    if not len(Y) and constraints is not None and res.exact:
        info["hint"] = "no state satisfies the caps and the parameter budget together"
    return SolverOutput(problem.expand(Y), exact=res.exact, info=info)
