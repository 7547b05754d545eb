"""Shared argument checks: one place that says what an integer, a number, a choice or a seed option accepts.

Each check returns the value (as a plain ``int`` / ``float`` where it converts) or raises ``error`` (by default
:class:`~cbo.errors.InvalidOptionError`) with a message naming the option, the bad value and the valid range, so
every module words the same rule the same way. ``bool`` is never accepted as a number (``True`` is an ``int`` in
Python, but ``k=True`` is a mistake). Model: dimod's ``decorators.py``.

Example:
    >>> check_int("top_k", 3, lo=1)
    3
    >>> check_float("time_limit", "1", lo=0)    # doctest: +SKIP
    InvalidOptionError: time_limit must be a number >= 0, got '1' (a str).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

from cbo.errors import InvalidOptionError

MAX_SEED = 2**32 - 1  # what numpy's and torch's generators accept from every caller


def describe(value: Any) -> str:
    """``repr`` of a bad value, shortened, with its type where the repr hides it (``'1'`` is a str)."""
    text = repr(value)
    if len(text) > 80:
        text = f"{text[:80]}… ({len(text)} characters)"
    if isinstance(value, (str, bytes)) or not isinstance(value, (numbers.Number, type(None))):
        return f"{text} (a {type(value).__name__})"
    return text


def span(lo: Any = None, hi: Any = None, *, lo_open: bool = False, hi_open: bool = False) -> str:
    """The words for a range: ``">= 1"``, ``"in 0..5"``, ``"> 0"``, ``"in (0, 1]"``."""
    if lo is not None and hi is not None:
        if not lo_open and not hi_open and all(isinstance(v, int) for v in (lo, hi)):
            return f"in {lo}..{hi}"
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi}"
    return ""


def is_int(value: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number (Python or numpy int or float), not a bool and not complex."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None, **how: Any) -> Any:
    """``int(value)`` when it is an integer in ``lo..hi`` (either bound may be None), else ``error`` naming the option
    and the range. ``how``: ``none_ok`` (None itself passes), ``error``, ``hint`` (a sentence appended, e.g. the
    fix), as for :func:`check_float`."""
    return check_float(name, value, lo, hi, integer=True, **how)


def check_float(
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    finite: bool = True,
    integer: bool = False,
    none_ok: bool = False,
    error: type[Exception] = InvalidOptionError,
    hint: str = "",
) -> Any:
    """``float(value)`` when it is a real number in the range (NaN never; ±inf only when not ``finite``), else
    ``error`` naming the option and the range; with ``integer``, ``int(value)`` of an integer only."""
    if value is None and none_ok:
        return None
    ok = (
        is_int(value)
        if integer
        else is_number(value) and not math.isnan(value) and (not finite or math.isfinite(value))
    )
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        kind = "an integer" if integer else "a finite number" if finite else "a number"
        rule = " ".join(w for w in (kind, span(lo, hi, lo_open=lo_open, hi_open=hi_open)) if w)
        raise error(
            f"{name} must be {rule}{' or None' if none_ok else ''}, got {describe(value)}.{' ' + hint if hint else ''}"
        )
    return int(value) if integer else float(value)


def check_choice(name: str, value: Any, choices: Iterable[Any], *, error: type[Exception] = InvalidOptionError) -> Any:
    """``value`` when it is one of ``choices``, else ``error`` listing them."""
    choices = list(choices)
    try:
        ok = value in choices
    except TypeError:  # an unhashable value against a set-like
        ok = False
    if not ok:
        raise error(f"{name} must be one of {', '.join(map(repr, choices))}; got {describe(value)}.")
    return value


def blocks_where(what: str, n: int, kept: int = 0) -> str:
    """The words for what limits a block count: ``"the model has 6 blocks, 2 of them kept"``."""
    return f"the {what} has {n} blocks" + (f", {kept} of them kept" if kept else "")


def check_in_range(
    name: str, value: Any, lo: int, hi: int, where: str, *, error: type[Exception] = InvalidOptionError
) -> int:
    """``int(value)`` when it is an integer in ``lo..hi``, else ``error`` with the one message of a count out of range:
    ``"remove=30 is out of range: the model has 6 blocks; use 1..5."`` (``where``: what sets the range, e.g.
    :func:`blocks_where`). The same words for every wrong value, however far off."""
    value = check_int(name, value, error=error)
    if not lo <= value <= hi:
        raise error(f"{name}={value} is out of range: {where}; use {lo}..{hi}.")
    return value


def check_bool(name: str, value: Any, *, error: type[Exception] = InvalidOptionError) -> bool:
    """``value`` when it is True or False (not 0, 1 or "yes"), else ``error``."""
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {describe(value)}.")
    return value


def check_indices(name: str, value: Any, *, error: type[Exception] = InvalidOptionError) -> list[int]:
    """A list or tuple of integer indices (block indices, positions), as a list of ``int``."""
    if not isinstance(value, (tuple, list)) or not all(is_int(k) for k in value):
        raise error(f"{name} must be a list of integer indices (e.g. [0, 3]), got {describe(value)}.")
    return [int(k) for k in value]


def check_seed(name: str, value: Any, *, error: type[Exception] = InvalidOptionError) -> int:
    """A random seed: an integer in 0..2**32-1 (what numpy and torch take from every caller)."""
    return check_int(name, value, 0, MAX_SEED, error=error)


def available_memory() -> int | None:
    """Bytes of memory a new allocation can get now (``MemAvailable``; total physical memory where that is
    missing), or None where neither is known."""
    import os

    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_memory(what: str, need: int, *, error: type[Exception] = InvalidOptionError, hint: str = "") -> None:
    """``error`` before the allocation when ``what`` needs more than the ``need`` bytes this machine has free,
    saying how much it needs and how much there is."""
    have = available_memory()
    if have is not None and need > have:
        raise error(
            f"{what} needs about {need / 2**30:.1f} GiB of memory, but {have / 2**30:.1f} GiB are available."
            + (f" {hint}" if hint else "")
        )
