"""Staged promotion: a promoted set climbs the high-fidelity windows in stages, raced against the incumbent.

Refine screens every proposal on the low windows and promotes the lowest few to the high ones. Most promoted sets
lose to the incumbent (the best set measured on every high window), and most of them already show it on a few
windows. With ``stages`` (``RefineOptions.stages``) a promoted set is measured first on the windows of the first
stage, then the next, and stops at the first stage where its mean loss on the windows measured so far is above the
incumbent's mean on the same windows (the incumbent is measured on all of them: the comparison is paired, each
window's own difficulty cancels). Only the sets that never fall behind reach every high window and may become the
incumbent. EvoPress's multi-step selection does the same with fresh minibatches; here the windows are fixed, so
every number stays comparable with the surrogate's data. The FPE a losing set saves go into more rounds.

Example:
    >>> stage_windows([3], [1, 3, 5, 8, 9, 12, 20, 30], 1)
    [[3, 1, 5], [3, 1, 5, 8, 9, 12, 20, 30]]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

SetKey = tuple[int, ...]


def stage_windows(low: Sequence[int], high: Sequence[int], stages: int) -> list[list[int]]:
    """The windows of each stage, cumulative, ending with every high window: the low windows first, then the other
    high windows in order; ``stages`` intermediate sizes, geometric between ``len(low)`` and ``len(high)`` (sizes
    that would repeat are dropped). ``stages=0``: the high windows in one step."""
    order = [int(w) for w in low] + [int(w) for w in high if w not in set(low)]
    lo, hi = max(len(low), 1), len(order)
    sizes = sorted({round(lo * (hi / lo) ** (i / (stages + 1))) for i in range(1, stages + 1)} | {hi})
    return [order[:s] for s in sizes if len(low) < s <= hi]


def race(
    measure: Any, sets: Sequence[SetKey], stages: list[list[int]], incumbent: SetKey | None
) -> tuple[list[SetKey], np.ndarray, list[dict[str, Any]]]:
    """Measure ``sets`` stage by stage against ``incumbent`` (None: every set goes straight to the last stage).

    Args:
        measure: ``measure(sets, windows) -> (n_sets, n_windows)`` losses (cached: the incumbent costs nothing).
        sets: the promoted sets.
        stages: :func:`stage_windows`' cumulative window lists.
        incumbent: the best set measured on every window of the last stage.

    Returns:
        ``(finished, their mean loss on the last stage's windows, dropped)``; ``dropped``: one
        ``{"removed", "windows", "loss", "incumbent"}`` per set stopped early (its mean and the incumbent's on the
        windows it was measured on).
    """
    alive, dropped = list(sets), []
    steps = stages if incumbent is not None else stages[-1:]
    for k, windows in enumerate(steps):
        if not alive:
            break
        losses = measure(alive, windows).mean(axis=1)
        if k == len(steps) - 1:
            return alive, losses, dropped
        bar = float(measure([incumbent], windows).mean())
        ahead = []
        for key, y in zip(alive, losses):
            if y <= bar:
                ahead.append(key)
            else:
                dropped.append({"removed": list(key), "windows": len(windows), "loss": float(y), "incumbent": bar})
        alive = ahead
    return [], np.zeros(0), dropped
