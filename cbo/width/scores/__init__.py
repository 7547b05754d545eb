"""Width scores: one plugin per method behind one registry (see :mod:`cbo.width.scores.base`)."""

from cbo.width.scores import afr, amp, magnitude, ntk, taylor  # noqa: F401  (registers the built-ins)
from cbo.width.scores.base import (
    GradientScore,
    UnitScores,
    UnknownScoreError,
    WidthScore,
    get,
    names,
    register,
    score_units,
    score_variants,
)

__all__ = [
    "GradientScore",
    "UnitScores",
    "UnknownScoreError",
    "WidthScore",
    "get",
    "names",
    "register",
    "score_units",
    "score_variants",
]
