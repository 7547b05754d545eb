"""The end-to-end pipelines: ``prune_depth`` (depth pruning by constrained binary optimization, validated) and
``compress`` (depth and width), with one report family (``reports.py``) and one set of option groups
(``options.py``: ``Data``, ``Estimate``, ``Search``, ``Run``)."""

from __future__ import annotations

from cbo.lazy import lazy_getattr
from cbo.pipeline.depth import (
    Validation,
    depth_methods,
    prune_blocks,
    prune_depth,
    validate_candidates,
)
from cbo.pipeline.options import DEFAULT_ESTIMATOR, Data, Estimate, Run, Search
from cbo.pipeline.reports import DepthReport, Report, ValidatedState

# the width pipeline, imported on first use (it needs the width modules)
__getattr__ = lazy_getattr(__name__, dict.fromkeys(("compress", "CompressionReport"), "cbo.pipeline.compression"))


__all__ = [
    "DEFAULT_ESTIMATOR",
    "Data",
    "DepthReport",
    "Estimate",
    "Run",
    "Search",
    "Report",
    "ValidatedState",
    "Validation",
    "CompressionReport",
    "compress",
    "depth_methods",
    "prune_blocks",
    "prune_depth",
    "validate_candidates",
]
