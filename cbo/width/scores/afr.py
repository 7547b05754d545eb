"""AFR lifted to structures: a signed first-order score, power-transformed, clipped, aggregated with its sign.

Per weight, the signed score is the first-order loss increase when the weight is removed,
``s = -w · ∂L/∂w`` (gradients of the LM cross-entropy averaged over the calibration batches). Lifting
``s`` from weights to units takes three fixes, applied in this order inside one aggregation, each of
which can be switched off for ablation:

1. power transform ``s ↦ sign(s)·|s|^p`` (``power``, exponent ``p``): tames heavy tails so that scores of
   different matrices become comparable;
2. percentile clipping (``clip``, percentiles ``clip_percentiles``): each matrix's transformed scores are
   clamped to their own lower/upper percentiles *before* aggregation, so a few extreme weights cannot
   decide a unit;
3. sign-preserving aggregation (``sign``): a unit's importance is the mean of its weights' signed values
   (switched off: the mean of their absolute values).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cbo.errors import InvalidOptionError
from cbo.extras import require
from cbo.structures import gather_units
from cbo.width.scores.base import GradientScore, Key, lm_loss, register

torch = require("torch", "AFR scores")


def check_exponent(p: float) -> None:
    """Raise :class:`InvalidOptionError` unless the power exponent ``p`` is > 0."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not p > 0:
        raise InvalidOptionError(f"AFR power exponent p must be > 0, got {p}")


def check_clip(lower: float, upper: float) -> None:
    """Raise :class:`InvalidOptionError` unless ``0 <= lower < upper <= 100``."""
    if not all(isinstance(x, (int, float)) for x in (lower, upper)) or not 0.0 <= lower < upper <= 100.0:
        raise InvalidOptionError(f"clip percentiles must satisfy 0 <= lower < upper <= 100, got ({lower}, {upper})")


def power_transform(s, p: float):
    """``sign(s)·|s|^p`` elementwise (sign kept, magnitudes compressed for ``p < 1``)."""
    check_exponent(p)
    return torch.sign(s) * s.abs().pow(p)


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
    """``s`` clamped to its own ``lower``-th and ``upper``-th percentiles."""
    check_clip(lower, upper)
    lo, hi = percentiles(s, [lower, upper])
    return s.clamp(lo, hi)


def aggregate(rows, sign_preserving: bool = True):
    """Per-row mean of ``(n_units, m)`` entries, signed (default) or of absolute values."""
    return rows.mean(1) if sign_preserving else rows.abs().mean(1)


@register
class AFRScore(GradientScore):
    """AFR-structured importance; ``power``, ``clip`` and ``sign`` switch the three fixes."""

    name = "afr"
    aliases = ("afr-structured",)
    description = "signed Taylor, power transform + percentile clipping + sign-preserving mean per unit"
    finalize_options = ("p", "power", "clip", "clip_percentiles", "sign")

    @dataclass
    class Options:
        p: float = 0.5
        power: bool = True
        clip: bool = True
        clip_percentiles: tuple[float, float] = (1.0, 99.0)
        sign: bool = True

        def __post_init__(self) -> None:
            self.clip_percentiles = tuple(float(x) for x in self.clip_percentiles)  # lists from JSON / the CLI

        def validate(self) -> None:
            if len(self.clip_percentiles) != 2:
                raise InvalidOptionError(f"clip_percentiles must be (lower, upper), got {self.clip_percentiles}")
            if self.power:
                check_exponent(self.p)
            if self.clip:
                check_clip(*self.clip_percentiles)

    def objective(self, batch):
        return lm_loss(self.model, batch)

    def transform(self, s):
        """Steps 1 and 2 on one matrix of signed scores (power, then clipping at its percentiles)."""
        o = self.options
        if o.power:
            s = power_transform(s, o.p)
        if o.clip:
            s = percentile_clip(s, *o.clip_percentiles)
        return s

    def finalize(self) -> dict[Key, object]:
        out = {}
        for key, units in self.units.items():
            signed = self.per_weight(key, lambda w, g: self.transform((-w * g).float()))
            rows = gather_units(self.structure(key), units, signed)
            out[key] = aggregate(torch.cat([r for _, r in rows], dim=1), self.options.sign).float()
        return out
