"""The refine budget that grows with the space: FPE in proportion to the swap neighbourhood of a set.

A set that removes ``k`` of ``n`` candidate blocks has ``k (n − k)`` neighbours one swap away (one removed block
put back, one kept block removed). That count is what a local search has to cover around its incumbent, and what
EvoPress's generation count follows (``k (n − k) / 1.5``, :func:`cbo.baselines.evopress.default_generations`).
The default refine budget is ``FPE_PER_NEIGHBOUR`` FPE per neighbour, and never less than ``FLOOR`` (the budget
measured at layer granularity, where every point of the grid has ``k (n − k) <= 225``):

* 30 layers, 8 / 12 / 15 removed: 176 / 216 / 225 neighbours → 300 FPE (the floor);
* 60 sublayer halves, 16 removed: 704 neighbours → 939 FPE;
* 80 layers (Llama-3.3-70B), 40 removed: 1,600 → 2,134 FPE; 160 halves, 80 removed: 6,400 → 8,534 FPE.

Where the budget rises above the floor the space is **large** (:func:`large_space`), and the default spends on
measurements rather than on the prior there: the estimate that seeds refine is measured on refine's low-fidelity
windows only (one window instead of the whole pool), which at 60 halves costs a few dozen FPE instead of about a
thousand, and refine's rounds correct it. The rounds then search locally (:func:`space_options`): most of each
batch is swap mutations of the one incumbent, ranked by the surrogate (EvoPress's move with a guide), because in a
large space every improvement the rounds find lies one or two swaps from the incumbent, and the surrogate's global
minima, far from it, do not pay for their measurements. Promotions there are staged (``cbo.search.staged``): a
promoted set that is behind the incumbent on the first four high windows stops there, and the FPE saved pay for
twice as many promotions per round.

Example:
    >>> swap_neighbours(30, 15)
    225
    >>> scaled_budget(60, 16)
    939.0
    >>> large_space(60, 16), large_space(30, 15)
    (True, False)
"""

from __future__ import annotations

import math

from cbo.checks import check_int
from cbo.search.options import RefineOptions

FLOOR = 300.0
FPE_PER_NEIGHBOUR = 4.0 / 3.0
# refine's proposal mix in a large space: 85 % swap mutations of the incumbent alone, 10 % posterior draws, the rest
# the posterior mean's lowest states; 8 of each batch promoted, raced against the incumbent in one intermediate stage
# (cbo.search.staged) (measured at sublayer 8 of 60 halves: docs/concepts/refine.md)
LOCAL_SEARCH = {"local": 0.85, "thompson": 0.1, "local_parents": 1, "promote": 8, "stages": 1}


def swap_neighbours(n: int, k: int) -> int:
    """Sets one swap away from a set that removes ``k`` of ``n`` candidates: ``k (n − k)``."""
    check_int("n (candidate blocks)", n, lo=1)
    check_int("k (blocks removed)", k, lo=0, hi=n)
    return int(k) * (int(n) - int(k))


def scaled_budget(n: int, k: int, *, floor: float = FLOOR, per_neighbour: float = FPE_PER_NEIGHBOUR) -> float:
    """The default refine budget in FPE for removing ``k`` of ``n`` candidate blocks (the kept-list excluded):
    ``max(floor, ceil(per_neighbour · k (n − k)))``."""
    return float(max(floor, math.ceil(per_neighbour * swap_neighbours(n, k))))


def large_space(n: int, k: int) -> bool:
    """Whether removing ``k`` of ``n`` is a space past the floor's: its budget is scaled up, its prior made cheap."""
    return scaled_budget(n, k) > FLOOR


def space_options(n: int, k: int, options: RefineOptions | None = None) -> RefineOptions:
    """Refine's options for removing ``k`` of ``n`` candidates: ``options`` (default: the defaults) as they are in a
    space at the floor, with :data:`LOCAL_SEARCH`'s proposal mix in a large one.

    Example:
        >>> space_options(60, 16).local, space_options(30, 8).local
        (0.85, 0.5)
    """
    base = RefineOptions.build(options)
    return RefineOptions.build(base, **LOCAL_SEARCH) if large_space(n, k) else base


__all__ = [
    "FLOOR",
    "FPE_PER_NEIGHBOUR",
    "LOCAL_SEARCH",
    "large_space",
    "scaled_budget",
    "space_options",
    "swap_neighbours",
]
