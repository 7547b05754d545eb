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
thousand, and refine's rounds correct it.

Example:
    >>> swap_neighbours(30, 15)
    225
    >>> scaled_budget(60, 16)
    939.0
"""

from __future__ import annotations

import math

from cbo.checks import check_int

FLOOR = 300.0
FPE_PER_NEIGHBOUR = 4.0 / 3.0


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


__all__ = ["FLOOR", "FPE_PER_NEIGHBOUR", "large_space", "scaled_budget", "swap_neighbours"]
