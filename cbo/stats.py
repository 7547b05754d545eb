"""Rank correlations (scipy, imported lazily) used by plots and fidelity benchmarks."""

from __future__ import annotations

from typing import Sequence

from cbo.extras import require


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation of two equal-length sequences."""
    stats = require("scipy.stats", "rank correlations")
    return float(stats.spearmanr(a, b).statistic)


def kendall(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall tau-b of two equal-length sequences."""
    stats = require("scipy.stats", "rank correlations")
    return float(stats.kendalltau(a, b).statistic)
