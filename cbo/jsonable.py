"""Conversion of results to JSON types: numpy scalars and arrays to Python numbers and lists, non-finite
floats to the strings ``"inf"`` / ``"nan"`` (JSON has no such numbers), anything else to its repr."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def json_number(value: Any) -> Any:
    """``value`` as a float, or its string when it is not finite; None stays None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else str(value)


def jsonable(obj: Any) -> Any:
    """``obj`` with every nested value converted to a JSON type."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return json_number(obj)
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)
