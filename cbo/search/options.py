"""The options of the refinement loop (:mod:`cbo.search.refine`): every default stated once, here.

One meaning of the budget: a refinement is given a budget in forward-pass equivalents (FPE: one full forward pass
over one calibration window) for its **rounds**, the measurements after the prior. The prior's own cost and the
final validation are paid apart and reported beside it (``RefineResult.cost``). The loop spends what it is given:
when no round has improved the best measured set for ``patience`` rounds it widens the search (larger swaps, more
posterior draws, restarts away from its incumbents) instead of stopping, and it stops early only when it has nothing
new to propose (``"exhausted"``) or has run ``max_rounds`` rounds.

Example:
    >>> opts = RefineOptions(batch=12, promote=2)
    >>> opts.windows(32)
    (1, 16)
    >>> opts.round_cost(32)   # 12 sets on 1 window, 2 of them on 15 more
    42.0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cbo.checks import check_choice, check_float, check_int
from cbo.errors import InvalidOptionError

PRIOR_WINDOWS = ("low", "high")
DEFAULT_HIGH_WINDOWS = 16  # high-fidelity windows when none are given (fewer when the pool is smaller)


@dataclass(frozen=True)
class RefineOptions:
    """How the refinement loop proposes, measures and widens; the budget itself is an argument of the loop.

    Attributes:
        low_windows / high_windows: windows of the two fidelities (the first ones of a seeded permutation of the
            pool; the low ones are a subset of the high ones). ``high_windows=None``: 16, or the pool when smaller.
        batch: proposals per round; ``promote`` of them (the lowest on the low windows) go on to the high ones.
        thompson: the share of proposals from posterior draws (the global minimum of one draw each).
        local: the share of proposals from the trust region: ``screen`` swap mutations of the ``local_parents``
            best sets measured at high fidelity, ranked by one posterior draw (the rest of the batch, after
            ``thompson`` and ``local``: the posterior mean's lowest states).
        validate: the best sets measured on the validation windows at the end (when there are some).
        patience: rounds without a better best set before the search widens (it never stops for it).
        max_rounds: rounds at most (stop reason ``"rounds"``).
        round_floor: the least share of the budget one round spends: a round whose batch would cost less is
            enlarged (batch and promote in proportion), so that cheap measurements (sets that remove only late
            blocks rerun few layers) do not turn a budget into thousands of rounds of solving and refitting.
        prior_windows: ``"low"`` (the default: the prior is measured on the low-fidelity windows, a fraction of the
            cost; the rounds correct it) or ``"high"`` (used by :func:`cbo.search.refine.refine` only).
        rotate_low: screen each round on the next ``low_windows`` of the high-fidelity windows in turn instead of
            the same low windows every round (EvoPress draws a fresh minibatch per stage): one window's quirks then
            decide one round's promotions, not every round's. Sets screened on different windows enter the
            surrogate with each window's offset removed.
        stages: intermediate stages of a promotion (``cbo.search.staged``): a promoted set climbs the high windows
            in ``stages`` steps of geometric size and stops where its mean is above the incumbent's on the same
            windows; 0 (the default): straight to every high window.
    """

    low_windows: int = 1
    high_windows: int | None = None
    batch: int = 24
    promote: int = 4
    thompson: float = 0.25
    local: float = 0.5
    local_parents: int = 3
    screen: int = 512
    validate: int = 10
    patience: int = 6
    max_rounds: int = 1000
    round_floor: float = 0.02
    prior_windows: str = "low"
    rotate_low: bool = False
    stages: int = 0

    @classmethod
    def build(cls, options: RefineOptions | None = None, **flat: Any) -> RefineOptions:
        """``options`` (default: the defaults) with the flat keywords ``flat`` replacing its fields.

        Raises:
            InvalidOptionError: a keyword that is no refine option (the message lists the valid ones).
        """
        base = options if options is not None else cls()
        if not isinstance(base, cls):
            raise InvalidOptionError(f"options must be a RefineOptions, got {type(base).__name__}.")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(flat) - set(names))
        if unknown:
            raise InvalidOptionError(f"refine has no option(s) {unknown}; valid options: {names}.")
        return dataclasses.replace(base, **flat) if flat else base

    def windows(self, n_pool: int) -> tuple[int, int]:
        """``(low, high)`` window counts for a pool of ``n_pool`` calibration windows, checked."""
        high = self.high_windows if self.high_windows is not None else min(DEFAULT_HIGH_WINDOWS, int(n_pool))
        low = self.low_windows if self.high_windows is not None else min(self.low_windows, high)
        for name, value in (("low_windows", low), ("high_windows", high)):
            check_int(name, value, lo=1)
        if not low <= high <= n_pool:
            raise InvalidOptionError(
                f"need low_windows <= high_windows <= calibration windows, got {low}, {high}, {n_pool}"
            )
        return int(low), int(high)

    def check(self, n_pool: int) -> tuple[int, int]:
        """Every option checked against a pool of ``n_pool`` windows; returns :meth:`windows`."""
        low, high = self.windows(n_pool)
        for name in ("batch", "validate", "patience", "max_rounds", "local_parents", "screen"):
            check_int(name, getattr(self, name), lo=1)
        check_int("stages", self.stages, lo=0, hint="(0: promote straight to every high window)")
        check_int("promote", self.promote, lo=0, hi=self.batch, hint=f"(at most batch={self.batch})")
        check_float("thompson", self.thompson, 0.0, 1.0)
        check_float("local", self.local, 0.0, 1.0)
        if self.local + self.thompson > 1.0:
            raise InvalidOptionError(
                f"local and thompson are shares of the batch with local + thompson <= 1, got {self.local!r}, "
                f"{self.thompson!r}"
            )
        check_float("round_floor", self.round_floor, 0.0, 1.0)
        check_choice("prior_windows (the fidelity the prior is measured at)", self.prior_windows, PRIOR_WINDOWS)
        if not isinstance(self.rotate_low, bool):
            raise InvalidOptionError(f"rotate_low must be True or False, got {self.rotate_low!r}")
        return low, high

    def round_cost(self, n_pool: int, per_pair: float = 1.0, *, first: bool = False) -> float:
        """FPE of one round of ``batch`` proposals on a pool of ``n_pool`` windows: every proposal on the low
        windows, ``promote`` of them on the rest of the high ones, at ``per_pair`` FPE a (set, window) pair (at most
        1: one full pass); ``first``: plus the original passes of the high windows, charged once."""
        low, high = self.windows(n_pool)
        pairs = self.batch * low + self.promote * (high - low)
        return float(per_pair * pairs + (high if first else 0))


def check_budget(budget: Any, name: str = "budget") -> float:
    """A refine budget: a finite number of FPE > 0 (InvalidOptionError naming ``name`` otherwise)."""
    import math

    from cbo.checks import is_number

    if not is_number(budget) or not math.isfinite(float(budget)) or float(budget) <= 0:
        raise InvalidOptionError(
            f"{name} must be a budget in forward-pass equivalents > 0, the FPE of the rounds after the prior (e.g. "
            f"{name}=300), got {budget!r}."
        )
    return float(budget)
