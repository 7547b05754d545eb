"""One-shot width pruning: score every unit, allocate the budget, slice the model.

Example:
    >>> small, alloc = width_prune(model, splits.calibration, ratio=0.2, score="taylor")   # doctest: +SKIP
    >>> alloc.summary()                                                                   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from cbo.errors import InvalidOptionError
from cbo.model.structures import GQA_MODES
from cbo.surgery.width import prune_width
from cbo.width.allocate import ALLOCATIONS, Allocation, allocate
from cbo.width.scores.base import SCORES, score_units

# the one-shot width score used when none is given: the best measured on the default model (BENCHMARKS.md)
DEFAULT_SCORE = "taylor"


def check_width_options(
    score: str, score_options: dict[str, Any] | None = None, gqa: str = "group", allocation: str | None = None
) -> None:
    """Check the options of a width step before any long work: the score, its options, the units, the allocation.

    Raises:
        UnknownNameError: no width score is registered under ``score``.
        InvalidOptionError: a score option, ``gqa`` or ``allocation`` is not valid.
    """
    SCORES.make_options(score, score_options)
    if gqa not in GQA_MODES:
        raise InvalidOptionError(f"unknown grouped-query mode {gqa!r}; use one of {list(GQA_MODES)}")
    if allocation is not None and allocation not in ALLOCATIONS:
        raise InvalidOptionError(f"unknown allocation {allocation!r}; use one of {list(ALLOCATIONS)}")


def width_prune(
    model: Any,
    windows: Any = None,
    *,
    ratio: float | None = None,
    remove_params: int | None = None,
    score: str = DEFAULT_SCORE,
    gqa: str = "group",
    gamma: float | None = None,
    round_to: int = 8,
    min_heads: int = 1,
    min_neurons: int | None = None,
    max_layer_fraction: float | None = None,
    allocation: str | None = None,
    batch_size: int = 4,
    total_params: int | None = None,
    inplace: bool = False,
    score_options: dict[str, Any] | None = None,
) -> tuple[Any, Allocation]:
    """Score, allocate globally (or uniformly), slice. Returns ``(pruned_model, Allocation)``.

    Args:
        model: a Hugging Face causal LM (left untouched unless ``inplace``).
        windows: ``(B, T)`` calibration token windows (not needed by data-free scores).
        ratio / remove_params: the budget, as in :func:`cbo.width.allocate.allocate`.
        score / score_options / gqa / batch_size: as in :func:`cbo.width.scores.score_units`.
        gamma, round_to, min_heads, min_neurons, max_layer_fraction, allocation, total_params: as in
            :func:`cbo.width.allocate.allocate`.
        inplace: slice ``model`` itself instead of a copy.

    Example:
        >>> small, alloc = width_prune(model, windows, remove_params=10**6, score="amp")   # doctest: +SKIP
    """
    scores = score_units(model, windows, score, gqa=gqa, batch_size=batch_size, **(score_options or {}))
    alloc = allocate(
        scores,
        ratio=ratio,
        remove_params=remove_params,
        gamma=gamma,
        round_to=round_to,
        min_heads=min_heads,
        min_neurons=min_neurons,
        max_layer_fraction=max_layer_fraction,
        total_params=total_params,
        allocation=allocation,
    )
    return prune_width(model, alloc.plan, inplace=inplace), alloc
