"""The end-to-end pipelines: ``prune_depth`` (depth pruning by constrained binary optimization, validated) and
``compress`` (depth and width), with one report family (``reports.py``)."""

from __future__ import annotations

from cbo.lazy import lazy_getattr
from cbo.pipeline.depth import (
    DEFAULT_ESTIMATOR,
    Validation,
    depth_methods,
    prune_blocks,
    prune_depth,
    validate_candidates,
)
from cbo.pipeline.reports import DepthReport, Report, ValidatedState

# the width pipeline, imported on first use (it needs the width modules)
__getattr__ = lazy_getattr(__name__, dict.fromkeys(("compress", "CompressionReport"), "cbo.pipeline.compression"))


__all__ = [
    "DEFAULT_ESTIMATOR",
    "DepthReport",
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
