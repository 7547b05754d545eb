"""D-Wave Ocean samplers: simulated annealing and tabu from ``dwave-samplers``, and any dimod sampler.

These samplers see an unconstrained BQM, so Σx = M enters as a penalty ``λ(Σx − M)²`` (see
:mod:`cbo.solvers.penalty` for the penalty choices: ``"safe"``, a number, or ``"adaptive"``). Keep and
force are fixed in the BQM; samples that break per-kind caps or the parameter budget are dropped.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from cbo.errors import SolverError
from cbo.extras import require
from cbo.solvers.base import Problem, SolverOutput, register
from cbo.solvers.penalty import PenaltyOptions, PenaltySolver, positive, round_seed

# Simulated-annealing reads per sampler call (between calls the time limit and Ctrl-C are checked).
READ_BATCH = 25


class SamplersSolver(PenaltySolver):
    """A sampler of ``dwave-samplers`` on the penalty BQM, called one batch of reads at a time: its samplers check
    the time limit and Ctrl-C only between calls."""

    requires = ("dwave.samplers",)

    @staticmethod
    def read_batches(
        problem: Problem, round_: int, reads: int, batch: int = 1
    ) -> Iterator[tuple[int, int, int, float]]:
        """The batches of ``reads`` reads of λ round ``round_``: ``(first read, reads in the batch, seed, seconds
        left)`` each, seeded by the round and the batch's first read; no batch after the first once time is up."""
        for first in range(0, reads, batch):
            left = problem.time_left()
            if first and left <= 0:
                return
            yield first, min(batch, reads - first), (round_seed(problem, round_) + 104729 * first) % (2**31 - 1), left


@register
class SimulatedAnnealing(SamplersSolver):
    """D-Wave's simulated annealing (``dwave.samplers.SimulatedAnnealingSampler``) on the penalty BQM."""

    name = "sa"
    aliases = ("neal", "dwave-neal")
    description = "simulated annealing from dwave-samplers on E + λ(Σx−M)² (adaptive λ)"
    default_adaptive = True

    @dataclass
    class Options(PenaltyOptions):
        """Settings of simulated annealing (and the penalty settings of :class:`PenaltyOptions`).

        Attributes:
            penalty: "adaptive" (default), "safe", or a number λ.
            num_reads: samples per λ.
            num_sweeps: sweeps per sample.
            beta_range: (hot, cold) inverse temperatures; None lets the sampler choose from the BQM.
        """

        penalty: Any = "adaptive"
        num_reads: int = 100
        num_sweeps: int = 1000
        beta_range: tuple[float, float] | None = None

    def sample(self, bqm: Any, problem: Problem, options: Options, round_: int) -> Any:
        """Reads in batches of ``READ_BATCH`` (each seeded from the round and its first read): the sampler draws
        every read's random start in Python before it anneals, and checks the time limit and Ctrl-C only
        between reads, so a large ``num_reads`` in one call would not stop for seconds or minutes."""
        samplers = require("dwave.samplers", "simulated annealing")
        dimod = require("dimod", "simulated annealing")
        reads = positive(options.num_reads, "num_reads")
        kwargs: dict[str, Any] = {
            "num_sweeps": positive(options.num_sweeps, "num_sweeps"),
            "interrupt_function": lambda: problem.time_left() <= 0,
        }
        if options.beta_range is not None:
            kwargs["beta_range"] = tuple(float(b) for b in options.beta_range)
        sets = [
            samplers.SimulatedAnnealingSampler().sample(bqm, num_reads=count, seed=seed, **kwargs)
            for _, count, seed, _ in self.read_batches(problem, round_, reads, READ_BATCH)
        ]
        return dimod.concatenate(sets)

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        out = super().run(problem, options)
        out.info["sweeps"] = int(options.num_sweeps)
        return out


@register
class Tabu(SamplersSolver):
    """D-Wave's tabu search (``dwave.samplers.TabuSampler``) on the penalty BQM."""

    name = "tabu"
    aliases = ("dwave-tabu",)
    description = "tabu search from dwave-samplers on E + λ(Σx−M)² (safe λ)"

    @dataclass
    class Options(PenaltyOptions):
        """Settings of tabu search (and the penalty settings of :class:`PenaltyOptions`).

        Attributes:
            penalty: "safe" (default), "adaptive", or a number λ.
            num_reads: independent searches per λ.
            num_restarts: restarts per search (bounded so that a seed reproduces the result).
            timeout_ms: wall-clock cap per search in milliseconds (runs hitting it are not reproducible).
            tenure: tabu tenure; None lets the sampler choose.
        """

        num_reads: int = 10
        num_restarts: int = 2
        timeout_ms: int = 10_000
        tenure: int | None = None

    def sample(self, bqm: Any, problem: Problem, options: Options, round_: int) -> Any:
        """One read per sampler call (seeded by the round and the read), so that the time limit and Ctrl-C
        are seen between reads: the sampler itself runs to its timeout in C++."""
        samplers = require("dwave.samplers", "tabu search")
        dimod = require("dimod", "tabu search")
        reads = positive(options.num_reads, "num_reads")
        kwargs: dict[str, Any] = {"num_reads": 1, "num_restarts": positive(options.num_restarts, "num_restarts")}
        if options.tenure is not None:
            kwargs["tenure"] = positive(options.tenure, "tenure")
        cap = positive(options.timeout_ms, "timeout_ms")
        sets = []
        for read, _, seed, left in self.read_batches(problem, round_, reads):
            timeout = max(1, min(cap, int(1000 * left / (reads - read)))) if np.isfinite(left) else cap
            sets.append(samplers.TabuSampler().sample(bqm, timeout=int(timeout), seed=seed, **kwargs))
        return dimod.concatenate(sets)

    def run(self, problem: Problem, options: Options) -> SolverOutput:
        out = super().run(problem, options)
        out.info["sweeps"] = None
        out.info["num_restarts"] = int(options.num_restarts)
        return out


@register
class DimodSampler(PenaltySolver):
    """Any ``dimod.Sampler`` (a quantum annealer, a hybrid solver, ...) on the penalty BQM.

    Pass the sampler itself: ``cbo.solve(q, M, solver=EmbeddingComposite(DWaveSampler()))``, or
    ``solver="dimod", sampler=...``. ``num_reads`` and the seed are passed only when the sampler
    lists them among its parameters; ``sample_kwargs`` go to ``sampler.sample`` unchanged.
    """

    name = "dimod"
    aliases = ("sampler",)
    description = "any dimod.Sampler on E + λ(Σx−M)² (pass the sampler as solver=...)"
    requires = ("dimod",)

    @dataclass
    class Options(PenaltyOptions):
        """Settings of the generic sampler wrapper (and the penalty settings of :class:`PenaltyOptions`).

        Attributes:
            sampler: a dimod.Sampler instance, or the dotted path of a sampler class to instantiate.
            penalty: "safe" (default), "adaptive", or a number λ.
            num_reads: passed when the sampler accepts it.
            sample_kwargs: extra keyword arguments for ``sampler.sample``.
        """

        sampler: Any = None
        num_reads: int | None = 100
        sample_kwargs: dict = field(default_factory=dict)

    def sample(self, bqm: Any, problem: Problem, options: Options, round_: int) -> Any:
        sampler = resolve_sampler(options.sampler)
        params = getattr(sampler, "parameters", {}) or {}
        kwargs = dict(options.sample_kwargs or {})
        if options.num_reads is not None and "num_reads" in params:
            kwargs.setdefault("num_reads", positive(options.num_reads, "num_reads"))
        if "seed" in params:
            kwargs.setdefault("seed", round_seed(problem, round_))
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
        sampler = resolve_sampler(options.sampler)
        out.info["sampler"] = type(sampler).__name__
        out.info["solver_name"] = f"dimod:{type(sampler).__name__}"
        return out


def resolve_sampler(sampler: Any) -> Any:
    """A dimod sampler from an instance or the dotted path of a sampler class."""
    if sampler is None:
        raise SolverError("solver='dimod' needs a sampler: pass solver=<dimod.Sampler instance> or sampler=<instance>.")
    if isinstance(sampler, str):
        mod, _, cls = sampler.rpartition(".")
        try:
            sampler = getattr(importlib.import_module(mod), cls)()
        except (ImportError, AttributeError, ValueError) as exc:
            raise SolverError(f"cannot build a sampler from {sampler!r}: {exc}") from exc
    if not (hasattr(sampler, "sample") and hasattr(sampler, "parameters")):
        raise SolverError(f"{type(sampler).__name__} is not a dimod.Sampler (it needs .sample and .parameters).")
    return sampler
