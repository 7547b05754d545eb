"""What a depth baseline learned from the calibration windows, and ``select(M)``: the blocks it removes.

A :class:`Ranking` answers every M from one run: scored methods (block influence, Taylor+, PPL) take the
lowest scores, greedy methods (SLEB) a prefix of their removal order, run methods (angular) the contiguous
run of smallest distance, and per-M searches the set they found for that M. It holds numbers only (no model),
so it is saved as JSON and reloaded without torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cbo.checks import check_int
from cbo.errors import InfeasibleError
from cbo.model.families import resolve_caps


def check_count(value: Any, label: str) -> int:
    """``value`` as an int (a number of blocks); raises InfeasibleError naming ``label`` otherwise."""
    return check_int(label, value, error=InfeasibleError)


def check_caps(caps: Mapping[str, int] | None, kinds: Sequence[str]) -> dict[str, int]:
    """``{kind: max}`` limits on the removed blocks' kinds, checked against the kinds present.

    Raises:
        InfeasibleError: a kind no block has, or a limit that is not an integer >= 0.
    """
    out: dict[str, int] = {}
    for kind, limit in dict(caps or {}).items():
        limit = check_count(limit, f"caps[{kind!r}]")
        if limit < 0:
            raise InfeasibleError(f"caps[{kind!r}] must be >= 0, got {limit}.")
        out[kind] = limit
    return resolve_caps(out, kinds)  # a kind that combined kinds hold ("mamba" of "mamba+mlp") caps them


def json_number(v: Any) -> Any:
    """A float for JSON; ``nan`` / ``inf`` as their strings (JSON has no such numbers)."""
    v = float(v)
    return v if math.isfinite(v) else str(v)


@dataclass
class Ranking:
    """What a baseline learned from the calibration windows; ``select(M)`` gives the blocks to remove.

    Attributes:
        method, granularity: the rule and the block granularity.
        names, kinds, sizes: the blocks (as ``cbo.model.blocks.find_blocks`` lists them).
        scores: per-block score, lower = removed first (BI, Taylor importance, loss with the block removed);
            ``nan`` for blocks that may not be removed.
        order: greedy removal order (SLEB), ``order_losses[k]`` the calibration loss after ``order[:k+1]``.
        distances: angular methods: ``distances[a, b]`` the mean angular distance between the states entering
            blocks ``a`` and ``b`` (``b = N`` is the model's last block output).
        sets: per-M searches: ``{M: the removed blocks found for M}``.
        keep: blocks never removed.
        passes: forward / backward passes over calibration batches; wall_time: seconds.

    Example:
        >>> r = Ranking("demo", "layer", ["layers.0", "layers.1", "layers.2"], ["layer"] * 3, [10] * 3,
        ...             scores=np.array([0.3, 0.1, 0.2]))
        >>> r.select(2), r.max_remove()
        ([1, 2], 2)
    """

    method: str
    granularity: str
    names: list[str]
    kinds: list[str]
    sizes: list[int]
    scores: np.ndarray | None = None
    order: list[int] | None = None
    order_losses: list[float] | None = None
    distances: np.ndarray | None = None
    sets: dict[int, list[int]] | None = None
    keep: tuple[int, ...] = ()
    passes: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0})
    wall_time: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.names)

    def _removable(self) -> list[int]:
        """Blocks this ranking may remove: not kept and, for scored methods, with a finite score."""
        free = [i for i in range(self.n) if i not in self.keep]
        if self.scores is not None and self.order is None and self.distances is None and self.sets is None:
            free = [i for i in free if np.isfinite(self.scores[i])]
        return free

    def max_remove(self) -> int:
        """The largest M this ranking can answer."""
        if self.sets is not None:
            return max(self.sets, default=0)
        if self.distances is not None:
            return self._longest_run()
        removable = len(self._removable())
        if removable == self.n:
            removable -= 1  # something must remain
        if self.order is not None:
            removable = min(removable, len(self.order))
        return removable

    def _longest_run(self) -> int:
        """The longest contiguous run of blocks that are not kept (a run method removes one such run)."""
        best = length = 0
        for i in range(self.n):
            length = 0 if i in self.keep else length + 1
            best = max(best, length)
        return min(best, self.n - 1)  # something must remain

    def select(self, remove: int, *, caps: Mapping[str, int] | None = None) -> list[int]:
        """The ``remove`` blocks this method removes (sorted indices).

        Args:
            remove: M.
            caps: optional ``{kind: max}`` limits (e.g. ``{"attention": 4}``) on the removed blocks' kinds; the
                scored methods take the lowest scores that fit, angular the best run that fits, SLEB its
                greedy order skipping blocks that would break a cap (pass caps to ``rank_blocks`` for a
                greedy search that respects them throughout).

        Raises:
            InfeasibleError: M is out of range for the model, the kept blocks or the caps.
        """
        check_count(remove, "remove")
        if not 1 <= remove <= self.max_remove():
            raise InfeasibleError(
                f"{self.method}: remove={remove} is out of range; this ranking answers 1..{self.max_remove()} "
                f"({self.n} {self.granularity} blocks, {len(self.keep)} kept)."
            )
        caps = check_caps(caps, self.kinds)
        if self.sets is not None:
            return self._select_searched(remove, caps)
        if self.distances is not None:
            return self._select_run(remove, caps)
        if self.order is not None:
            candidates = list(self.order)
        else:
            assert self.scores is not None
            candidates = sorted(self._removable(), key=lambda i: (self.scores[i], i))
        chosen: list[int] = []
        used: dict[str, int] = {}
        for i in candidates:
            kind = self.kinds[i]
            if kind in caps and used.get(kind, 0) >= caps[kind]:
                continue
            chosen.append(i)
            used[kind] = used.get(kind, 0) + 1
            if len(chosen) == remove:
                return sorted(chosen)
        raise InfeasibleError(
            f"{self.method}: only {len(chosen)} removable blocks fit (kept {list(self.keep)}, caps {caps}, "
            f"blocks this method never removes excluded); cannot remove {remove}."
        )

    def _select_searched(self, remove: int, caps: dict[str, int]) -> list[int]:
        assert self.sets is not None
        if remove not in self.sets:
            raise InfeasibleError(
                f"{self.method} searched a set for M in {sorted(self.sets)} only; rank again with max_remove={remove}."
            )
        chosen = sorted(self.sets[remove])
        over = {k: v for k, v in caps.items() if sum(self.kinds[i] == k for i in chosen) > v}
        if over:
            raise InfeasibleError(
                f"{self.method}: the set found for M={remove} breaks the caps {over}; rank with them."
            )
        return chosen

    def _select_run(self, remove: int, caps: dict[str, int]) -> list[int]:
        assert self.distances is not None
        best, best_d = None, math.inf
        for start in range(0, self.n - remove + 1):
            run = range(start, start + remove)
            if any(i in self.keep for i in run):
                continue
            counts: dict[str, int] = {}
            for i in run:
                counts[self.kinds[i]] = counts.get(self.kinds[i], 0) + 1
            if any(counts.get(k, 0) > v for k, v in caps.items()):
                continue
            d = float(self.distances[start, start + remove])
            if d < best_d:
                best, best_d = start, d
        if best is None:
            raise InfeasibleError(
                f"{self.method}: no contiguous run of {remove} blocks avoids the kept blocks {list(self.keep)} "
                f"within the caps {caps}."
            )
        return list(range(best, best + remove))

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``nan`` / ``inf`` as strings); :meth:`from_json` rebuilds the ranking."""

        def arr(a: Any) -> Any:
            if a is None:
                return None
            return [[json_number(v) for v in row] for row in a] if np.ndim(a) == 2 else [json_number(v) for v in a]

        return {
            "method": self.method,
            "granularity": self.granularity,
            "names": list(self.names),
            "kinds": list(self.kinds),
            "sizes": [int(s) for s in self.sizes],
            "scores": arr(self.scores),
            "order": self.order,
            "order_losses": None if self.order_losses is None else [json_number(v) for v in self.order_losses],
            "distances": arr(self.distances),
            "sets": None if self.sets is None else {str(m): [int(i) for i in s] for m, s in self.sets.items()},
            "keep": list(self.keep),
            "passes": dict(self.passes),
            "wall_time": self.wall_time,
            "info": self.info,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ranking:
        def arr(a: Any) -> Any:
            return None if a is None else np.asarray(a, dtype=np.float64)

        sets = data.get("sets")
        losses = data.get("order_losses")
        return cls(
            method=data["method"],
            granularity=data["granularity"],
            names=list(data["names"]),
            kinds=list(data["kinds"]),
            sizes=[int(s) for s in data["sizes"]],
            scores=arr(data.get("scores")),
            order=None if data.get("order") is None else [int(i) for i in data["order"]],
            order_losses=None if losses is None else [float(v) for v in losses],
            distances=arr(data.get("distances")),
            sets=None if sets is None else {int(m): [int(i) for i in s] for m, s in sets.items()},
            keep=tuple(int(i) for i in data.get("keep", ())),
            passes=dict(data.get("passes", {})),
            wall_time=float(data.get("wall_time", 0.0)),
            info=dict(data.get("info", {})),
        )
