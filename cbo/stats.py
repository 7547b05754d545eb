"""Rank correlations (scipy, imported lazily) used by plots and fidelity benchmarks, and paired bootstraps over
shared units: a perplexity ratio over test windows, a difference of means over task items."""

from __future__ import annotations

from typing import Sequence

from cbo.errors import InvalidOptionError
from cbo.extras import require


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation of two equal-length sequences."""
    stats = require("scipy.stats", "rank correlations")
    return float(stats.spearmanr(a, b).statistic)


def kendall(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall tau-b of two equal-length sequences."""
    stats = require("scipy.stats", "rank correlations")
    return float(stats.kendalltau(a, b).statistic)


def paired_ppl_ratio(
    nll_a: Sequence[float], nll_b: Sequence[float], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The perplexity ratio ``exp(mean(nll_a) - mean(nll_b))`` of two models on the same test windows, and its
    paired bootstrap 95 % interval: the windows are resampled with replacement, the same draw for both.

    Args:
        nll_a, nll_b: per-window mean next-token NLL of the two models, window by window (equal lengths).
        resamples: bootstrap draws; seed: their random stream.

    Returns:
        ``(ratio, low, high)``; a ratio below 1 means ``a`` has the lower perplexity.
    """
    import numpy as np

    diff, means = _bootstrap_means(nll_a, nll_b, resamples, seed)
    ratios = np.exp(means)
    return float(np.exp(diff)), float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))


def paired_mean_difference(
    a: Sequence[float], b: Sequence[float], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``mean(a - b)`` of two models scored on the same units (windows, task items), and its paired bootstrap 95 %
    interval: the units are resampled with replacement, the same draw for both.

    Example:
        >>> paired_mean_difference([1, 1, 0, 1], [0, 1, 0, 0])[0]
        0.5

    Returns:
        ``(difference, low, high)``.
    """
    import numpy as np

    diff, means = _bootstrap_means(a, b, resamples, seed)
    return diff, float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def _bootstrap_means(a: Sequence[float], b: Sequence[float], resamples: int, seed: int):
    """``mean(a - b)`` and the means of ``resamples`` paired bootstrap draws of the units."""
    import numpy as np

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise InvalidOptionError(
            f"need two equal-length, non-empty per-unit sequences, got shapes {x.shape} and {y.shape}"
        )
    if resamples < 1:
        raise InvalidOptionError(f"resamples must be >= 1, got {resamples}")
    idx = np.random.default_rng(seed).integers(0, x.size, size=(int(resamples), x.size))
    diff = x - y
    return float(diff.mean()), diff[idx].mean(axis=1)
