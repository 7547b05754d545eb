"""Which exact search the enumerator runs: lexicographic enumeration or the relaxation branch and bound.

* ``"lexicographic"`` (:mod:`.plan`, :mod:`.search`): every state with Σx = M in lexicographic order, pruned by
  the per-row and Frank–Wolfe bounds; fastest on small spaces (a 30-block QUBO, C(30, 15) = 1.6e8 states, in
  0.01–0.2 s) and the only search of the Ray and GPU backends and of the plain enumeration (``bound=False``).
* ``"relaxation"`` (:mod:`.relaxation_search`): blocks decided one at a time, bounded by the shifted
  least-squares relaxation; it proves what the lexicographic search cannot — the SmolLM2 sublayer Fisher QUBO
  (N = 60) at M = 8..30 in under a second, where the lexicographic search proves only M = 8 (3 s) — and is as
  fast on the synthetic ``random_block_qubo`` instances ((80, 24): 0.06 CPU s against 19 s). Caps and the
  parameter budget prune its nodes too.

``"auto"`` takes the lexicographic search while C(n_free, r) ≤ :data:`LEXICOGRAPHIC_MAX_STATES` (where both
finish in well under a second and the relaxation's set-up, the Shor shift and the α race, is most of the
time), the relaxation search above it up to :data:`RELAXATION_MAX_N` free blocks (the Shor shift costs O(n³)
per Newton step), and the lexicographic search beyond (nothing proves such problems; the heuristic's states
seed it). Figures: ``research/relaxation_bounds.md`` and ``benchmarks/enumerate.py``.
"""

from __future__ import annotations

import math

from cbo.errors import SolverOptionError
from cbo.solvers.base import Problem

STRATEGIES = ("auto", "lexicographic", "relaxation")
LEXICOGRAPHIC_MAX_STATES = 1e9
RELAXATION_MAX_N = 256


def check_strategy(strategy: str, bound: bool, backend: str) -> None:
    """SolverOptionError for an unknown strategy or one that cannot run with these settings."""
    if strategy not in STRATEGIES:
        raise SolverOptionError(f"strategy={strategy!r} is not valid; use one of {list(STRATEGIES)}.")
    if strategy == "relaxation" and not bound:
        raise SolverOptionError(
            "strategy='relaxation' is a bounded search; bound=False needs strategy='lexicographic'."
        )
    if strategy == "relaxation" and backend != "local":
        raise SolverOptionError(
            f"strategy='relaxation' runs on the local backend; backend={backend!r} runs the lexicographic search."
        )


def choose_strategy(problem: Problem, strategy: str = "auto", bound: bool = True) -> tuple[str, str]:
    """(``"lexicographic"`` or ``"relaxation"``, why) for a problem; a strategy other than ``"auto"`` is kept."""
    n, r = problem.n_free, problem.r
    if strategy != "auto":
        return strategy, f"strategy={strategy!r} was asked for"
    if not bound:
        return "lexicographic", "bound=False: plain enumeration of every state"
    states = math.comb(n, r)
    if states <= LEXICOGRAPHIC_MAX_STATES:
        return "lexicographic", f"C({n},{r}) = {states:.3g} states: small enough to enumerate"
    if n > RELAXATION_MAX_N:
        return "lexicographic", f"{n} free blocks: more than the relaxation search takes ({RELAXATION_MAX_N})"
    return "relaxation", f"C({n},{r}) = {states:.3g} states: the relaxation branch and bound"
