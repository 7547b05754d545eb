"""The penalty form shared by samplers of unconstrained models: E + λ(Σx − M)² as a dimod BQM.

Samplers of an unconstrained BQM (:mod:`cbo.solvers.ocean`) see Σx = M only as a penalty. Keep and
force are not penalized: those variables are fixed in the BQM before sampling. Per-kind caps and the
parameter budget are not encoded (they would need slack variables); samples that break them are dropped.
Every result is filtered to feasible states, deduplicated and re-scored exactly.

Penalty choices (option ``penalty``):

* ``"safe"``: the provably safe λ of the reduced problem (no infeasible state undercuts the best
  feasible one). Correct, but it makes the landscape so steep that annealing rarely reaches the
  feasible ground state.
* a number: that λ.
* ``"adaptive"``: start at the safe λ and halve it while at least ``feasible_threshold`` of the
  samples stay feasible; the states of every round are pooled and the λ path is recorded.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from cbo.checks import check_int, is_number
from cbo.errors import SolverError, SolverOptionError
from cbo.solvers.base import Problem, Solver, SolverOutput


def reduced_safe_penalty(problem: Problem) -> float:
    """``BlockQUBO.safe_penalty``'s bound taken over the free blocks (forced blocks folded in).

    With keep/force fixed in the BQM, only the free variables can leave Σx = M, so the bound over
    them suffices; it is never larger than the bound over all blocks.
    """
    Q = problem.Q
    if Q.size == 0:
        return 1.0
    off = np.abs(Q).sum(1) - np.abs(np.diag(Q))
    delta = float(np.max(np.abs(np.diag(Q)) + off))
    return 1.01 * delta + 1e-9 if delta > 0 else 1.0


def penalty_bqm(problem: Problem, lam: float) -> Any:
    """The BQM of E + λ(Σx − M)² over the free blocks (keep fixed to 0, force to 1)."""
    q = problem.qubo
    bqm = q.to_bqm(problem.remove, lam)
    fixed = {q.names[i]: 0 for i in q.constraints.keep}
    fixed.update({q.names[i]: 1 for i in q.constraints.force})
    if fixed:
        bqm.fix_variables(fixed)
    return bqm


def sampleset_states(problem: Problem, sampleset: Any) -> tuple[np.ndarray, np.ndarray]:
    """(full states, occurrences) from a sampleset over the free blocks' names."""
    q = problem.qubo
    index = {name: i for i, name in enumerate(q.names)}
    rec = sampleset.record
    labels = list(sampleset.variables)
    try:
        cols = np.array([index[v] for v in labels], dtype=np.int64)
    except KeyError as exc:
        raise SolverError(f"the sampler returned a variable {exc.args[0]!r} that is not a block name.") from None
    S = np.asarray(rec.sample)
    if S.size and S.min() < 0:  # a SPIN-valued sampler: -1/+1 -> 0/1
        S = (S + 1) // 2
    X = np.zeros((S.shape[0], q.n), dtype=np.uint8)
    X[:, cols] = S.astype(np.uint8)
    if len(problem.forced):
        X[:, problem.forced] = 1
    occ = np.asarray(rec.num_occurrences, dtype=np.int64) if "num_occurrences" in rec.dtype.names else None
    if occ is None:
        occ = np.ones(S.shape[0], dtype=np.int64)
    return X, occ


def parse_penalty(penalty: Any, default_adaptive: bool) -> str | float:
    """``"safe"``, ``"adaptive"`` or λ > 0 from the ``penalty`` option (None: the solver's default)."""
    if penalty is None:
        return "adaptive" if default_adaptive else "safe"
    if isinstance(penalty, str):
        if penalty not in ("safe", "adaptive"):
            raise SolverOptionError(f"penalty must be 'safe', 'adaptive' or a number > 0, got {penalty!r}.")
        return penalty
    if not is_number(penalty) or not np.isfinite(penalty):
        raise SolverOptionError(f"penalty must be 'safe', 'adaptive' or a number > 0, got {penalty!r}.")
    if penalty <= 0:
        raise SolverOptionError(f"penalty must be > 0, got {penalty!r}.")
    return float(penalty)


def positive(v: Any, label: str) -> int:
    """``v`` as an int, or SolverOptionError naming the option when it is not an integer >= 1."""
    return check_int(f"option {label!r}", v, 1, error=SolverOptionError)


def round_seed(problem: Problem, round_: int) -> int:
    """The sampler seed of one λ round, derived from the solve's seed."""
    return int((problem.seed * 1000003 + round_ * 7919) % (2**31 - 1))


@dataclass
class PenaltyOptions:
    """Settings every penalty solver has (its own ``Options`` extend them).

    Attributes:
        penalty: "safe", "adaptive", or a number λ (the default depends on the solver).
        feasible_threshold: adaptive λ stops halving once fewer samples than this are feasible.
        max_rounds: most λ values tried by the adaptive search.
        factor: λ multiplier between adaptive rounds.
    """

    penalty: Any = "safe"
    feasible_threshold: float = 0.05
    max_rounds: int = 12
    factor: float = 0.5


class PenaltySolver(Solver):
    """Shared driver: build the penalty BQM, sample, filter, and (adaptive) search λ downward."""

    default_adaptive: ClassVar[bool] = False

    @abc.abstractmethod
    def sample(self, bqm: Any, problem: Problem, options: Any, round_: int) -> Any:
        """One dimod SampleSet of ``bqm`` for λ round ``round_``."""

    def run(self, problem: Problem, options: Any) -> SolverOutput:
        mode = parse_penalty(options.penalty, self.default_adaptive)
        if problem.n_free == 0:
            # keep and force fix every block: the BQM has no variable left and some samplers return no sample
            info = {"penalty_mode": mode if isinstance(mode, str) else "fixed", "num_reads": 0}
            return SolverOutput(problem.expand(np.zeros((1, 0))), exact=False, info={**info, "feasible_fraction": 1.0})
        safe = reduced_safe_penalty(problem)
        lam = safe if mode in ("safe", "adaptive") else float(mode)
        threshold = float(options.feasible_threshold)
        max_rounds = int(options.max_rounds) if mode == "adaptive" else 1
        factor = float(options.factor)
        if mode == "adaptive" and not (0 < factor < 1):
            raise SolverOptionError(f"factor must be in (0, 1), got {factor!r}.")
        if max_rounds < 1:
            raise SolverOptionError(f"max_rounds must be >= 1, got {max_rounds!r}.")
        q = problem.qubo
        pieces, path = [], []
        best = (np.inf, lam)
        total_reads = 0
        timed_out = False
        for rnd in range(max_rounds):
            bqm = penalty_bqm(problem, lam)
            ss = self.sample(bqm, problem, options, rnd)
            X, occ = sampleset_states(problem, ss)
            total_reads += int(occ.sum())
            card_ok = X.sum(1) == problem.remove
            ok = q.feasible(X, problem.remove) if len(X) else np.zeros(0, dtype=bool)
            frac = float(occ[ok].sum() / max(1, occ.sum()))
            energies = q.energy(X[ok]) if ok.any() else np.zeros(0)
            e_best = float(energies.min()) if len(energies) else None
            path.append(
                {
                    "penalty": lam,
                    "feasible_fraction": frac,
                    "cardinality_fraction": float(occ[card_ok].sum() / max(1, occ.sum())),
                    "best_energy": e_best,
                    "distinct_feasible": int(len(np.unique(X[ok], axis=0))) if ok.any() else 0,
                }
            )
            pieces.append(X[ok])
            if e_best is not None and e_best < best[0]:
                best = (e_best, lam)
            if problem.time_left() <= 0:
                timed_out = rnd + 1 < max_rounds
                break
            if frac < threshold:
                break
            lam *= factor
        cands = np.concatenate(pieces) if pieces else np.zeros((0, q.n), dtype=np.uint8)
        reads = max(1, total_reads)
        info: dict[str, Any] = {
            "penalty": best[1] if np.isfinite(best[0]) else path[-1]["penalty"],
            "penalty_mode": mode if isinstance(mode, str) else "fixed",
            "safe_penalty": safe,
            "penalty_path": path,
            "feasible_fraction": float(sum(p["feasible_fraction"] for p in path) / len(path)),
            "num_reads": total_reads,
            "timed_out": timed_out,
        }
        if not len(cands):
            last = path[-1]
            if last["cardinality_fraction"] > 0:
                info["hint"] = (
                    f"{last['cardinality_fraction']:.0%} of the {reads} samples removed exactly M blocks but none met "
                    "the per-kind caps / parameter budget, which the penalty form does not encode; use "
                    "solver='swap-sa' or 'cpsat'"
                )
            else:
                info["hint"] = (
                    f"none of the {reads} samples removed exactly M={problem.remove} blocks at λ={last['penalty']:.4g}; "
                    f"raise the penalty (e.g. penalty={2 * last['penalty']:.4g}, or penalty='safe' = {safe:.4g}) "
                    "or num_reads"
                )
        return SolverOutput(cands, exact=False, info=info)
