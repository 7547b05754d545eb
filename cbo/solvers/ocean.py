"""D-Wave Ocean samplers: simulated annealing and tabu from ``dwave-samplers``, and any dimod sampler.

These samplers see an unconstrained BQM, so Σx = M enters as a penalty ``λ(Σx − M)²``. Keep and
force are not penalized: those variables are fixed in the BQM before sampling. Per-kind caps and
the parameter budget are not encoded (they would need slack variables); samples that break them
are dropped. Every result is filtered to feasible states, deduplicated and re-scored exactly.

Penalty choices (option ``penalty``):

* ``"safe"``: the provably safe λ of the reduced problem (no infeasible state undercuts the best
  feasible one). Correct, but it makes the landscape so steep that annealing rarely reaches the
  feasible ground state.
* a number: that λ.
* ``"adaptive"``: start at the safe λ and halve it while at least ``feasible_threshold`` of the
  samples stay feasible; the states of every round are pooled and the λ path is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from cbo.errors import SolverError
from cbo.extras import has_module, require
from cbo.solvers.base import Problem, Solver, SolverOutput, register


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


def _parse_penalty(penalty: Any, default_adaptive: bool) -> str | float:
    if penalty is None:
        return "adaptive" if default_adaptive else "safe"
    if isinstance(penalty, str):
        if penalty not in ("safe", "adaptive"):
            raise SolverError(f"penalty must be 'safe', 'adaptive' or a number > 0, got {penalty!r}.")
        return penalty
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float, np.number)) or not np.isfinite(penalty):
        raise SolverError(f"penalty must be 'safe', 'adaptive' or a number > 0, got {penalty!r}.")
    if penalty <= 0:
        raise SolverError(f"penalty must be > 0, got {penalty!r}.")
    return float(penalty)


class _PenaltySolver(Solver):
    """Shared driver: build the penalty BQM, sample, filter, and (adaptive) search λ downward."""

    # subclasses define sample(bqm, problem, options, round_) -> dimod.SampleSet
    default_adaptive: ClassVar[bool] = False

    def run(self, problem: Problem, options: Any) -> SolverOutput:
        mode = _parse_penalty(options.penalty, self.default_adaptive)
        safe = reduced_safe_penalty(problem)
        lam = safe if mode in ("safe", "adaptive") else float(mode)
        threshold = float(getattr(options, "feasible_threshold", 0.05))
        max_rounds = int(getattr(options, "max_rounds", 1)) if mode == "adaptive" else 1
        factor = float(getattr(options, "factor", 0.5))
        if mode == "adaptive" and not (0 < factor < 1):
            raise SolverError(f"factor must be in (0, 1), got {factor!r}.")
        if max_rounds < 1:
            raise SolverError(f"max_rounds must be >= 1, got {max_rounds!r}.")
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


def _seed(problem: Problem, round_: int) -> int:
    return int((problem.seed * 1000003 + round_ * 7919) % (2**31 - 1))


@register
class SimulatedAnnealing(_PenaltySolver):
    """D-Wave's simulated annealing (``dwave.samplers.SimulatedAnnealingSampler``) on the penalty BQM."""

    name = "sa"
    aliases = ("neal", "dwave-neal")
    exact = False
    description = "simulated annealing from dwave-samplers on E + λ(Σx−M)² (adaptive λ)"
    default_adaptive = True
    battery_options: ClassVar[dict] = {"num_reads": 50, "num_sweeps": 500}
    battery_max_n: ClassVar[int] = 16

    @dataclass
    class Options:
        """Settings of simulated annealing.

        Attributes:
            penalty: "adaptive" (default), "safe", or a number λ.
            num_reads: samples per λ.
            num_sweeps: sweeps per sample.
            beta_range: (hot, cold) inverse temperatures; None lets the sampler choose from the BQM.
            feasible_threshold: adaptive λ stops halving once fewer samples than this are feasible.
            max_rounds: most λ values tried by the adaptive search.
            factor: λ multiplier between adaptive rounds.
        """

        penalty: Any = "adaptive"
        num_reads: int = 100
        num_sweeps: int = 1000
        beta_range: tuple[float, float] | None = None
        feasible_threshold: float = 0.05
        max_rounds: int = 12
        factor: float = 0.5

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        if not has_module("dwave.samplers"):
            return False, "dwave-samplers is not installed (pip install dwave-samplers)"
        return True, "ok"

    def sample(self, bqm: Any, problem: Problem, options: Options, round_: int) -> Any:
        samplers = require("dwave.samplers", "simulated annealing")
        kwargs: dict[str, Any] = {
            "num_reads": _positive(options.num_reads, "num_reads"),
            "num_sweeps": _positive(options.num_sweeps, "num_sweeps"),
            "seed": _seed(problem, round_),
            "interrupt_function": lambda: problem.time_left() <= 0,
        }
        if options.beta_range is not None:
            kwargs["beta_range"] = tuple(float(b) for b in options.beta_range)
        return samplers.SimulatedAnnealingSampler().sample(bqm, **kwargs)

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        out = super().run(problem, options)
        out.info["sweeps"] = int(options.num_sweeps)
        return out


@register
class Tabu(_PenaltySolver):
    """D-Wave's tabu search (``dwave.samplers.TabuSampler``) on the penalty BQM."""

    name = "tabu"
    aliases = ("dwave-tabu",)
    exact = False
    description = "tabu search from dwave-samplers on E + λ(Σx−M)² (safe λ)"
    default_adaptive = False
    battery_options: ClassVar[dict] = {"num_reads": 10}
    battery_max_n: ClassVar[int] = 16

    @dataclass
    class Options:
        """Settings of tabu search.

        Attributes:
            penalty: "safe" (default), "adaptive", or a number λ.
            num_reads: independent searches per λ.
            num_restarts: restarts per search (bounded so that a seed reproduces the result).
            timeout_ms: wall-clock cap per search in milliseconds (runs hitting it are not reproducible).
            tenure: tabu tenure; None lets the sampler choose.
            feasible_threshold / max_rounds / factor: the adaptive λ search (see ``sa``).
        """

        penalty: Any = "safe"
        num_reads: int = 10
        num_restarts: int = 2
        timeout_ms: int = 10_000
        tenure: int | None = None
        feasible_threshold: float = 0.05
        max_rounds: int = 12
        factor: float = 0.5

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        if not has_module("dwave.samplers"):
            return False, "dwave-samplers is not installed (pip install dwave-samplers)"
        return True, "ok"

    def sample(self, bqm: Any, problem: Problem, options: Options, round_: int) -> Any:
        samplers = require("dwave.samplers", "tabu search")
        timeout = _positive(options.timeout_ms, "timeout_ms")
        left = problem.time_left()
        if np.isfinite(left):
            timeout = max(1, min(timeout, int(1000 * left / max(1, options.num_reads))))
        kwargs: dict[str, Any] = {
            "num_reads": _positive(options.num_reads, "num_reads"),
            "num_restarts": _positive(options.num_restarts, "num_restarts"),
            "timeout": int(timeout),
            "seed": _seed(problem, round_),
        }
        if options.tenure is not None:
            kwargs["tenure"] = _positive(options.tenure, "tenure")
        return samplers.TabuSampler().sample(bqm, **kwargs)

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        out = super().run(problem, options)
        out.info["sweeps"] = None
        out.info["num_restarts"] = int(options.num_restarts)
        return out


@register
class DimodSampler(_PenaltySolver):
    """Any ``dimod.Sampler`` (a quantum annealer, a hybrid solver, ...) on the penalty BQM.

    Pass the sampler itself: ``cbo.solve(q, M, solver=EmbeddingComposite(DWaveSampler()))``, or
    ``solver="dimod", sampler=...``. ``num_reads`` and the seed are passed only when the sampler
    lists them among its parameters; ``sample_kwargs`` go to ``sampler.sample`` unchanged.
    """

    name = "dimod"
    aliases = ("sampler",)
    exact = False
    description = "any dimod.Sampler on E + λ(Σx−M)² (pass the sampler as solver=...)"
    default_adaptive = False
    battery_options: ClassVar[dict] = {"sampler": "dwave.samplers.SimulatedAnnealingSampler"}
    battery_max_n: ClassVar[int] = 12

    @dataclass
    class Options:
        """Settings of the generic sampler wrapper.

        Attributes:
            sampler: a dimod.Sampler instance, or the dotted path of a sampler class to instantiate.
            penalty: "safe" (default), "adaptive", or a number λ.
            num_reads: passed when the sampler accepts it.
            sample_kwargs: extra keyword arguments for ``sampler.sample``.
            feasible_threshold / max_rounds / factor: the adaptive λ search (see ``sa``).
        """

        sampler: Any = None
        penalty: Any = "safe"
        num_reads: int | None = 100
        sample_kwargs: dict = field(default_factory=dict)
        feasible_threshold: float = 0.05
        max_rounds: int = 12
        factor: float = 0.5

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        if not has_module("dimod"):
            return False, "dimod is not installed (pip install dimod)"
        return True, "ok"

    def sample(self, bqm: Any, problem: Problem, options: Options, round_: int) -> Any:
        sampler = _resolve_sampler(options.sampler)
        params = getattr(sampler, "parameters", {}) or {}
        kwargs = dict(options.sample_kwargs or {})
        if options.num_reads is not None and "num_reads" in params:
            kwargs.setdefault("num_reads", _positive(options.num_reads, "num_reads"))
        if "seed" in params:
            kwargs.setdefault("seed", _seed(problem, round_))
        try:
            ss = sampler.sample(bqm, **kwargs)
        except TypeError as exc:
            raise SolverError(
                f"{type(sampler).__name__}.sample rejected its arguments {sorted(kwargs)}: {exc}"
            ) from exc
        if hasattr(ss, "resolve"):  # a future-backed sampleset (cloud samplers)
            ss.resolve()
        return ss

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        out = super().run(problem, options)
        sampler = _resolve_sampler(options.sampler)
        out.info["sampler"] = type(sampler).__name__
        out.info["solver_name"] = f"dimod:{type(sampler).__name__}"
        return out


def _resolve_sampler(sampler: Any) -> Any:
    if sampler is None:
        raise SolverError("solver='dimod' needs a sampler: pass solver=<dimod.Sampler instance> or sampler=<instance>.")
    if isinstance(sampler, str):
        import importlib

        mod, _, cls = sampler.rpartition(".")
        try:
            sampler = getattr(importlib.import_module(mod), cls)()
        except (ImportError, AttributeError, ValueError) as exc:
            raise SolverError(f"cannot build a sampler from {sampler!r}: {exc}") from exc
    if not (hasattr(sampler, "sample") and hasattr(sampler, "parameters")):
        raise SolverError(f"{type(sampler).__name__} is not a dimod.Sampler (it needs .sample and .parameters).")
    return sampler


def _positive(v: Any, label: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise SolverError(f"option {label!r} must be an integer >= 1, got {v!r}.")
    return int(v)
