"""AFR lifted to structures, as published: two standardized per-weight scores, clipped and averaged per unit.

Per weight, two scores are computed from the calibration batches:

* the signed gradient score ``s = -w · ∂L/∂w`` (the first-order loss increase when the weight is removed;
  gradients of the LM cross-entropy averaged over the batches);
* a companion activation score, Wanda's ``a = |w| · ‖x‖₂`` (``‖x‖₂`` the norm of the weight's input feature
  over every calibration token), ``companion="wanda"``.

The published recipe, each step of which can be switched or changed for ablation:

1. **power transform** (``power``, exponent ``p``): ``s ↦ sign(s)·|s|^p`` on the gradient score only, so that
   its distribution matches the companion's. ``p="match"`` (default) chooses ``p`` per matrix so that the
   spread of ``log|s|^p`` equals the spread of ``log a`` (``p = σ(log a) / σ(log |s|)``; the power transform
   scales log-magnitudes, and the scale itself is removed by the next step);
2. **standardize** (``standardize``): each score becomes a z-score over its matrix; the two are summed;
3. **clip** (``clip``, ``clip_percentiles``, ``clip_scope``): a unit's entries are clamped to the 2nd and 98th
   percentiles *of that unit* (``clip_scope="structure"``; ``"matrix"`` clamps to each matrix's own
   percentiles before gathering);
4. **aggregate** (``aggregation``): ``"published"`` averages the signed entries and takes the absolute value
   of the mean. ``"signed"`` ranks on the signed mean itself (this project's earlier AFR); ``"absolute"``
   averages absolute values.

For the gradient part, ``|Σ_unit w·∂L/∂w|`` is the first-order Taylor estimate of removing the whole unit,
which is why the absolute value of the signed mean, not the signed mean, is the unit's importance.
:data:`EARLIER_OPTIONS` reproduces the earlier aggregation (gradient score only, ``p=0.5``, clipping per
matrix at the 1st/99th percentiles, signed mean).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cbo.checks import check_choice, check_float
from cbo.errors import InvalidOptionError
from cbo.extras import require
from cbo.model.structures import gather_units, in_axis
from cbo.width.scores.base import GradientScore, Key, lm_loss, register

torch = require("torch", "AFR scores")

AGGREGATIONS = ("published", "signed", "absolute")
COMPANIONS = ("wanda", "none")
STANDARDIZE = ("zscore", "scale", "none")
CLIP_SCOPES = ("structure", "matrix")

# this project's earlier AFR aggregation, kept as an ablation: ``score_units(model, w, "afr", **EARLIER_OPTIONS)``
EARLIER_OPTIONS: dict[str, Any] = dict(
    aggregation="signed",
    companion="none",
    p=0.5,
    standardize="none",
    clip_scope="matrix",
    clip_percentiles=(1.0, 99.0),
)


def check_exponent(p: Any) -> None:
    """Raise :class:`InvalidOptionError` unless the power exponent ``p`` is a number > 0."""
    check_float("AFR power exponent p", p, 0, lo_open=True, hint="(Or 'match'.)")


def check_clip(lower: float, upper: float) -> None:
    """Raise :class:`InvalidOptionError` unless ``0 <= lower < upper <= 100``."""
    if not all(isinstance(x, (int, float)) for x in (lower, upper)) or not 0.0 <= lower < upper <= 100.0:
        raise InvalidOptionError(f"clip percentiles must satisfy 0 <= lower < upper <= 100, got ({lower}, {upper})")


def power_transform(s, p: float):
    """``sign(s)·|s|^p`` elementwise (sign kept, magnitudes compressed for ``p < 1``)."""
    check_exponent(p)
    return torch.sign(s) * s.abs().pow(p)


def matched_exponent(s, reference) -> float:
    """The ``p`` for which ``log|s|^p`` spreads like ``log|reference|``: ``σ(log|reference|) / σ(log|s|)``.

    Zeros are left out of both spreads; 1.0 when either spread is undefined (fewer than two non-zero entries,
    or a constant magnitude).
    """

    def spread(t) -> float:
        x = t.detach().abs().reshape(-1)
        x = x[x > 0]
        return float(x.log_().std()) if x.numel() > 1 else 0.0

    a, b = spread(reference), spread(s)
    return a / b if a > 0 and b > 0 else 1.0


def standardize(t, how: str = "zscore"):
    """``(t - mean) / std`` over all entries (``"zscore"``), ``t / std`` (``"scale"``) or ``t`` (``"none"``).

    A constant tensor has no spread: it is returned centred (``zscore``) or unchanged (``scale``).
    """
    check_choice("AFR standardize", how, STANDARDIZE)
    if how == "none":
        return t
    x = t.double()
    std = float(x.std()) if x.numel() > 1 else 0.0
    if how == "zscore":
        x = x - x.mean()
    return (x / std if std > 0 else x).to(t.dtype)


def percentiles(t, qs) -> list[float]:
    """Percentiles ``qs`` of all entries of ``t`` with linear interpolation (as ``numpy.percentile``).

    The order statistics come from one ``numpy.partition`` (linear time; ``torch.sort`` of a large matrix is
    many times slower on CPU, and ``torch.quantile`` stops at 16M entries).
    """
    for q in qs:
        if not 0.0 <= q <= 100.0:
            raise InvalidOptionError(f"percentile must be in [0, 100], got {q}")
    flat = t.detach().reshape(-1).cpu().numpy()
    n = flat.size
    ranks = []
    for q in qs:
        rank = q / 100.0 * (n - 1)
        lo = int(rank // 1)
        ranks.append((rank, lo, min(lo + 1, n - 1)))
    part = np.partition(flat, sorted({k for _, lo, hi in ranks for k in (lo, hi)}))
    return [float(part[lo]) + (rank - lo) * (float(part[hi]) - float(part[lo])) for rank, lo, hi in ranks]


def percentile(t, q: float) -> float:
    """The ``q``-th percentile of all entries of ``t`` (linear interpolation, as ``numpy.percentile``)."""
    return percentiles(t, [q])[0]


def percentile_clip(s, lower: float, upper: float):
    """``s`` clamped to its own ``lower``-th and ``upper``-th percentiles (over all its entries)."""
    check_clip(lower, upper)
    lo, hi = percentiles(s, [lower, upper])
    return s.clamp(lo, hi)


def row_percentiles(rows, qs) -> list:
    """The percentiles ``qs`` of each row of ``(n, m)`` ``rows``, one ``(n,)`` tensor per ``q`` (linear
    interpolation, as ``numpy.percentile``; one ``numpy.partition`` of the rows, linear time, serves every ``q``)."""
    for q in qs:
        if not 0.0 <= q <= 100.0:
            raise InvalidOptionError(f"percentile must be in [0, 100], got {q}")
    m = rows.shape[1]
    ranks = []
    for q in qs:
        rank = q / 100.0 * (m - 1)
        lo = int(rank // 1)
        ranks.append((rank, lo, min(lo + 1, m - 1)))
    kth = sorted({k for _, lo, hi in ranks for k in (lo, hi)})
    part = torch.from_numpy(np.partition(rows.detach().cpu().numpy(), kth, axis=1)).to(rows.device)
    return [part[:, lo] + (rank - lo) * (part[:, hi] - part[:, lo]) for rank, lo, hi in ranks]


def row_percentile_clip(rows, lower: float, upper: float):
    """Each row of ``(n, m)`` ``rows`` clamped to its own ``lower``-th and ``upper``-th percentiles."""
    check_clip(lower, upper)
    lo, hi = row_percentiles(rows, (lower, upper))
    return torch.minimum(torch.maximum(rows, lo[:, None]), hi[:, None])


def aggregate(rows, aggregation: str = "published"):
    """One importance per row of ``(n_units, m)`` entries.

    ``"published"``: ``|mean|`` of the signed entries; ``"signed"``: the signed mean; ``"absolute"``: the mean
    of the absolute values.
    """
    check_choice("AFR aggregation", aggregation, AGGREGATIONS)
    if aggregation == "absolute":
        return rows.abs().mean(1)
    mean = rows.mean(1)
    return mean.abs() if aggregation == "published" else mean


@register
class AFRScore(GradientScore):
    """AFR-structured importance (the published recipe by default; every step switchable, see the module)."""

    name = "afr"
    aliases = ("afr-structured",)
    description = "AFR: power-transformed signed Taylor + Wanda, standardized, clipped per unit, |mean| per unit"
    finalize_options = (
        "aggregation",
        "companion",
        "power",
        "p",
        "standardize",
        "clip",
        "clip_percentiles",
        "clip_scope",
    )

    @dataclass
    class Options:
        aggregation: str = "published"
        companion: str = "wanda"
        power: bool = True
        p: Any = "match"
        standardize: str = "zscore"
        clip: bool = True
        clip_percentiles: tuple[float, float] = (2.0, 98.0)
        clip_scope: str = "structure"

        def __post_init__(self) -> None:
            self.clip_percentiles = tuple(float(x) for x in self.clip_percentiles)  # lists from JSON / the CLI

        def validate(self) -> None:
            check_choice("AFR aggregation", self.aggregation, AGGREGATIONS)
            check_choice("AFR companion", self.companion, COMPANIONS)
            check_choice("AFR standardize", self.standardize, STANDARDIZE)
            check_choice("AFR clip_scope", self.clip_scope, CLIP_SCOPES)
            if len(self.clip_percentiles) != 2:
                raise InvalidOptionError(f"clip_percentiles must be (lower, upper), got {self.clip_percentiles}")
            if self.power:
                if self.p == "match":
                    if self.companion == "none":
                        raise InvalidOptionError(
                            "AFR p='match' matches the gradient score to the companion score, but companion='none'; "
                            "give a numeric p (e.g. p=0.5) or companion='wanda'"
                        )
                else:
                    check_exponent(self.p)
            if self.clip:
                check_clip(*self.clip_percentiles)

    def attach(self) -> None:
        super().attach()
        self._sq: dict[int, Any] = {}  # id(module) -> sum over tokens of its squared inputs, per input feature
        seen = set()
        for s in self.structures.all():
            for slot in s.slots:
                module = slot.module
                if slot.is_bias or id(module) in seen:
                    continue
                seen.add(id(module))

                def hook(mod, args, key=id(module)):
                    x = args[0].detach().float()
                    sq = x.reshape(-1, x.shape[-1]).pow(2).sum(0)
                    self._sq[key] = self._sq[key] + sq if key in self._sq else sq

                self.hook(module.register_forward_pre_hook(hook))
        self.info = {"p": {}}

    def objective(self, batch):
        return lm_loss(self.model, batch)

    def input_norms(self, module) -> Any:
        """``‖x‖₂`` of each input feature of ``module`` over every calibration token."""
        sq = self._sq.get(id(module))
        if sq is None:
            raise InvalidOptionError(f"AFR saw no inputs of {type(module).__name__}; was the module called?")
        return sq.sqrt()

    def combined(self, key: Key) -> dict[str, Any]:
        """Steps 1 and 2 (and matrix-scope clipping) for every weight matrix of one structure."""
        o = self.options
        out: dict[str, Any] = {}
        for slot in self.structure(key).slots:
            if slot.is_bias or slot.name in out:
                continue
            w = slot.tensor.detach()
            s = (-w * self.mean_grad(slot.tensor)).float()
            a = None
            if o.companion == "wanda":
                norms = self.input_norms(slot.module)
                shape = [1] * w.ndim
                shape[in_axis(slot.module)] = -1
                a = w.abs().float() * norms.reshape(shape)
            if o.power:
                p = matched_exponent(s, a) if o.p == "match" else float(o.p)
                self.info["p"][f"{key[0]}.{slot.name}"] = p
                s = power_transform(s, p)
            total = standardize(s, o.standardize)
            if a is not None:
                total = total + standardize(a, o.standardize)
            if o.clip and o.clip_scope == "matrix":
                total = percentile_clip(total, *o.clip_percentiles)
            out[slot.name] = total
        return out

    def finalize(self) -> dict[Key, object]:
        o = self.options
        self.info = {"p": {}}
        out = {}
        for key, units in self.units.items():
            rows = gather_units(self.structure(key), units, self.combined(key))
            entries = torch.cat([r for _, r in rows], dim=1)
            if o.clip and o.clip_scope == "structure":
                entries = row_percentile_clip(entries, *o.clip_percentiles)
            out[key] = aggregate(entries, o.aggregation).float()
        return out
