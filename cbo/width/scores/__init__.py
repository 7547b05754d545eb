"""Width scores: one plugin module per method behind one registry, :data:`SCORES` (see :mod:`cbo.width.scores.base`).

The built-in scores (afr, amp, magnitude, ntk, taylor) register themselves when the registry is first read.

Example:
    >>> from cbo.width.scores import SCORES, score_units      # doctest: +SKIP
    >>> SCORES.names()                                       # doctest: +SKIP
    ['afr', 'amp', 'magnitude', 'ntk', 'taylor']
"""

from cbo.width.scores.base import (
    SCORES,
    GradientScore,
    UnitScores,
    WidthScore,
    get,
    names,
    register,
    score_units,
    score_variants,
)

__all__ = [
    "SCORES",
    "GradientScore",
    "UnitScores",
    "WidthScore",
    "get",
    "names",
    "register",
    "score_units",
    "score_variants",
]
