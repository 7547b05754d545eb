"""RankedStates: distinct feasible removal states sorted by exactly recomputed energy."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np

from cbo.errors import CorruptFileError, SolverError
from cbo.jsonable import jsonable

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
        solver: str,
        exact: bool,
        wall_time: float = 0.0,
        options: Mapping[str, Any] | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> RankedStates:
        """Keep feasible candidates, drop duplicates, recompute energies, sort, take the best k.

        Ties in energy are ordered by the removed-block indices so results are deterministic.
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
        return cls(
            X,
            E,
            names=qubo.names,
            remove=remove,
            solver=solver,
            exact=exact,
            wall_time=wall_time,
            options=options,
            info=info,
        )

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
        return {
            "format": STATES_FORMAT,
            "names": list(self.names),
            "remove": self.remove,
            "solver": self.solver,
            "exact": self.exact,
            "wall_time": self.wall_time,
            "options": jsonable(self.options),
            "info": jsonable(self.info),
            "removed": [list(s.removed) for s in self],
            "energies": [float(e) for e in self.energies],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankedStates:
        if data.get("format") != STATES_FORMAT:
            raise CorruptFileError(f"not a RankedStates JSON (format={data.get('format')!r}).")
        n = len(data["names"])
        X = np.zeros((len(data["removed"]), n), dtype=np.uint8)
        for r, rem in enumerate(data["removed"]):
            X[r, rem] = 1
        return cls(
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

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> RankedStates:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CorruptFileError(f"cannot read ranked states from {str(path)!r}: {exc}") from exc
        return cls.from_json(data)
