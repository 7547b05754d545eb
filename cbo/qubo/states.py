"""RankedStates: distinct feasible removal states sorted by exactly recomputed energy."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np

from cbo.checks import is_int
from cbo.errors import CorruptFileError, SolverError
from cbo.jsonable import checksum_mismatch, jsonable, with_checksum

if TYPE_CHECKING:
    from cbo.qubo.block_qubo import BlockQUBO

STATES_FORMAT = "cbo.rankedstates"


@dataclass(frozen=True)
class State:
    """One ranked state: rank 0 is the ground state."""

    rank: int
    removed: tuple[int, ...]
    removed_names: tuple[str, ...]
    energy: float
    gap: float
    hamming: int


class RankedStates:
    """Distinct feasible states, lowest energy first, with where they came from.

    Attributes:
        states: (K, N) uint8 array, ``1`` = block removed.
        energies: (K,) exact energies recomputed from the QUBO.
        names: block names.
        remove: M, the number of removed blocks.
        solver: name of the solver that produced them; ``options`` its settings.
        exact: True when the solver proved these are the true top-K (ties aside).
        wall_time: seconds spent solving.
        info: solver-specific facts (feasible fraction, λ, nodes visited, ...).
    """

    def __init__(
        self,
        states: Any,
        energies: Any,
        *,
        names: Sequence[str],
        remove: int,
        solver: str,
        exact: bool,
        wall_time: float = 0.0,
        options: Mapping[str, Any] | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        self.states = np.asarray(states, dtype=np.uint8).reshape(-1, len(names))
        self.energies = np.asarray(energies, dtype=np.float64).reshape(-1)
        if self.states.shape[0] != self.energies.shape[0]:
            raise SolverError(f"{self.states.shape[0]} states but {self.energies.shape[0]} energies.")
        self.names = tuple(names)
        self.remove = int(remove)
        self.solver = str(solver)
        self.exact = bool(exact)
        self.wall_time = float(wall_time)
        self.options = dict(options or {})
        self.info = dict(info or {})

    @classmethod
    def from_candidates(
        cls,
        qubo: BlockQUBO,
        candidates: Any,
        remove: int,
        k: int,
        *,
        info: Mapping[str, Any] | None = None,
        **record: Any,
    ) -> RankedStates:
        """Keep feasible candidates, drop duplicates, recompute energies, sort, take the best k.

        Ties in energy are ordered by the removed-block indices so results are deterministic.

        Args:
            info: the solver's info; ``candidates`` and ``feasible_candidates`` (counts) are added.
            **record: the rest of the solver's record as :class:`RankedStates` takes it (``solver``, ``exact``,
                ``wall_time``, ``options``).
        """
        X = np.asarray(candidates, dtype=np.uint8).reshape(-1, qubo.n)
        n_in = X.shape[0]
        if n_in:
            X = X[qubo.feasible(X, remove)]
        n_feasible = X.shape[0]
        if n_feasible:
            X = np.unique(X, axis=0)
            E = qubo.energy(X)
            # lexsort: last key is primary; tie-break by the state read as a bit string (block 0 first)
            order = np.lexsort(tuple(-X[:, j].astype(np.int16) for j in range(qubo.n - 1, -1, -1)) + (E,))
            X, E = X[order][:k], E[order][:k]
        else:
            E = np.zeros(0)
        info = dict(info or {})
        info.setdefault("candidates", int(n_in))
        info.setdefault("feasible_candidates", int(n_feasible))
        return cls(X, E, names=qubo.names, remove=remove, info=info, **record)

    # ----------------------------------------------------------------- views
    def __len__(self) -> int:
        return self.states.shape[0]

    def __iter__(self) -> Iterator[State]:
        return (self[i] for i in range(len(self)))

    def __getitem__(self, rank: int) -> State:
        if not -len(self) <= rank < len(self):
            raise IndexError(f"rank {rank} out of range; {len(self)} states.")
        rank = rank % len(self)
        removed = tuple(int(i) for i in np.flatnonzero(self.states[rank]))
        return State(
            rank=rank,
            removed=removed,
            removed_names=tuple(self.names[i] for i in removed),
            energy=float(self.energies[rank]),
            gap=float(self.gaps[rank]),
            hamming=int(self.hamming[rank]),
        )

    @property
    def ground(self) -> State:
        """The lowest-energy state found."""
        if not len(self):
            raise SolverError("no states: the solver found no feasible state.")
        return self[0]

    @property
    def gaps(self) -> np.ndarray:
        """Energy above the ground state."""
        return self.energies - self.energies[0] if len(self) else self.energies.copy()

    @property
    def hamming(self) -> np.ndarray:
        """Number of blocks that differ from the ground state."""
        if not len(self):
            return np.zeros(0, dtype=np.int64)
        return (self.states != self.states[0]).sum(1).astype(np.int64)

    def removed(self, rank: int = 0) -> list[int]:
        """Indices of the blocks removed in the state of this rank."""
        return list(self[rank].removed)

    def removed_names(self, rank: int = 0) -> list[str]:
        return list(self[rank].removed_names)

    # ----------------------------------------------------------------- conversions
    def to_sampleset(self) -> Any:
        """A ``dimod.SampleSet`` (BINARY) labelled by block name, with the info attached."""
        import dimod

        ss = dimod.SampleSet.from_samples(
            (self.states.astype(np.int8), list(self.names)),
            vartype=dimod.BINARY,
            energy=self.energies,
            info={"solver": self.solver, "exact": self.exact, **jsonable(self.info)},
        )
        return ss

    def to_pandas(self) -> Any:
        """A DataFrame, one row per state: rank, removed, energy, gap, hamming."""
        import pandas as pd

        return pd.DataFrame(
            {
                "rank": np.arange(len(self)),
                "removed": [list(s.removed) for s in self],
                "removed_names": [list(s.removed_names) for s in self],
                "energy": self.energies,
                "gap": self.gaps,
                "hamming": self.hamming,
            }
        )

    def __repr__(self) -> str:
        head = (
            f"RankedStates(M={self.remove}, {len(self)} states, solver={self.solver!r}, "
            f"{'exact' if self.exact else 'heuristic'}, {self.wall_time:.3g}s)"
        )
        rows = [head, f"  {'rank':>4}  {'energy':>12}  {'gap':>10}  {'ham':>3}  removed"]
        show = list(range(min(len(self), 10)))
        for r in show:
            s = self[r]
            rows.append(f"  {r:>4}  {s.energy:>12.6g}  {s.gap:>10.4g}  {s.hamming:>3}  {list(s.removed)}")
        if len(self) > len(show):
            rows.append(f"  ... {len(self) - len(show)} more")
        return "\n".join(rows)

    # ----------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        """The states as JSON, with a checksum of the content (:mod:`cbo.jsonable`) that loading compares."""
        return with_checksum(
            {
                "format": STATES_FORMAT,
                "names": list(self.names),
                "remove": self.remove,
                "solver": self.solver,
                "exact": self.exact,
                "wall_time": self.wall_time,
                "options": jsonable(self.options),
                "info": jsonable(self.info),
                "removed": [[int(i) for i in s.removed] for s in self],
                "energies": [float(e) for e in self.energies],
            }
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankedStates:
        if data.get("format") != STATES_FORMAT:
            raise CorruptFileError(f"not a RankedStates JSON (format={data.get('format')!r}).")
        n, remove, removed = len(data["names"]), data["remove"], data["removed"]
        energies = np.asarray(data["energies"], dtype=np.float64).reshape(-1)
        why = edited_states_reason(n, remove, removed, energies)
        if why is not None:
            raise CorruptFileError(f"these ranked states were edited or are damaged: {why}.")
        X = np.zeros((len(removed), n), dtype=np.uint8)
        for r, rem in enumerate(removed):
            X[r, rem] = 1
        states = cls(
            X,
            data["energies"],
            names=data["names"],
            remove=data["remove"],
            solver=data["solver"],
            exact=data["exact"],
            wall_time=data.get("wall_time", 0.0),
            options=data.get("options"),
            info=data.get("info"),
        )
        if checksum_mismatch(data):
            raise CorruptFileError(
                "these ranked states were edited or are damaged after they were saved: their checksum does not match "
                "their content (a removal set, an energy or a flag was changed); solve again to get true states."
            )
        return states

    def save(self, path: str | Path) -> Path:
        """Write the JSON to ``path`` (atomically: a reader sees the old file or the new one)."""
        from cbo.files import atomic_write_text

        return atomic_write_text(Path(path), json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> RankedStates:
        """The states saved at ``path``; CorruptFileError naming the file and the field when it is not readable or
        was edited (energies not finite or not increasing, states repeated, counts other than M, bad indices)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CorruptFileError(f"cannot read ranked states from {str(path)!r}: {exc}") from exc
        if not isinstance(data, dict):
            raise CorruptFileError(f"{str(path)!r} holds a JSON {type(data).__name__}, not ranked states.")
        try:
            return cls.from_json(data)
        except CorruptFileError as exc:
            raise CorruptFileError(f"{str(path)!r}: {exc}") from exc
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CorruptFileError(f"{str(path)!r} is incomplete or edited ranked states: {exc!r}") from exc


def edited_states_reason(n: int, remove: Any, removed: Any, energies: np.ndarray) -> str | None:
    """Why saved ranked states cannot be a solver's output (None when they can)."""
    if not is_int(remove) or not 0 <= remove <= n:
        return f"remove={remove!r} is not a block count in 0..{n}"
    if not isinstance(removed, list) or len(removed) != len(energies):
        return f"'removed' must list one state per energy ({len(energies)})"
    seen = set()
    for r, rem in enumerate(removed):
        ok = isinstance(rem, list) and all(is_int(i) for i in rem)
        if not ok or any(not 0 <= i < n for i in rem):
            return f"state {r} ({str(rem)[:60]}) holds block indices outside 0..{n - 1}"
        if len(set(rem)) != remove:
            return f"state {r} removes {len(set(rem))} distinct blocks {rem}, not remove={remove}"
        if frozenset(rem) in seen:
            return f"state {r} {sorted(rem)} repeats an earlier state"
        seen.add(frozenset(rem))
    if not np.isfinite(energies).all():
        return f"energies {energies[~np.isfinite(energies)][:3].tolist()} are not finite"
    if (np.diff(energies) < 0).any():
        r = int(np.argmax(np.diff(energies) < 0))
        return f"energies are not in increasing order (state {r + 1}: {energies[r + 1]:.6g} < {energies[r]:.6g})"
    return None
