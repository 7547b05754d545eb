"""Lazy re-exports: a package's ``__getattr__`` (PEP 562) that imports a name's module on first use."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_getattr(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``names[name]`` (a module path) on first use.

    Example:
        >>> __getattr__ = lazy_getattr(__name__, {"compress": "cbo.pipeline.compression"})  # doctest: +SKIP
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
