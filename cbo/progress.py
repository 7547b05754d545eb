"""Progress bars (tqdm), or a bar that does nothing when progress is off: one place that decides how long jobs
report."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class NullBar:
    """The bar of a job whose progress is off: tqdm's surface (``update``, ``set_postfix``, ``refresh``,
    ``close``, ``n``, a context manager), doing nothing."""

    n = 0
    total = None

    def update(self, n: float = 1) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_description(self, *args: Any, **kwargs: Any) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NullBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


# work whose pieces differ widely in size (the enumerator's tasks: a pruned subtree may take a microsecond or most
# of the run, and the first one pays the kernels' compilation): tqdm's rate-based ETA is meaningless there (it showed
# two hours for a solve of seconds), so such a bar shows the count and the elapsed time only
NO_ETA_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} |{bar}| {elapsed}{postfix}"


def progress_bar(enabled: bool, *, eta: bool = True, **kwargs: Any) -> Any:
    """A tqdm bar that disappears when done (``total=``, ``desc=``, ...), or a :class:`NullBar` when ``enabled``
    is False (callers update and close either without checking).

    Args:
        eta: show tqdm's estimate of the time left; False for work of very unequal pieces (see
            :data:`NO_ETA_FORMAT`).
    """
    if not enabled:
        return NullBar()
    from tqdm.auto import tqdm

    if not eta:
        kwargs.setdefault("bar_format", NO_ETA_FORMAT)
    return tqdm(leave=False, **kwargs)


def progress_iter(iterable: Iterable[Any], enabled: bool, **kwargs: Any) -> Iterable[Any]:
    """``iterable`` wrapped in a progress bar when ``enabled``."""
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, leave=False, **kwargs)


class Incumbent:
    """The best value of a loop of rounds so far, the round that found it and how many later rounds improved it:
    a bar's postfix that shows the same best from the first round to the last then says why (nothing beat it).

    Example:
        >>> inc = Incumbent()
        >>> _ = inc.update(1, 0.9)
        >>> inc.update(2, 0.9)["improved"]
        '0 of 1 later rounds'
    """

    def __init__(self) -> None:
        self.best = float("inf")
        self.found_in = 0
        self.improvements = 0

    def update(self, round_: int, best: float) -> dict[str, str]:
        """Record round ``round_``'s best (the loop's best so far) and return the postfix fields."""
        if best < self.best - 1e-12:
            self.improvements += self.found_in > 0  # the first incumbent is no improvement
            self.best, self.found_in = float(best), int(round_)
        later = max(int(round_) - 1, 0)
        return {
            "best_kl": f"{self.best:.4g}",
            "from": f"round {self.found_in}",
            "improved": f"{self.improvements} of {later} later rounds",
        }
