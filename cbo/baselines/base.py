"""The depth-baseline registry, the context a baseline ranks in, and the two public calls.

A baseline is a small class registered on :data:`BASELINES`: a ``name``, a one-line ``description``, an
``Options`` dataclass (checked by the registry before any work: an unknown option raises
:class:`~cbo.errors.InvalidOptionError`), and ``rank(ctx) -> Ranking``. A new baseline is one new module in
``cbo/baselines/`` with a class decorated ``@BASELINES.register``, plus its module name in :data:`BUILTINS`;
the shared test battery (``tests/baselines``) runs it the day it is registered.

Lifecycle of :func:`rank_blocks`: resolve the name and check the options (registry), check granularity, windows,
keep, caps and ``max_remove`` (bad input fails here, before any forward pass), build a :class:`RankContext`,
put the model in eval mode, ``rank(ctx)``, restore the model's training mode (also on error).

Example (a new baseline):
    >>> @BASELINES.register                                              # doctest: +SKIP
    ... class Last(Baseline):
    ...     name, description = "last", "remove the last M blocks"
    ...     def rank(self, ctx):
    ...         return ctx.ranking(scores=ctx.masked(-np.arange(len(ctx.blocks), dtype=float)))
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from cbo.baselines.ranking import Ranking, check_caps, check_count
from cbo.checks import blocks_where, check_in_range, check_int
from cbo.errors import DataError, InfeasibleError, InvalidOptionError, ModelError, UnknownNameError
from cbo.progress import progress_bar
from cbo.registry import Registry

GRANULARITIES = ("layer", "sublayer")

# the modules that register the built-in baselines (imported on the first registry lookup)
BUILTINS = (
    "cbo.baselines.residual",
    "cbo.baselines.removal",
    "cbo.baselines.taylor",
    "cbo.baselines.evopress",
    "cbo.baselines.blockpruner",
)

BASELINES: Registry[type[Baseline]] = Registry(
    "depth baseline", error=UnknownNameError, option_error=InvalidOptionError, builtins=BUILTINS
)


def methods() -> list[str]:
    """The registered baseline names."""
    return BASELINES.names()


def describe() -> dict[str, str]:
    """``{name: one-line description}`` of every registered baseline."""
    return {name: cls.description for name, cls in BASELINES.items()}


# ---------------------------------------------------------------------------------------------- shared helpers
def check_batch_size(batch_size: Any) -> int:
    return check_int("batch_size", batch_size, 1)


def calibration_windows(splits_or_windows: Any, model: Any = None) -> Any:
    """(B, T) int64 windows: a tensor / array, or the calibration split of a ``TokenSplits``; at least one."""
    from cbo.hessian.driver import as_windows

    windows = as_windows(splits_or_windows, model)
    if windows.shape[0] == 0:
        raise DataError("the calibration windows are empty; give at least one window.")
    return windows


def keep_indices(keep: Iterable[Any] | int | str | None, blocks: Sequence[Any]) -> list[int]:
    """Sorted block indices of a keep list of indices and/or block names (``"layers.3"``, ``"3"``, ``3``).

    Raises:
        InfeasibleError: an unknown name or an index out of range.
    """
    if keep is None:
        return []
    names = [b.name for b in blocks]
    out = []
    for k in [keep] if isinstance(keep, (int, str)) else keep:
        if isinstance(k, str) and not k.lstrip("-").isdigit():
            if k not in names:
                raise InfeasibleError(f"keep names unknown block {k!r}; blocks are {names[0]}..{names[-1]}.")
            out.append(names.index(k))
            continue
        i = int(k)
        if not 0 <= i < len(blocks):
            raise InfeasibleError(f"keep index {i} is out of range; valid: 0..{len(blocks) - 1}.")
        out.append(i)
    return sorted(set(out))


# ---------------------------------------------------------------------------------------------- the context
@dataclass
class RankContext:
    """Everything a baseline ranks with: the model, the calibration windows, the blocks and the limits.

    Attributes:
        model: the causal LM (in eval mode while the baseline runs).
        windows: (B, T) calibration token windows.
        blocks: ``cbo.model.blocks.find_blocks(model, granularity)``.
        keep: blocks never removed; caps: ``{kind: max}`` limits greedy searches respect at every step.
        max_remove: the largest M needed (greedy steps, per-M searches).
        cache: a ``cbo.measure.measurer.MeasureCache`` for removal measurements, or None.
    """

    method: str
    model: Any
    windows: Any
    blocks: Sequence[Any]
    granularity: str
    keep: tuple[int, ...]
    caps: dict[str, int]
    max_remove: int
    batch_size: int = 8
    progress: bool = False
    cache: Any = None

    def free(self) -> list[int]:
        """The blocks that may be removed (not kept), in order."""
        return [i for i in range(len(self.blocks)) if i not in self.keep]

    def masked(self, scores: Any, excluded: Iterable[int] = ()) -> np.ndarray:
        """``scores`` as float64 with the kept and ``excluded`` blocks set to ``nan`` (never removed)."""
        out = np.asarray(scores, dtype=np.float64).copy()
        for i in set(self.keep) | set(excluded):
            out[i] = np.nan
        return out

    def ranking(self, **fields: Any) -> Ranking:
        """A :class:`Ranking` of this method over the context's blocks, with the given fields."""
        return Ranking(
            method=self.method,
            granularity=self.granularity,
            names=[b.name for b in self.blocks],
            kinds=[b.kind for b in self.blocks],
            sizes=[int(b.n_params) for b in self.blocks],
            keep=self.keep,
            **fields,
        )

    def bar(self, total: int, desc: str | None = None) -> Any:
        return progress_bar(self.progress, total=total, desc=desc or f"{self.method} baseline")


class Baseline(ABC):
    """One depth-pruning rule: ``rank(ctx)`` turns calibration windows into a :class:`Ranking`.

    Class attributes:
        name, description, aliases: how the registry lists it.
        Options: a dataclass of the method's options (none by default); ``validate()`` may check values.
        granularities: the block granularities it supports.
        ranks_up_to_max_remove: its ranking is built step by step up to ``ctx.max_remove`` (greedy orders,
            per-M searches), so ``select_blocks(M)`` ranks with ``max_remove=M`` instead of all blocks.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    granularities: ClassVar[tuple[str, ...]] = GRANULARITIES
    ranks_up_to_max_remove: ClassVar[bool] = False

    @dataclass
    class Options:
        pass

    def __init__(self, options: Any = None) -> None:
        self.options = options if options is not None else self.Options()

    @abstractmethod
    def rank(self, ctx: RankContext) -> Ranking:
        """The ranking of ``ctx.blocks`` from ``ctx.windows``."""


# ---------------------------------------------------------------------------------------------- public calls
def rank_blocks(
    method: str,
    model: Any,
    splits_or_windows: Any,
    *,
    granularity: str = "layer",
    max_remove: int | None = None,
    keep: Iterable[Any] | None = None,
    caps: Mapping[str, int] | None = None,
    batch_size: int = 8,
    progress: bool = False,
    cache_dir: str | Path | None = None,
    **options: Any,
) -> Ranking:
    """Run a baseline once on the calibration windows; the result answers ``select(M)`` for every M.

    Args:
        method: a registered baseline (``methods()``: ``angular``, ``block_influence``, ``ppl``, ``sleb``,
            ``taylor``).
        model: a Hugging Face causal LM.
        splits_or_windows: (B, T) token windows, or a ``TokenSplits`` (its calibration split is used).
        granularity: ``"layer"`` or ``"sublayer"``.
        max_remove: the largest M needed (SLEB runs that many greedy steps; default: all removable blocks).
        keep: blocks never removed (indices or names).
        caps: ``{kind: max}`` limits that SLEB's greedy search respects at every step.
        batch_size: windows per forward pass.
        progress: show progress bars.
        cache_dir: a folder where removal measurements (PPL, SLEB) are kept per batch: a run that is
            interrupted and started again measures only what it had not measured yet.
        **options: the method's options: ``loss="ce"|"kl"`` (sleb, ppl), ``protect=(first, last)`` (taylor).

    Raises:
        UnknownNameError: no such baseline. InvalidOptionError: an option it does not take, or a bad value.
        InfeasibleError: keep, caps or max_remove out of range. DataError: no usable windows.

    Example:
        >>> r = rank_blocks("ppl", model, splits)                  # doctest: +SKIP
        >>> r.select(8)                                            # doctest: +SKIP
    """
    from cbo.model.blocks import find_blocks

    cls = BASELINES.get(method)
    opts = BASELINES.make_options(cls, options)
    if granularity not in GRANULARITIES:
        raise ModelError(f"unknown granularity {granularity!r}; use one of {GRANULARITIES}.")
    if granularity not in cls.granularities:
        raise InvalidOptionError(f"baseline {cls.name!r} supports granularity {list(cls.granularities)} only.")
    batch_size = check_batch_size(batch_size)
    blocks = find_blocks(model, granularity)
    windows = calibration_windows(splits_or_windows, model)
    keep_idx = keep_indices(keep, blocks)
    caps = check_caps(caps, [b.kind for b in blocks])
    free = len(blocks) - len(keep_idx) - (0 if keep_idx else 1)  # something must remain
    where = blocks_where("model", len(blocks), len(keep_idx))
    if free < 1:
        raise InfeasibleError(f"nothing can be removed: {where}. Keep fewer blocks (keep= / --keep).")
    if max_remove is not None:
        free = check_in_range("max_remove", max_remove, 1, free, where, error=InfeasibleError)
    steps = free
    cache = None
    if cache_dir is not None:
        from cbo.measure.measurer import MeasureCache

        cache = MeasureCache(cache_dir, model, blocks)
    ctx = RankContext(
        cls.name, model, windows, blocks, granularity, tuple(keep_idx), caps, steps, batch_size, progress, cache
    )
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        ranking = cls(opts).rank(ctx)
    finally:
        model.train(was_training)
    ranking.wall_time = time.perf_counter() - t0
    ranking.info.update({"n_windows": int(windows.shape[0]), "seq_len": int(windows.shape[1])})
    return ranking


def select_blocks(
    method: str,
    model: Any,
    splits_or_windows: Any,
    remove: int,
    *,
    granularity: str = "layer",
    keep: Iterable[Any] | None = None,
    caps: Mapping[str, int] | None = None,
    batch_size: int = 8,
    progress: bool = False,
    cache_dir: str | Path | None = None,
    **options: Any,
) -> list[int]:
    """The blocks a baseline removes (sorted indices into ``cbo.model.blocks.find_blocks(model, granularity)``).

    Usable as ``prune_depth(..., method=NAME)``. See :func:`rank_blocks` for the arguments; ``caps`` limits the
    removed blocks per kind, e.g. ``{"attention": 4}``.

    Example:
        >>> select_blocks("block_influence", model, splits, remove=8)      # doctest: +SKIP
        [16, 17, 18, 19, 20, 21, 22, 23]
    """
    if check_count(remove, "remove") < 1:
        raise InfeasibleError(f"remove must be >= 1, got {remove}.")
    cls = BASELINES.get(method)
    ranking = rank_blocks(
        method,
        model,
        splits_or_windows,
        granularity=granularity,
        max_remove=remove if cls.ranks_up_to_max_remove else None,
        keep=keep,
        caps=caps,
        batch_size=batch_size,
        progress=progress,
        cache_dir=cache_dir,
        **options,
    )
    return ranking.select(remove, caps=caps)
