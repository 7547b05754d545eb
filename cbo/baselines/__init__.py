"""Depth-pruning baselines: the block-selection rules CBO is measured against.

Each method ranks the removable blocks of a model (decoder layers, or attention / MLP halves with
``granularity="sublayer"``) from calibration windows and returns the blocks to remove for any M:
``block_influence`` and ``angular`` (``residual.py``), ``ppl`` and ``sleb`` (``removal.py``, measured through
``cbo.measure.measurer``), ``taylor`` (``taylor.py``), and the searches ``evopress`` (``evopress.py``, a per-M
evolutionary search) and ``blockpruner`` (``blockpruner.py``, greedy sublayer removal by perplexity), both measured
through ``cbo.measure.executors``. ``base.py`` holds the registry and the two public calls,
``ranking.py`` the result. A new baseline is one new module here, registered on :data:`BASELINES`.

Example:
    >>> removed = select_blocks("block_influence", model, splits, remove=8)       # doctest: +SKIP
    >>> ranking = rank_blocks("sleb", model, splits, max_remove=15)              # doctest: +SKIP
    >>> ranking.select(8), ranking.select(15)                                     # doctest: +SKIP
"""

from cbo.baselines.base import (
    BASELINES,
    BUILTINS,
    GRANULARITIES,
    Baseline,
    RankContext,
    calibration_windows,
    describe,
    keep_indices,
    methods,
    rank_blocks,
    select_blocks,
)
from cbo.baselines.ranking import Ranking, check_caps, check_count
from cbo.baselines.removal import LOSSES, RemovalMeter
from cbo.baselines.residual import angular_distances, residual_statistics
from cbo.baselines.taylor import TAYLOR_PROTECT, block_param_modules, protected_blocks, taylor_importance

__all__ = [
    "BASELINES",
    "BUILTINS",
    "GRANULARITIES",
    "LOSSES",
    "TAYLOR_PROTECT",
    "Baseline",
    "RankContext",
    "Ranking",
    "RemovalMeter",
    "angular_distances",
    "block_param_modules",
    "calibration_windows",
    "check_caps",
    "check_count",
    "describe",
    "keep_indices",
    "methods",
    "protected_blocks",
    "rank_blocks",
    "residual_statistics",
    "select_blocks",
    "taylor_importance",
]
