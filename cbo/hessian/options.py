"""Checks shared by the estimators' ``Options.validate()``: each raises InvalidOptionError naming the option,
the value given and what would be valid."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cbo.errors import InvalidOptionError


def check_int(value: Any, label: str, minimum: int) -> None:
    """``value`` is an integer (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < minimum:
        raise InvalidOptionError(f"{label} must be an integer >= {minimum}, got {value!r}.")


def check_number(value: Any, label: str, minimum: float = 0.0) -> None:
    """``value`` is a finite real number (not a bool) >= ``minimum``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        and not hasattr(value, "__float__")
        or not math.isfinite(float(value))
        or float(value) < minimum
    ):
        raise InvalidOptionError(f"{label} must be a finite number >= {minimum}, got {value!r}.")


def check_choice(value: Any, label: str, choices: Sequence[Any]) -> None:
    """``value`` is one of ``choices``."""
    if value not in choices:
        raise InvalidOptionError(f"{label} must be one of {list(choices)}, got {value!r}.")


def check_bool(value: Any, label: str) -> None:
    if not isinstance(value, bool):
        raise InvalidOptionError(f"{label} must be true or false, got {value!r}.")


def check_indices(value: Any, label: str) -> None:
    """A list or tuple of block indices (integers)."""
    if not isinstance(value, (tuple, list)) or not all(
        hasattr(k, "__index__") and not isinstance(k, bool) for k in value
    ):
        raise InvalidOptionError(f"{label} must be a list of block indices, got {value!r}.")
