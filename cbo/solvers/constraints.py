"""Per-kind caps and the parameter budget restated over the free blocks of a :class:`Problem`.

Solvers work on the free blocks (not kept, not forced); the caps and the budget they must respect are
those of the QUBO net of the forced blocks. The swap heuristics, CP-SAT, QAOA's penalty form and the
exact enumerator all read them from :class:`FreeConstraints`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cbo.solvers.base import Problem

#: An unreachable cap or parameter bound (fits int64 arithmetic without overflow).
UNBOUNDED = np.int64(2**62)


@dataclass
class FreeConstraints:
    """Caps and budget over the free blocks.

    ``kind[i]`` is the cap group of free block i (blocks of uncapped kinds share a group with an
    unreachable cap), ``cap[k]`` how many more of group k may be removed once the forced blocks
    are counted, ``size[i]`` the parameter count, and ``[pmin, pmax]`` the range the free blocks'
    removed parameters must fall in.
    """

    kind: np.ndarray
    cap: np.ndarray
    size: np.ndarray
    pmin: int
    pmax: int

    @classmethod
    def from_problem(cls, problem: Problem) -> FreeConstraints:
        q = problem.qubo
        c = q.constraints
        groups = sorted(c.caps)
        gid = {k: i for i, k in enumerate(groups)}
        kind = np.array([gid.get(q.kinds[i], len(groups)) for i in problem.free], dtype=np.int64)
        cap = np.full(len(groups) + 1, UNBOUNDED, dtype=np.int64)
        for kname, g in gid.items():
            forced = sum(1 for i in c.force if q.kinds[i] == kname)
            cap[g] = int(c.caps[kname]) - forced
        size = q.sizes[problem.free].astype(np.int64)
        forced_params = int(q.sizes[problem.forced].sum()) if len(problem.forced) else 0
        pmin = -UNBOUNDED if c.min_removed_params is None else int(c.min_removed_params) - forced_params
        pmax = UNBOUNDED if c.max_removed_params is None else int(c.max_removed_params) - forced_params
        return cls(kind, cap, size, int(pmin), int(pmax))

    @property
    def active(self) -> bool:
        return bool((self.cap < UNBOUNDED).any()) or self.pmin > -UNBOUNDED or self.pmax < UNBOUNDED

    @property
    def has_max_params(self) -> bool:
        return self.pmax < UNBOUNDED

    @property
    def has_min_params(self) -> bool:
        return self.pmin > -UNBOUNDED

    def ok(self, Y: np.ndarray) -> np.ndarray:
        """Which rows of (B, n_free) sub-states satisfy the caps and the budget."""
        Y = np.atleast_2d(np.asarray(Y, dtype=np.int64))
        good = np.ones(Y.shape[0], dtype=bool)
        for g in range(len(self.cap)):
            if self.cap[g] < UNBOUNDED:
                good &= Y[:, self.kind == g].sum(1) <= self.cap[g]
        p = Y @ self.size
        return good & (p >= self.pmin) & (p <= self.pmax)
