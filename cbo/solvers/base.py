"""The solver interface, the registry and ``solve()``.

A solver is a small class: a name, whether its answers are proven (``exact``), an ``Options``
dataclass of its settings, an ``availability()`` check, and ``run(problem, options)`` that returns
candidate states. ``solve()`` validates the input, reduces the constraints into a :class:`Problem`,
times the run and turns candidates into :class:`RankedStates` with exactly recomputed energies.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np

from cbo.errors import InvalidQUBOError, SolverError, SolverUnavailableError, UnknownSolverError
from cbo.qubo import BlockQUBO
from cbo.states import RankedStates

_REGISTRY: dict[str, type[Solver]] = {}
_ALIASES: dict[str, str] = {}


@dataclass
class Problem:
    """One solve request with constraints reduced for solvers.

    ``free`` are the blocks a solver chooses among (not kept, not forced); ``r`` of them must be
    removed. ``Q`` is the QUBO matrix over the free blocks with the forced blocks folded into its
    diagonal, and ``const`` the energy of the forced blocks alone, so that for a free sub-state y
    ``E(full) = Σ_i Q_ii y_i + Σ_{i<j} Q_ij y_i y_j + const``.
    """

    qubo: BlockQUBO
    remove: int
    k: int
    seed: int
    time_limit: float | None
    progress: bool = False
    start: float = field(default_factory=time.perf_counter)
    free: np.ndarray = field(init=False)
    forced: np.ndarray = field(init=False)
    r: int = field(init=False)
    Q: np.ndarray = field(init=False)
    const: float = field(init=False)

    def __post_init__(self) -> None:
        q = self.qubo
        c = q.constraints
        self.forced = np.array(c.force, dtype=np.int64)
        fixed = set(c.keep) | set(c.force)
        self.free = np.array([i for i in range(q.n) if i not in fixed], dtype=np.int64)
        self.r = self.remove - len(c.force)
        full = q.qubo_matrix()
        Q = full[np.ix_(self.free, self.free)].copy()
        if len(self.forced):
            fold = full[np.ix_(self.free, self.forced)].sum(1)
            Q[np.diag_indices_from(Q)] += fold
            xf = np.zeros(q.n)
            xf[self.forced] = 1
            self.const = float(q.energy(xf))
        else:
            self.const = float(q.offset)
        self.Q = Q

    @property
    def n_free(self) -> int:
        return len(self.free)

    @property
    def has_side_constraints(self) -> bool:
        """Caps or a parameter budget beyond Σx = M, keep and force."""
        return self.qubo.constraints.has_caps_or_budget

    def expand(self, Y: Any) -> np.ndarray:
        """Full (B, N) states from (B, n_free) sub-states over the free blocks."""
        Y = np.atleast_2d(np.asarray(Y, dtype=np.uint8))
        X = np.zeros((Y.shape[0], self.qubo.n), dtype=np.uint8)
        X[:, self.free] = Y
        if len(self.forced):
            X[:, self.forced] = 1
        return X

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def time_left(self) -> float:
        """Seconds left before ``time_limit`` (inf without a limit)."""
        return float("inf") if self.time_limit is None else self.time_limit - self.elapsed()

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


@dataclass
class SolverOutput:
    """What ``Solver.run`` returns: candidate full states and whether they are the proven top-K."""

    candidates: np.ndarray
    exact: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Availability:
    """Whether a solver can run on this machine, and why not."""

    name: str
    ok: bool
    reason: str
    exact: bool
    description: str

    def __bool__(self) -> bool:
        return self.ok


class Solver:
    """Base class of every solver; subclasses register with :func:`register`."""

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    exact: ClassVar[bool] = False
    description: ClassVar[str] = ""
    battery_options: ClassVar[dict] = {}  # options tests/solvers/test_battery.py passes to this solver
    battery_max_n: ClassVar[int] = 16  # largest instance the shared test battery gives this solver

    @dataclass
    class Options:
        pass

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        """(usable, reason); override when the solver needs an extra or hardware."""
        return True, "ok"

    @classmethod
    def make_options(cls, options: dict[str, Any]) -> Any:
        valid = [f.name for f in dataclasses.fields(cls.Options)]
        bad = sorted(set(options) - set(valid))
        if bad:
            raise SolverError(f"solver {cls.name!r} has no option(s) {bad}; valid options: {valid or 'none'}.")
        return cls.Options(**options)

    def run(self, problem: Problem, options: Any) -> SolverOutput:  # pragma: no cover - abstract
        raise NotImplementedError  # abstract


def register(cls: type[Solver]) -> type[Solver]:
    """Class decorator: add a solver (and its aliases) to the registry."""
    if not cls.name:
        raise SolverError(f"{cls.__name__} has no name.")
    _REGISTRY[cls.name] = cls
    for alias in cls.aliases:
        _ALIASES[alias] = cls.name
    return cls


def names() -> list[str]:
    """Registered solver names (aliases excluded)."""
    _load_builtin()
    return sorted(_REGISTRY)


def get(name: str) -> type[Solver]:
    """The solver class registered under ``name`` (or an alias)."""
    _load_builtin()
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        raise UnknownSolverError(
            f"unknown solver {name!r}; registered: {sorted(_REGISTRY)} (aliases: {sorted(_ALIASES)})."
        )
    return _REGISTRY[key]


def available() -> dict[str, Availability]:
    """Every registered solver with whether it is usable here and why not."""
    _load_builtin()
    out = {}
    for name in sorted(_REGISTRY):
        cls = _REGISTRY[name]
        try:
            ok, reason = cls.availability()
        except Exception as exc:  # an availability probe must never break the listing
            ok, reason = False, f"availability check failed: {exc}"
        out[name] = Availability(name, bool(ok), reason, cls.exact, cls.description)
    return out


def _load_builtin() -> None:
    # importing the package registers every built-in solver (extras are imported lazily inside them)
    import cbo.solvers  # noqa: F401


def _is_dimod_sampler(obj: Any) -> bool:
    return hasattr(obj, "sample") and hasattr(obj, "parameters") and not isinstance(obj, (str, Solver))


def solve(
    qubo: BlockQUBO,
    remove: int,
    solver: str | Any = "auto",
    k: int = 10,
    *,
    seed: int | None = None,
    time_limit: float | None = None,
    keep: Any = None,
    force: Any = None,
    progress: bool = False,
    backend: str | Any = "local",
    backend_options: dict[str, Any] | None = None,
    **options: Any,
) -> RankedStates:
    """The ``k`` lowest-energy states that remove exactly ``remove`` blocks.

    Args:
        qubo: the energy and its constraints.
        remove: M, the number of blocks to remove.
        solver: a registered name (see ``cbo.solvers.available()``), or any ``dimod.Sampler``.
        k: how many distinct states to return.
        seed: makes randomized solvers reproducible; drawn and recorded when omitted.
        time_limit: seconds; a solver that stops early marks its result inexact.
        keep / force: override the QUBO's keep/force lists for this call.
        progress: show a progress bar on long runs.
        backend: ``"local"`` (this process) or ``"ray"`` (exact enumeration sharded over Ray workers,
            same result; needs the ``ray`` extra), or a ``cbo.distributed.RayBackend``.
        backend_options: settings of the backend (``RayBackend`` fields: address, workers, ...).
        **options: solver settings (each solver's ``Options`` dataclass lists them).

    Example:
        >>> import numpy as np, cbo
        >>> q = cbo.BlockQUBO(np.diag([3.0, 1.0, 2.0]))
        >>> cbo.solve(q, remove=1, solver="enumerate", k=2).removed(0)
        [1]
    """
    if not isinstance(qubo, BlockQUBO):
        raise InvalidQUBOError(f"solve() needs a BlockQUBO, got {type(qubo).__name__}.")
    if keep is not None or force is not None:
        changes = {}
        if keep is not None:
            changes["keep"] = keep
        if force is not None:
            changes["force"] = force
        qubo = qubo.with_constraints(**changes)
    qubo.check_remove(remove)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise SolverError(f"k must be an integer >= 1, got {k!r}.")
    if time_limit is not None and not (time_limit > 0):
        raise SolverError(f"time_limit must be > 0 seconds or None, got {time_limit!r}.")
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**31))
    if backend is None or backend == "local":
        backend = None
    elif backend != "ray" and type(backend).__name__ != "RayBackend":
        raise SolverError(f"unknown backend {backend!r}; valid: 'local', 'ray' (or a cbo.distributed.RayBackend).")
    elif solver == "auto":
        solver = "enumerate"
    if _is_dimod_sampler(solver):
        options = {"sampler": solver, **options}
        solver = "dimod"
    if isinstance(solver, Solver):
        cls = type(solver)
    elif isinstance(solver, str):
        cls = get(solver)
    else:
        raise UnknownSolverError(
            f"solver must be a name or a dimod.Sampler, got {type(solver).__name__}; see cbo.solvers.available()."
        )
    ok, reason = cls.availability()
    if not ok:
        raise SolverUnavailableError(f"solver {cls.name!r} cannot run here: {reason}")
    opts = cls.make_options(options)
    problem = Problem(qubo, int(remove), int(k), int(seed), time_limit, progress)
    instance = solver if isinstance(solver, Solver) else cls()
    if backend is None:
        out = instance.run(problem, opts)
    else:
        from cbo.distributed import run_on_backend

        out = run_on_backend(backend, backend_options, cls, problem, opts)
    wall = problem.elapsed()
    recorded = {**_options_record(opts), "seed": seed, "time_limit": time_limit, "k": k}
    if backend is not None:
        recorded["backend"] = "ray"
    result = RankedStates.from_candidates(
        qubo,
        out.candidates,
        remove,
        k,
        solver=out.info.pop("solver_name", cls.name),
        exact=out.exact,
        wall_time=wall,
        options=recorded,
        info=out.info,
    )
    if not len(result):
        raise SolverError(
            f"solver {cls.name!r} returned no feasible state for M={remove}"
            + (f" ({out.info['hint']})" if "hint" in out.info else "")
            + "."
        )
    return result


def _options_record(opts: Any) -> dict[str, Any]:
    rec = {}
    for f in dataclasses.fields(opts):
        v = getattr(opts, f.name)
        rec[f.name] = v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
    return rec


def run_interruptible(step: Callable[[], bool], problem: Problem) -> tuple[bool, bool]:
    """Call ``step()`` until it returns True (done), the time limit passes, or Ctrl-C.

    Returns (finished, interrupted). Solvers use it so that long runs keep their best states.
    """
    try:
        while True:
            if step():
                return True, False
            if problem.time_left() <= 0:
                return False, False
    except KeyboardInterrupt:
        return False, True
