"""Progress bars (tqdm), or nothing when progress is off: one place that decides how long jobs report."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def progress_bar(enabled: bool, **kwargs: Any) -> Any:
    """A tqdm bar that disappears when done (``total=``, ``desc=``, ...), or None when ``enabled`` is False."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(leave=False, **kwargs)


def progress_iter(iterable: Iterable[Any], enabled: bool, **kwargs: Any) -> Iterable[Any]:
    """``iterable`` wrapped in a progress bar when ``enabled``."""
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, leave=False, **kwargs)
