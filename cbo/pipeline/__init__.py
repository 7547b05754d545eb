"""The end-to-end pipelines: ``prune_depth`` (depth pruning by constrained binary optimization, validated) and
``compress`` (depth and width), with one report family (``reports.py``)."""

from __future__ import annotations

from typing import Any

from cbo.pipeline.depth import (
    DEFAULT_ESTIMATOR,
    Validation,
    depth_methods,
    prune_blocks,
    prune_depth,
    validate_candidates,
)
from cbo.pipeline.reports import DepthReport, Report, ValidatedState


def __getattr__(name: str) -> Any:
    # the width pipeline, imported on first use (it needs the width modules)
    if name in ("compress", "CompressionReport"):
        from cbo.pipeline import compression as module

        return getattr(module, name)
    raise AttributeError(f"module 'cbo.pipeline' has no attribute {name!r}")


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
