"""Count-preserving swap moves over removal sets: EvoPress's mutation, shared with the refinement loop.

A move removes one kept unit of a kind and restores one removed unit of the same kind, so the number removed of
every kind stays what the parent had. A mutation makes ``min(U{1..m}, U{1..m})`` such moves (EvoPress's
operator: mostly one or two swaps, at most ``m``), each of a kind drawn uniformly among the kinds that can move.
A jump makes exactly ``s`` distinct swaps (no unit moved twice): a set ``2 s`` away in Hamming distance, where the
refinement loop restarts once its local search has stalled.

Example:
    >>> import numpy as np
    >>> moves = SwapMoves(["layer"] * 6, keep=[0], rng=np.random.default_rng(0))
    >>> child = moves.mutate((1, 2), 3)
    >>> len(child), 0 in child
    (2, False)
    >>> len(moves.neighbours((1, 2)))  # 2 removed x 3 kept (unit 0 never moves)
    6
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class SwapMoves:
    """Random sets and mutations over units of the given kinds, never touching ``keep``.

    Args:
        kinds: the kind of each unit (block).
        keep: unit indices never removed (and never restored: a mutation only moves the others).
        rng: the random stream.
    """

    def __init__(self, kinds: Sequence[str], keep: Sequence[int] = (), rng: np.random.Generator | None = None):
        self.rng = rng if rng is not None else np.random.default_rng()
        fixed = set(int(i) for i in keep)
        self.units: dict[str, list[int]] = {}
        for i, kind in enumerate(kinds):
            units = self.units.setdefault(kind, [])
            if i not in fixed:
                units.append(i)

    def random_set(self, counts: dict[str, int]) -> tuple[int, ...]:
        """A uniformly random set with ``counts[kind]`` units removed of each kind."""
        chosen: list[int] = []
        for kind, c in counts.items():
            chosen += [int(i) for i in self.rng.choice(self.units[kind], size=c, replace=False)]
        return tuple(sorted(chosen))

    def movable(self, parent: Sequence[int]) -> list[str]:
        """The kinds of which ``parent`` removes some but not all units (only they can swap)."""
        removed = set(parent)
        out = []
        for kind, units in self.units.items():
            gone = sum(1 for i in units if i in removed)
            if 0 < gone < len(units):
                out.append(kind)
        return out

    def neighbours(self, parent: Sequence[int]) -> list[tuple[int, ...]]:
        """Every set one swap away from ``parent`` (one removed unit restored, one kept unit of the same kind
        removed): ``k (n − k)`` sets for one kind with ``k`` of its ``n`` movable units removed."""
        removed = set(int(i) for i in parent)
        out = []
        for units in self.units.values():
            gone = [i for i in units if i in removed]
            kept = [i for i in units if i not in removed]
            out += [tuple(sorted((removed - {back}) | {add})) for back in gone for add in kept]
        return out

    def mutate(self, parent: Sequence[int], max_mutations: int, kinds: Sequence[str] | None = None) -> tuple[int, ...]:
        """``min(U{1..m}, U{1..m})`` swaps of ``parent`` (``kinds``: the movable kinds, computed when None)."""
        removed = set(int(i) for i in parent)
        movable = list(kinds) if kinds is not None else self.movable(parent)
        if not movable:
            return tuple(sorted(removed))
        flips = min(int(self.rng.integers(1, max_mutations + 1)), int(self.rng.integers(1, max_mutations + 1)))
        for _ in range(flips):
            kind = movable[int(self.rng.integers(len(movable)))]
            units = self.units[kind]
            kept = [i for i in units if i not in removed]
            gone = [i for i in units if i in removed]
            add = kept[int(self.rng.integers(len(kept)))]
            back = gone[int(self.rng.integers(len(gone)))]
            removed.add(add)
            removed.discard(back)
        return tuple(sorted(removed))

    def jump(self, parent: Sequence[int], swaps: int) -> tuple[int, ...]:
        """``swaps`` distinct swaps of ``parent`` (no unit moved twice; fewer where a kind runs out of units): a set
        ``2 * swaps`` away from it in Hamming distance, every count kept."""
        start = set(int(i) for i in parent)
        removed = set(start)
        for _ in range(swaps):
            options = []
            for units in self.units.values():
                kept = [i for i in units if i not in start and i not in removed]
                gone = [i for i in units if i in start and i in removed]
                if kept and gone:
                    options.append((kept, gone))
            if not options:
                break
            kept, gone = options[int(self.rng.integers(len(options)))]
            removed.add(kept[int(self.rng.integers(len(kept)))])
            removed.discard(gone[int(self.rng.integers(len(gone)))])
        return tuple(sorted(removed))
