"""The measurer of fixed windows: losses of a model with sets of blocks removed (the estimators, validation, the PPL
and SLEB baselines; the searches measure window by window through :mod:`cbo.measure.executors`, on the same replay).

:class:`Measurer` holds a model, its block list and token windows; ``losses(sets)`` returns, for every removal
set, the per-sequence KL to the original model, the next-token cross-entropy and the next-token agreement with
the original, equal to those of the surgically pruned model up to rounding, without copying or editing the
model. Batches go through the prefix tree of :mod:`cbo.measure.replay` (sets that share their first removed
blocks share the computation up to their first difference; layers and attention/MLP halves alike), and a
:class:`~cbo.measure.cache.MeasureCache` on disk keeps every measured value, so a rerun or an
interrupted job measures only what is new.

Work is counted in forward-pass equivalents (FPE, :class:`Work`): decoder-layer calls, head runs and full passes,
each weighted by the parameters it runs, relative to one full forward of the model over the measurer's
windows (or over ``unit_windows`` windows). Measuring a set of deep layers costs a fraction of one.

Example:
    >>> m = Measurer(model, find_blocks(model), splits.validation)      # doctest: +SKIP
    >>> out = m.losses([(3, 7), (20, 21)], windows=8)                   # doctest: +SKIP
    >>> out.mean("kl"), m.work.fpe                                      # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from cbo.checks import check_int
from cbo.errors import DataError, InvalidOptionError, ModelError
from cbo.measure.cache import MeasureCache
from cbo.measure.replay import PART_MASK, WHOLE, RemovalLosses, parameter_count, removal_events
from cbo.model.forward import input_device
from cbo.progress import progress_bar

METRICS = ("kl", "ce", "agreement")


@dataclass(frozen=True)
class Work:
    """Work done by a measurer: counts of calls, and all of it in forward-pass equivalents.

    Attributes:
        sets: set measurements computed, one per set and batch; ``cached``: those found in the cache instead.
        layer_calls: decoder-layer calls (each on one batch); ``head_runs``: runs of the final norm and head.
        full_passes: full gated forward passes (for models that cannot be replayed).
        original_passes: passes of the original model (teacher and recorded streams), at most one per batch.
        fpe: everything above in forward-pass equivalents, relative to one full forward over the unit windows (the
            project's one cost unit; ``Measurements.fpe`` counts the same).
    """

    sets: int = 0
    cached: int = 0
    layer_calls: int = 0
    head_runs: int = 0
    full_passes: int = 0
    original_passes: int = 0
    fpe: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def __sub__(self, other: Work) -> Work:
        return Work(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["fpe"] = round(self.fpe, 4)
        return out


def batch_work(meter: RemovalLosses, rows: int, unit_windows: int) -> Work:
    """The counters of one batch's engine as Work, its cost scaled from that batch to the unit windows."""
    return Work(
        meter.measured,
        meter.cached,
        meter.layer_calls,
        meter.tail_calls,
        meter.full_calls,
        meter.original_calls,
        meter.cost * rows / unit_windows,
    )


@dataclass
class SetLosses:
    """Per-sequence losses of removal sets on the first ``n`` windows of a measurer.

    Attributes:
        sets: the removal sets (sorted block indices), in the order asked.
        kl: (n_sets, n) mean KL(original ‖ pruned) over each window's positions, in nats.
        ce: (n_sets, n) mean next-token cross-entropy over each window's T − 1 predictions.
        agreement: (n_sets, n) fraction of each window's positions whose most likely next token is the original's.
        base_ce: (n,) the original model's cross-entropy per window.
        seq_len: tokens per window.
    """

    sets: list[tuple[int, ...]]
    kl: np.ndarray
    ce: np.ndarray
    agreement: np.ndarray
    base_ce: np.ndarray
    seq_len: int

    def mean(self, metric: str) -> np.ndarray:
        """(n_sets,) mean over the windows of ``"kl"``, ``"ce"`` or ``"agreement"``."""
        if metric not in METRICS:
            raise InvalidOptionError(f"unknown metric {metric!r}; valid: {list(METRICS)}.")
        return getattr(self, metric).mean(axis=1)

    def increase(self, loss: str) -> np.ndarray:
        """(n_sets,) mean loss increase over the original: the KL itself, or the cross-entropy minus the base."""
        if loss == "kl":
            return self.mean("kl")
        if loss == "ce":
            return self.mean("ce") - float(self.base_ce.mean())
        raise InvalidOptionError(f"unknown loss {loss!r}; valid: ['kl', 'ce'].")

    def metrics(self, k: int) -> dict[str, Any]:
        """What :func:`cbo.evaluate.evaluate` reports for set ``k`` (without ``n_params``): ppl, nll, kl, agreement,
        n_tokens, over all the windows' predictions."""
        return summary(float(self.ce[k].mean()), float(self.kl[k].mean()), float(self.agreement[k].mean()), self)

    def base_metrics(self) -> dict[str, Any]:
        """The same for the original model (KL 0 and agreement 1 by definition)."""
        return summary(float(self.base_ce.mean()), 0.0, 1.0, self)


def summary(nll: float, kl: float, agreement: float, losses: SetLosses) -> dict[str, Any]:
    return {
        "ppl": math.exp(nll) if nll < 700 else math.inf,
        "nll": nll,
        "kl": kl,
        "agreement": agreement,
        "n_tokens": int(losses.base_ce.shape[0] * (losses.seq_len - 1)),
    }


class Measurer:
    """Losses of a model with sets of blocks removed, on token windows, through shared recorded streams.

    Args:
        model: the causal LM (any device; eval mode is the caller's).
        blocks: the block list (``cbo.model.blocks.find_blocks(model, granularity)`` or any list of its blocks);
            removal sets are indices into it.
        windows: (B, T) int64 token windows.
        batch_size: windows per batch; a batch is the unit of the original pass and of the cache.
        cache: a :class:`MeasureCache` of this model and block list (or None).
        prefix: share streams through the prefix tree (False: one full gated pass per set and batch).
        retain: keep each batch's original pass (teacher, streams) for later calls; False frees it once the
            call that needed it returns (one-shot validation: the least memory).
        unit_windows: the number of windows one forward-pass equivalent stands for (default: all of these).
        progress: show a progress bar over the batches of each call.
        label: the progress bar's name (what is measured: "validation", "race: windows 32-96", ...).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        blocks: Sequence[Any],
        windows: Any,
        *,
        batch_size: int = 8,
        cache: MeasureCache | None = None,
        prefix: bool = True,
        retain: bool = True,
        unit_windows: int | None = None,
        progress: bool = False,
        label: str = "measuring",
    ) -> None:
        check_int("batch_size", batch_size, 1)
        if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.shape[0] == 0:
            shape = tuple(windows.shape) if isinstance(windows, torch.Tensor) else type(windows).__name__
            raise DataError(f"windows must be a non-empty (B, T) tensor of token ids, got {shape}.")
        self.model = model
        self.blocks = list(blocks)
        if not self.blocks:
            raise ModelError("the block list is empty; pass cbo.model.blocks.find_blocks(model, granularity).")
        self.windows = windows.to(torch.int64)
        self.batch_size = batch_size
        self.cache = cache
        self.prefix = prefix
        self.retain = retain
        self.unit_windows = int(unit_windows or windows.shape[0])
        self.progress = progress
        self.label = label
        self._meters: dict[tuple[int, int], RemovalLosses] = {}
        self._work = Work()

    @property
    def n_windows(self) -> int:
        return int(self.windows.shape[0])

    @property
    def work(self) -> Work:
        """Everything measured so far (cumulative)."""
        return self._work

    def check_sets(self, sets: Iterable[Iterable[int]]) -> list[tuple[int, ...]]:
        """The sets as sorted tuples of block indices; ModelError naming a set with an index out of range."""
        n = len(self.blocks)
        keys = []
        for s in sets:
            try:
                key = tuple(sorted({int(i) for i in s}))
            except (TypeError, ValueError) as exc:
                raise ModelError(f"a removal set is a list of block indices, got {s!r}.") from exc
            bad = [i for i in key if not 0 <= i < n]
            if bad:
                raise ModelError(f"removal set {list(key)}: block indices {bad} are out of range 0..{n - 1}.")
            keys.append(key)
        return keys

    def losses(self, sets: Iterable[Iterable[int]], windows: int | None = None) -> SetLosses:
        """Per-sequence KL, cross-entropy and agreement of each removal set on the first ``windows`` windows.

        Calls with a window count that is a multiple of ``batch_size`` reuse each other's batches (and, with
        ``retain``, their original passes); the empty set gives the original model's values.
        """
        keys = self.check_sets(sets)
        n = self.n_windows if windows is None else windows
        check_int("windows", n, 1, self.n_windows)
        values = {m: np.zeros((len(keys), n)) for m in ("kl", "ce", "agree")}
        base_ce = np.zeros(n)
        device = input_device(self.model)
        spans = [(s, min(s + self.batch_size, n)) for s in range(0, n, self.batch_size)]
        bar = progress_bar(self.progress and bool(keys), total=len(spans), desc=self.label)
        try:
            for start, stop in spans:
                meter = self._meters.get((start, stop))
                if meter is None:
                    batch = self.windows[start:stop].to(device)
                    meter = RemovalLosses(self.model, self.blocks, batch, prefix=self.prefix, cache=self.cache)
                before = batch_work(meter, stop - start, self.unit_windows)
                for k, value in enumerate(meter.losses(keys)):
                    for m in values:
                        values[m][k, start:stop] = value[m].numpy()
                base_ce[start:stop] = meter.base["ce"].numpy()
                self._work = self._work + (batch_work(meter, stop - start, self.unit_windows) - before)
                if self.retain:
                    self._meters[(start, stop)] = meter
                if bar is not None:
                    bar.update()
        finally:
            if bar is not None:
                bar.close()
        return SetLosses(keys, values["kl"], values["ce"], values["agree"], base_ce, int(self.windows.shape[1]))

    def pruned_parameters(self, removed: Iterable[int]) -> int:
        """Parameters of the model with ``removed`` gone (what ``count_parameters`` of the pruned model gives)."""
        from cbo.model.blocks import decoder_layers

        (key,) = self.check_sets([removed])
        layers = decoder_layers(self.model)[0]
        gone = 0
        for layer, mask in removal_events(self.blocks, key):
            if mask == WHOLE:
                gone += parameter_count(layers[layer])
            else:
                gone += sum(b.n_params for b in self.blocks if b.layer == layer and PART_MASK[b.part] == mask)
        return parameter_count(self.model) - gone

    def release(self) -> None:
        """Free the retained original passes (later calls run them again)."""
        self._meters.clear()


def measure_sets(
    model: torch.nn.Module,
    blocks: Sequence[Any],
    windows: torch.Tensor,
    sets: Sequence[Iterable[int]],
    *,
    batch_size: int = 8,
    prefix: bool = True,
    cache: MeasureCache | None = None,
) -> dict[str, Any]:
    """Per-sequence losses of every removal set over all windows (a one-shot :class:`Measurer`).

    Returns:
        ``{"kl", "ce", "agree": (n_sets, B), "base_ce": (B,), "work": Work}``: the losses, and the work done
        (its ``fpe`` relative to one forward over all the windows; ``sets``: set-batch measurements not found in
        the cache).
    """
    measurer = Measurer(model, blocks, windows, batch_size=batch_size, cache=cache, prefix=prefix, retain=False)
    out = measurer.losses(sets)
    return {"kl": out.kl, "ce": out.ce, "agree": out.agreement, "base_ce": out.base_ce, "work": measurer.work}


__all__ = ["MeasureCache", "Measurer", "RemovalLosses", "SetLosses", "Work", "measure_sets"]
