"""BlockPruner (Zhong et al. 2024/25): greedy removal of attention and MLP halves by perplexity.

Every step measures the calibration perplexity of the model with each remaining half removed on top of those
already removed, and removes the one that raises it least; all candidates are re-scored at every step (the
damage of a half depends on what is gone). It stops once the removed halves hold ``target_params`` parameters
(the paper prunes to a parameter sparsity) or after ``steps`` removals.

Example:
    >>> from cbo.measure.executors import InProcessExecutor, Measurements                  # doctest: +SKIP
    >>> m = Measurements(InProcessExecutor(model, blocks, calibration))             # doctest: +SKIP
    >>> blockpruner(m, sizes=[b.n_params for b in blocks], target_params=8 * layer)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from cbo.baselines.base import BASELINES, Baseline, RankContext
from cbo.baselines.ranking import Ranking
from cbo.errors import InvalidOptionError


@dataclass
class BlockPrunerResult:
    """The removed blocks in the order removed, with the calibration perplexity after each step.

    Attributes:
        removed: removed block indices (sorted); ``order`` the same in removal order.
        perplexity: calibration perplexity after each step.
        fpe: forward-pass equivalents spent; ``history`` one record per step (``fpe``, ``removed``, ``ppl``).
    """

    removed: list[int]
    order: list[int]
    perplexity: list[float]
    fpe: float
    history: list[dict[str, Any]] = field(default_factory=list)


def blockpruner(
    measure: Any,
    sizes: Sequence[int],
    *,
    target_params: int | None = None,
    steps: int | None = None,
    windows: Sequence[int] | None = None,
    keep: Sequence[int] = (),
    kinds: Sequence[str] | None = None,
    caps: Mapping[str, int] | None = None,
    checkpoint: str | Path | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> BlockPrunerResult:
    """Greedy perplexity-guided removal with a measuring callable.

    Args:
        measure: ``measure(sets, windows, loss="ce") -> (n_sets, n_windows)`` mean next-token cross-entropy per
            window (``cbo.measure.executors.Measurements``), with ``n_windows``, ``fpe``, ``state()``, ``restore()``.
        sizes: parameters of each block (``b.n_params``).
        target_params: stop once the removed blocks hold at least this many parameters.
        steps: stop after this many removals (one of ``target_params`` / ``steps`` is needed).
        windows: the pool windows measured (default: all).
        keep: blocks never removed.
        kinds / caps: the kind of each block and ``{kind: max}`` limits that hold at every step (a kind at its
            limit is no longer a candidate).
        checkpoint: a JSON file written after every step (an interrupted run resumes).
        progress: called after each step with ``{"step", "ppl", "removed", "fpe"}``.
    """
    from cbo.measure.executors import SearchCheckpoint

    n = len(sizes)
    if target_params is None and steps is None:
        raise InvalidOptionError("give target_params (parameters to remove) or steps (blocks to remove)")
    free = [i for i in range(n) if i not in set(keep)]
    if steps is not None and not 1 <= steps < len(free) + 1:
        raise InvalidOptionError(f"steps must be in 1..{len(free)}, got {steps!r}")
    if target_params is not None and not 0 < target_params <= sum(sizes[i] for i in free):
        raise InvalidOptionError(
            f"target_params={target_params!r} must be in 1..{sum(sizes[i] for i in free)} (the removable parameters)"
        )
    caps = dict(caps or {})
    if caps and (kinds is None or len(kinds) != n):
        raise InvalidOptionError(f"caps {caps} need kinds: one kind per block ({n} blocks)")
    ids = list(range(measure.n_windows)) if windows is None else [int(w) for w in windows]
    identity = {"method": "blockpruner", "sizes": [int(s) for s in sizes], "target": target_params, "steps": steps}
    if caps:
        identity["caps"] = caps
    ckpt = SearchCheckpoint(checkpoint, {**identity, "windows": ids, "keep": sorted(keep)}) if checkpoint else None
    saved = ckpt.load() if ckpt is not None else None
    order: list[int] = []
    ppl: list[float] = []
    history: list[dict[str, Any]] = []
    if saved is not None:
        measure.restore(saved["measure"])
        order, ppl, history = saved["order"], saved["ppl"], saved["history"]
    while True:
        removed_params = sum(sizes[i] for i in order)
        if (target_params is not None and removed_params >= target_params) or (
            steps is not None and len(order) >= steps
        ):
            break
        used = {k: sum(1 for i in order if kinds[i] == k) for k in caps} if kinds is not None else {}
        candidates = [
            i for i in free if i not in order and not (kinds and kinds[i] in caps and used[kinds[i]] >= caps[kinds[i]])
        ]
        if not candidates:
            break
        ce = measure([order + [i] for i in candidates], ids, loss="ce").mean(axis=1)
        best = int(np.argmin(ce))
        order.append(candidates[best])
        ppl.append(math.exp(float(ce[best])))
        history.append({"step": len(order), "fpe": float(measure.fpe), "removed": sorted(order), "ppl": ppl[-1]})
        if ckpt is not None:
            ckpt.save({"measure": measure.state(), "order": order, "ppl": ppl, "history": history})
        if progress is not None:
            progress({"step": len(order), "ppl": ppl[-1], "removed": sorted(order), "fpe": float(measure.fpe)})
    return BlockPrunerResult(sorted(order), order, ppl, float(measure.fpe), history)


def blockpruner_blocks(
    model: Any, blocks: Sequence[Any], calibration: Any, *, executor: Any = None, **options: Any
) -> BlockPrunerResult:
    """BlockPruner on a model: the thin adapter from blocks and calibration windows to :func:`blockpruner`."""
    from cbo.measure.executors import InProcessExecutor, Measurements

    ex = executor if executor is not None else InProcessExecutor(model, blocks, calibration)
    return blockpruner(Measurements(ex), [int(b.n_params) for b in blocks], **options)


@BASELINES.register
class BlockPruner(Baseline):
    """BlockPruner's greedy order (:func:`blockpruner`) up to ``max_remove`` halves; kind caps hold at each step."""

    name = "blockpruner"
    description = "BlockPruner: greedily remove the attention or MLP half that least raises calibration perplexity"
    granularities = ("sublayer",)
    ranks_up_to_max_remove = True

    def rank(self, ctx: RankContext) -> Ranking:
        from cbo.measure.executors import InProcessExecutor, Measurements

        executor = InProcessExecutor(ctx.model, ctx.blocks, ctx.windows)
        try:
            r = blockpruner(
                Measurements(executor),
                [int(b.n_params) for b in ctx.blocks],
                steps=ctx.max_remove,
                keep=ctx.keep,
                kinds=[b.kind for b in ctx.blocks],
                caps=ctx.caps,
            )
        finally:
            executor.close()
        ranking = ctx.ranking(order=r.order, order_losses=[math.log(p) for p in r.perplexity])
        ranking.info.update({"fpe": r.fpe, "loss": "ce", "caps": dict(ctx.caps)})
        return ranking
