"""Baselines that measure the calibration loss with blocks actually removed: PPL and SLEB.

* ``ppl`` (PPL criterion of Shortened LLaMA, Kim et al. 2024): remove one block at a time, measure the
  calibration loss, remove the M blocks whose single removal hurts least.
* ``sleb`` (Song et al. 2024): greedy; remove the block whose removal least raises the calibration loss,
  re-measure with it removed, repeat M times.

Every loss goes through the measurer of fixed windows, :func:`cbo.measure.measurer.measure_sets`: layer sets replay the
recorded residual stream through a prefix tree (no model copy; a removed layer costs no compute), sublayer sets
run one gated pass each. The loss is the calibration next-token NLL (``ce``) or the KL to the original model
(``kl``), averaged over every predicted token. The measurer gives per-sequence means; all windows have the
same length, so their mean is that token mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cbo.baselines.base import BASELINES, Baseline, RankContext
from cbo.baselines.ranking import Ranking, json_number
from cbo.errors import InvalidOptionError
from cbo.measure.measurer import Work

LOSSES = ("ce", "kl")


@dataclass
class LossOptions:
    loss: str = "ce"  # "ce": calibration next-token NLL; "kl": KL to the original model

    def validate(self) -> None:
        if self.loss not in LOSSES:
            raise InvalidOptionError(
                f"unknown loss {self.loss!r}; valid: {list(LOSSES)} (ce = cross-entropy, kl = KL to the original)."
            )


class RemovalMeter:
    """Mean calibration loss of removal sets, measured batch by batch through the measurer.

    Args:
        ctx: the rank context (model, windows, blocks, batch size, measurement cache).
        loss: ``"ce"`` or ``"kl"``.

    Attributes:
        work: the measurer's :class:`~cbo.measure.measurer.Work` summed over calls; ``set_evaluations``: sets ×
            batches asked for.
    """

    def __init__(self, ctx: RankContext, loss: str) -> None:
        self.ctx = ctx
        self.loss = loss
        self.work = Work()
        self.set_evaluations = 0

    def n_batches(self) -> int:
        return -(-self.ctx.windows.shape[0] // self.ctx.batch_size)

    def __call__(self, sets: Sequence[Sequence[int]], bar: Any = None) -> np.ndarray:
        """``(len(sets),)`` mean loss over the calibration tokens of the model without each set; ``inf`` if not finite.

        ``bar`` (a progress bar) advances by ``len(sets)`` per batch.
        """
        from cbo.measure import measurer  # looked up at each call (tests interrupt it)

        ctx = self.ctx
        sets = [tuple(s) for s in sets]
        total = np.zeros(len(sets))
        n = ctx.windows.shape[0]
        for start in range(0, n, ctx.batch_size):
            chunk = ctx.windows[start : start + ctx.batch_size]
            out = measurer.measure_sets(ctx.model, ctx.blocks, chunk, sets, batch_size=ctx.batch_size, cache=ctx.cache)
            total += np.asarray(out[self.loss], dtype=np.float64).sum(axis=1)
            self.work += out["work"]
            self.set_evaluations += len(sets)
            if bar is not None:
                bar.update(len(sets))
        values = total / n
        values[~np.isfinite(values)] = math.inf
        return values

    def record(self, ranking: Ranking) -> None:
        """Write the work done into ``ranking``: full passes as ``forward``, the rest in ``info["measurement"]``."""
        ranking.passes["forward"] = self.work.original_passes + self.work.full_passes
        ranking.info["measurement"] = {"set_evaluations": self.set_evaluations, **self.work.to_json()}
        ranking.info["loss"] = self.loss


@BASELINES.register
class PPL(Baseline):
    """One block removed at a time; the M whose single removal raises the calibration loss least."""

    name = "ppl"
    description = "Shortened LLaMA PPL: remove the M blocks whose single removal raises the calibration loss least"
    Options = LossOptions

    def rank(self, ctx: RankContext) -> Ranking:
        meter = RemovalMeter(ctx, self.options.loss)
        candidates = ctx.free()
        bar = ctx.bar(len(candidates) * meter.n_batches())
        try:
            losses = meter([[i] for i in candidates], bar)
        finally:
            bar.close()
        scores = np.full(len(ctx.blocks), np.nan)
        scores[candidates] = losses
        r = ctx.ranking(scores=scores)
        meter.record(r)
        return r


@BASELINES.register
class SLEB(Baseline):
    """Greedy block removal, re-measuring the calibration loss after every step; kind caps hold at each step."""

    name = "sleb"
    description = "SLEB: greedily remove the block whose removal least raises the calibration loss, re-measuring"
    Options = LossOptions
    ranks_up_to_max_remove = True

    def rank(self, ctx: RankContext) -> Ranking:
        meter = RemovalMeter(ctx, self.options.loss)
        blocks, caps = ctx.blocks, ctx.caps
        removed: list[int] = []
        losses: list[float] = []
        step_scores: list[list[float]] = []
        free = ctx.free()
        bar = ctx.bar(sum(len(free) - k for k in range(ctx.max_remove)) * meter.n_batches())
        try:
            for _ in range(ctx.max_remove):
                used: dict[str, int] = {}
                for i in removed:
                    used[blocks[i].kind] = used.get(blocks[i].kind, 0) + 1
                candidates = [
                    i
                    for i in free
                    if i not in removed
                    and not (blocks[i].kind in caps and used.get(blocks[i].kind, 0) >= caps[blocks[i].kind])
                ]
                if not candidates:
                    break
                values = meter([removed + [i] for i in candidates], bar)
                best = int(np.argmin(values))  # the first smallest, in block order
                scores = [math.nan] * len(blocks)
                for i, v in zip(candidates, values):
                    scores[i] = float(v)
                removed.append(candidates[best])
                losses.append(float(values[best]))
                step_scores.append(scores)
        finally:
            bar.close()
        r = ctx.ranking(order=removed, order_losses=losses)
        meter.record(r)
        r.info.update({"step_scores": [[json_number(v) for v in s] for s in step_scores], "caps": dict(caps)})
        return r
