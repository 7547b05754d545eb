"""Rank correlations (scipy, imported lazily) used by plots and fidelity benchmarks, and the paired bootstrap of
a perplexity ratio over test windows."""

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

    a, b = np.asarray(nll_a, dtype=np.float64), np.asarray(nll_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise InvalidOptionError(
            f"need two equal-length, non-empty per-window sequences, got shapes {a.shape} and {b.shape}"
        )
    if resamples < 1:
        raise InvalidOptionError(f"resamples must be >= 1, got {resamples}")
    idx = np.random.default_rng(seed).integers(0, a.size, size=(int(resamples), a.size))
    diff = a - b
    ratios = np.exp(diff[idx].mean(axis=1))
    return float(np.exp(diff.mean())), float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))
