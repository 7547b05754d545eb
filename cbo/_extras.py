"""Lazy import of optional dependencies with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from cbo.errors import MissingExtraError


def require(module: str, extra: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise MissingExtraError naming ``pip install 'cbo[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = f" for {purpose}" if purpose else ""
        raise MissingExtraError(
            f"'{module}' is needed{why} but is not installed ({exc}). Install it with: pip install 'cbo[{extra}]'"
        ) from exc


def has_module(module: str) -> bool:
    """True when ``module`` can be imported (without importing it twice on failure)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
