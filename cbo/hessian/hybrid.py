"""``hybrid``: measured single-block removal losses on the diagonal, Fisher correlations for the couplings.

Model. If removing block i perturbed the model's output by a vector ``u_i`` and perturbations added up, the
damage of a removal set S would be ``‖Σ_{i∈S} u_i‖²`` = ``Σ_i D_i + Σ_{i<j} 2 ρ_ij √(D_i D_j)``, with
``D_i = ‖u_i‖²`` the damage of removing block i alone and ``ρ_ij`` the cosine between ``u_i`` and ``u_j``. The
estimator measures ``D_i`` exactly (the loss with block i removed: no Taylor error, so the diagonal carries the
true size of each removal, which the second-order expansion at "all blocks kept" gets badly wrong for the first
and last blocks) and takes the angles from the Fisher matrix of the gates,
``ρ_ij = F_ij / √(F_ii F_jj)`` (one forward and one backward pass per batch, as ``fisher``). The QUBO is

    E(x) = Σ_i D_i x_i + Σ_{i<j} c_ij x_i x_j,   c_ij = s · 2 ρ_ij √(D_i D_j),

with ``couplings="positive"`` keeping only penalizing couplings (``max(c_ij, 0)``: the negative ones are the
cancellations a linear model extrapolates to sets that wreck the model), ``"raw"`` all of them, ``"none"`` none
(the one-at-a-time ranking: remove the M blocks whose single removal hurts least), and ``s = coupling_scale``.

Cost per batch: 1 forward + 1 backward (skipped with ``couplings="none"``) and N single-block removals, measured
through a prefix tree (``measure.py``): the removal of block i reruns only the layers after i, about N/2 forward
passes in all plus N runs of the head. ``measure_cache`` keeps measured losses on disk for reuse by other runs.

The subclasses ``fit`` and ``trust`` start from this QUBO and refine it with more measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch

from cbo.checks import blocks_where, check_choice, check_float, check_in_range, check_indices, check_int
from cbo.errors import InfeasibleError, InvalidOptionError
from cbo.hessian.base import Estimator, register
from cbo.hessian.gram import add_gram, gram_state
from cbo.measure.losses import log_probs, nll_of_labels
from cbo.measure.measurer import MeasureCache, Work

COUPLINGS = ("positive", "raw", "none")


class CalibrationLosses:
    """Mean calibration loss increase of removal sets over an estimator's calibration batches, each set measured
    once through one :class:`Measurer` (the batches' original passes kept between calls); its work counts into
    the run and the estimator's state. Used by the estimators that measure more sets after the calibration
    pass (``fit``, ``trust``).
    """

    def __init__(self, estimator: HybridEstimator, state: dict[str, np.ndarray]) -> None:
        self.est = estimator
        self.state = state
        count = int(state["count"])
        self.measurer = estimator.run.measurer(torch.from_numpy(state["tokens"][:count]), cache=estimator.cache)
        self.values: dict[tuple[int, ...], float] = {}
        self.requested = 0

    def __call__(self, sets: Sequence[Sequence[int]]) -> np.ndarray:
        """Mean calibration loss increase of each removal set (block indices)."""
        keys = self.measurer.check_sets(sets)
        todo = [k for k in dict.fromkeys(keys) if k not in self.values]
        if todo:
            before = self.measurer.work
            increase = self.measurer.losses(todo).increase(self.est.run.loss)
            self.est.count_work(self.state, self.measurer.work - before, len(todo))
            for key, value in zip(todo, increase):
                self.values[key] = float(value)
        self.requested += len(keys)
        return np.array([self.values[k] for k in keys])


def gram_couplings(D: np.ndarray, F: np.ndarray, mode: str, scale: float) -> np.ndarray:
    """Couplings ``c_ij = scale · 2 ρ_ij √(D_i D_j)`` with ``ρ`` the correlation matrix of ``F`` (zero diagonal).

    Blocks whose Fisher diagonal is 0 (no gradient reaches them) get no couplings; negative ``D`` (a removal that
    lowers the loss) counts as 0.
    """
    n = len(D)
    if mode == "none" or scale == 0:
        return np.zeros((n, n))
    d = np.sqrt(np.clip(np.diag(F), 0.0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = F / np.outer(d, d)
    rho = np.where(np.outer(d, d) > 0, np.clip(rho, -1.0, 1.0), 0.0)
    root = np.sqrt(np.clip(D, 0.0, None))
    c = 2.0 * rho * np.outer(root, root)
    np.fill_diagonal(c, 0.0)
    if mode == "positive":
        c = np.maximum(c, 0.0)
    return float(scale) * c


@register
class HybridEstimator(Estimator):
    name = "hybrid"
    measures = True
    description = "measured single-block removal losses (diagonal) + Fisher-correlation couplings, Gram model"
    cost = "1 forward + 1 backward + N single removals per batch (prefix-shared, about N/2 forward passes)"

    @dataclass
    class Options:
        couplings: str = "positive"  # "positive" (max(c_ij, 0)), "raw", or "none" (one-at-a-time ranking)
        coupling_scale: float = 1.0  # s in c_ij = s · 2 ρ_ij √(D_i D_j)
        samples: int = 1  # label draws per batch for the Fisher correlations
        measure_cache: str | None = None  # folder for measured losses shared between runs

        def validate(self) -> None:
            check_choice("couplings", self.couplings, COUPLINGS)
            check_float("coupling_scale", self.coupling_scale, 0)
            check_int("samples", self.samples, 1)
            if self.measure_cache is not None and not isinstance(self.measure_cache, str):
                raise InvalidOptionError(
                    f"measure_cache must be a folder path (str) or None, got {self.measure_cache!r}."
                )

    # ------------------------------------------------------------------ lifecycle
    def __init__(self, run: Any, options: Any) -> None:
        super().__init__(run, options)
        self.cache = (
            MeasureCache(options.measure_cache, run.model, run.blocks) if options.measure_cache is not None else None
        )

    def uses_fisher(self) -> bool:
        return self.options.couplings != "none" and self.options.coupling_scale != 0

    def init_state(self) -> dict[str, np.ndarray]:
        n = len(self.run.blocks)
        return {
            **gram_state(n),
            "single_kl": np.zeros(n),
            "single_ce": np.zeros(n),
            "base_ce": np.zeros(()),
            "count": np.zeros(()),
            "tokens": np.zeros((self.run.n_sequences, self.run.seq_len), dtype=np.int64),
            "work": np.zeros(5),  # set evaluations, measured (not cached), layer calls, head runs, original passes
            "batch_rows": np.zeros(self.run.n_batches, dtype=np.int64),
        }

    def accumulate(
        self, state: dict[str, np.ndarray], batch_index: int, tokens: torch.Tensor, tick: Callable[[], None]
    ) -> None:
        run = self.run
        start = int(state["count"])
        state["tokens"][start : start + tokens.shape[0]] = tokens.cpu().numpy()
        state["batch_rows"][batch_index] = tokens.shape[0]
        if self.uses_fisher():
            self._fisher(state, batch_index, tokens)
        n = len(run.blocks)
        measurer = run.measurer(tokens, cache=self.cache)
        out = measurer.losses([(i,) for i in range(n)])
        for i in range(n):
            run.check_finite(torch.from_numpy(out.kl[i]), batch_index, f"loss with block {i} removed")
        state["single_kl"] += out.kl.sum(axis=1)
        state["single_ce"] += out.ce.sum(axis=1)
        state["base_ce"] += float(out.base_ce.sum())
        state["count"] += tokens.shape[0]
        self.count_work(state, measurer.work, n)
        tick()

    def count_work(self, state: dict[str, np.ndarray], work: Work, requested: int) -> None:
        """Add a measurer's work to the run and to the state's counters (which the metadata reports)."""
        counts = [requested, work.sets, work.layer_calls, work.head_runs + work.full_passes, work.original_passes]
        state["work"] += np.array(counts, dtype=np.float64)
        self.run.count_measured(work)

    def _fisher(self, state: dict[str, np.ndarray], batch_index: int, tokens: torch.Tensor) -> None:
        """Per-sequence gate gradients with labels sampled from the original model (as ``fisher``)."""
        run = self.run
        with torch.enable_grad(), run.gates.recording() as rec:
            logits = run.forward(tokens)
            run.check_finite(logits, batch_index, "logits")
            lp = log_probs(logits)
            probs = lp.detach().exp().reshape(-1, lp.shape[-1])
            for draw in range(self.options.samples):
                labels = torch.multinomial(probs, 1, generator=run.generator(batch_index, draw)).reshape(lp.shape[:2])
                nll = nll_of_labels(lp, labels)
                retain = draw < self.options.samples - 1
                G = rec.backward(nll.sum(), run.gates.a, retain=retain, allow_unused=False).numpy()
                run.count_backward()
                add_gram(state, G)

    # ------------------------------------------------------------------ the QUBO
    def singles(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """Measured loss increase of each single removal (the run's loss)."""
        count = float(state["count"])
        if self.run.loss == "kl":
            return state["single_kl"] / count
        return state["single_ce"] / count - float(state["base_ce"]) / count

    def fisher_matrix(self, state: dict[str, np.ndarray]) -> np.ndarray:
        n = len(self.run.blocks)
        if float(state["outer_count"]) == 0:
            return np.zeros((n, n))
        return self.run.seq_len * state["outer"] / float(state["outer_count"])

    def base_qubo(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(H, g) of the Gram model: ``H_ii = 2 D_i``, ``H_ij = c_ij``, ``g = 0``."""
        D = self.singles(state)
        H = gram_couplings(D, self.fisher_matrix(state), self.options.couplings, self.options.coupling_scale)
        np.fill_diagonal(H, 2.0 * D)
        return H, np.zeros(len(D))

    def measured_metadata(self, state: dict[str, np.ndarray]) -> dict[str, Any]:
        count = float(state["count"])
        work = state["work"]
        return {
            "measured": {
                "base_ce": float(state["base_ce"]) / count,
                "single_kl": [float(v) for v in state["single_kl"] / count],
                "single_ce": [float(v) for v in state["single_ce"] / count],
            },
            "set_evaluations": int(work[0]),
            "set_evaluations_measured": int(work[1]),
            "layer_calls": int(work[2]),
            "head_runs": int(work[3]),
        }

    def finalize(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        H, g = self.base_qubo(state)
        extra = self.measured_metadata(state)
        F = self.fisher_matrix(state)
        if self.uses_fisher():
            d = np.sqrt(np.clip(np.diag(F), 1e-300, None))
            extra["fisher_correlation"] = [[float(v) for v in row] for row in F / np.outer(d, d)]
        return H, g, extra


@dataclass
class TargetedOptions(HybridEstimator.Options):
    """Options of the estimators that refine the ``hybrid`` QUBO for one target M (``fit``, ``trust``)."""

    remove: int | None = None  # M, the number of blocks to remove (prune_depth passes it)
    keep: tuple[int, ...] | list[int] = ()  # blocks never removed
    screen: float = 4.0  # outside blocks considered only if their single damage ≤ screen × the largest inside
    estimator: ClassVar[str] = ""  # the estimator's name, for error messages

    def validate(self) -> None:
        HybridEstimator.Options.validate(self)
        if self.remove is None:
            raise InvalidOptionError(f"estimator '{self.estimator}' needs remove=M (the number of blocks to remove).")
        check_int("remove", self.remove, 1)
        check_float("screen", self.screen, 0)
        check_indices("keep", self.keep)

    def target(self, n: int) -> tuple[int, set[int]]:
        """(M, the kept blocks) checked against ``n`` blocks: InfeasibleError when no such removal exists."""
        m = int(self.remove)
        keep = {int(k) for k in self.keep}
        bad = sorted(k for k in keep if not 0 <= k < n)
        if bad:
            raise InfeasibleError(f"keep indices {bad} are out of range 0..{n - 1}.")
        upper = n - len(keep) if keep else n - 1
        check_in_range("remove", m, 1, upper, blocks_where("model", n, len(keep)), error=InfeasibleError)
        return m, keep


class TargetedEstimator(HybridEstimator):
    """Base of the estimators that refine the ``hybrid`` QUBO for one target M (``fit``, ``trust``): the
    pipeline passes them its ``remove`` and ``keep``, and they are checked before any pass runs."""

    target_options = ("remove", "keep")

    def __init__(self, run: Any, options: Any) -> None:
        super().__init__(run, options)
        self.remove, self.keep = options.target(len(run.blocks))
