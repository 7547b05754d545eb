"""One generic registry of named implementations: solvers, Hessian estimators, width scores, depth baselines.

Each kind holds one :class:`Registry` instance beside its base class. An implementation registers itself
with ``@REGISTRY.register`` (its ``name`` and ``aliases`` class attributes, or explicit arguments), and the
built-in modules are listed by name when the registry is created: they are imported on the first lookup, so
a package's ``__init__`` need not import every implementation and no base module imports its plugins.

Example:
    >>> from dataclasses import dataclass
    >>> shapes = Registry("shape")
    >>> @shapes.register
    ... class Square:
    ...     name = "square"
    ...     aliases = ("sq",)
    ...     @dataclass
    ...     class Options:
    ...         side: float = 1.0
    >>> shapes.get("sq").__name__, shapes.names()
    ('Square', ['square'])
    >>> shapes.make_options("square", {"side": 2.0})
    Square.Options(side=2.0)
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from cbo.errors import InvalidOptionError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named implementations of one kind, with aliases, lazy built-ins and option checking.

    Args:
        kind: what is registered, for messages ("solver", "estimator", "width score", "baseline").
        error: the exception raised for an unknown name (a subclass of :class:`UnknownNameError`).
        option_error: the exception raised for an unknown or invalid option.
        builtins: modules that register the built-in implementations; imported on the first lookup.
    """

    def __init__(
        self,
        kind: str,
        *,
        error: type[UnknownNameError] = UnknownNameError,
        option_error: type[InvalidOptionError] = InvalidOptionError,
        builtins: Sequence[str] = (),
    ) -> None:
        self.kind = kind
        self.error = error
        self.option_error = option_error
        self._builtins = tuple(builtins)
        self._loaded = not self._builtins
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    # ------------------------------------------------------------------ registration
    def register(self, obj: T | None = None, *, name: str | None = None, aliases: Sequence[str] | None = None) -> Any:
        """Add ``obj`` under ``name`` (default: its ``name`` attribute); usable as a bare or called decorator."""

        def add(item: T) -> T:
            key = name or getattr(item, "name", "") or ""
            if not key:
                raise ValueError(f"{item!r} has no name to register it under as a {self.kind}.")
            if key in self._entries and self._entries[key] is not item:
                raise ValueError(f"a {self.kind} named {key!r} is already registered ({self._entries[key]!r}).")
            self._entries[key] = item
            for alias in aliases if aliases is not None else getattr(item, "aliases", ()):
                self._aliases[alias] = key
            return item

        return add if obj is None else add(obj)

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self._builtins:
            importlib.import_module(module)

    # ------------------------------------------------------------------ lookup
    def canonical(self, name: str) -> str:
        """The registered name of ``name`` (resolving aliases); raises the registry's error if unknown."""
        self._load()
        if not isinstance(name, str):
            raise self.error(f"a {self.kind} name must be a string, got {type(name).__name__} {name!r}.")
        key = self._aliases.get(name, name)
        if key not in self._entries:
            alias_note = f" (aliases: {sorted(self._aliases)})" if self._aliases else ""
            raise self.error(f"unknown {self.kind} {name!r}; registered: {sorted(self._entries)}{alias_note}.")
        return key

    def get(self, name: str) -> T:
        """The implementation registered under ``name`` or one of its aliases."""
        return self._entries[self.canonical(name)]

    def names(self) -> list[str]:
        """Registered names, sorted (aliases excluded)."""
        self._load()
        return sorted(self._entries)

    def aliases(self) -> dict[str, str]:
        """``{alias: name}``."""
        self._load()
        return dict(self._aliases)

    def items(self) -> list[tuple[str, T]]:
        """``(name, implementation)`` pairs, sorted by name."""
        self._load()
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        self._load()
        return isinstance(name, str) and (name in self._entries or name in self._aliases)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    # ------------------------------------------------------------------ options
    def make_options(self, name_or_item: str | T, options: Mapping[str, Any] | None = None) -> Any:
        """The implementation's ``Options`` dataclass built from ``options``, checked.

        Unknown option names and values the dataclass (or its ``validate()``) rejects raise the registry's
        option error, naming the valid options.
        """
        item = self.get(name_or_item) if isinstance(name_or_item, str) else name_or_item
        label = getattr(item, "name", None) or getattr(item, "__name__", repr(item))
        options_cls = getattr(item, "Options", None)
        options = dict(options or {})
        if options_cls is None or not dataclasses.is_dataclass(options_cls):
            if options:
                raise self.option_error(f"{self.kind} {label!r} takes no options, got {sorted(options)}.")
            return None
        valid = [f.name for f in dataclasses.fields(options_cls) if f.init]
        bad = sorted(set(options) - set(valid))
        if bad:
            raise self.option_error(f"{self.kind} {label!r} has no option(s) {bad}; valid options: {valid or 'none'}.")
        try:
            opts = options_cls(**options)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, self.option_error):
                raise
            raise self.option_error(f"{self.kind} {label!r}: invalid options {options}: {exc}") from exc
        check: Callable[[], Any] | None = getattr(opts, "validate", None)
        if check is not None:
            check()
        return opts
