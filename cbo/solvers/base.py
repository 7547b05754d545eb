"""The solver interface, the solver registry and ``solve()``.

A solver is a small class: a name, whether its answers are proven (``exact``), an ``Options``
dataclass of its settings (with an optional ``validate()``), the modules it needs (``requires``, checked
by ``availability()``), and ``run(problem, options)`` that returns candidate states. ``solve()`` validates
the input, reduces the constraints into a :class:`Problem`, times the run and turns candidates into
:class:`RankedStates` with exactly recomputed energies.

The registry is a :class:`cbo.registry.Registry`; the built-in solvers are listed by module name and
imported on the first lookup, so this module imports none of them.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from cbo.checks import check_float, check_int, check_seed
from cbo.errors import (
    InvalidQUBOError,
    SolverError,
    SolverOptionError,
    SolverUnavailableError,
    UnknownSolverError,
)
from cbo.extras import has_module, install_command
from cbo.qubo.block_qubo import BlockQUBO, block_list
from cbo.qubo.states import RankedStates
from cbo.registry import Registry
from cbo.solvers.interrupt import stop_on_interrupt


@dataclass
class Problem:
    """One solve request with constraints reduced for solvers.

    ``free`` are the blocks a solver chooses among (not kept, not forced); ``r`` of them must be
    removed. ``Q`` is the QUBO matrix over the free blocks with the forced blocks folded into its
    diagonal, and ``const`` the energy of the forced blocks alone, so that for a free sub-state y
    ``E(full) = Σ_i Q_ii y_i + Σ_{i<j} Q_ij y_i y_j + const``. ``stop`` is set on Ctrl-C (see
    :mod:`cbo.solvers.interrupt`): solvers poll ``interrupted`` or ``time_left()`` and return what they have.
    """

    qubo: BlockQUBO
    remove: int
    k: int
    seed: int
    time_limit: float | None
    progress: bool = False
    start: float = field(default_factory=time.perf_counter)
    stop: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
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

    @property
    def interrupted(self) -> bool:
        """Whether a stop was asked for (Ctrl-C): the solver should return its best states so far."""
        return self.stop.is_set()

    def out_of_time(self) -> bool:
        """Whether the time limit has passed."""
        return self.time_limit is not None and self.elapsed() >= self.time_limit

    def time_left(self) -> float:
        """Seconds left before ``time_limit`` (inf without a limit; 0 once interrupted, so that a solver
        that stops at its time limit also stops on Ctrl-C)."""
        if self.stop.is_set():
            return 0.0
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


class Solver(abc.ABC):
    """Base class of every solver; subclasses register with :func:`register`.

    Class attributes: ``name`` (the registry name), ``aliases``, ``exact`` (answers are the proven
    top-K), ``description`` (one line for ``cbo solvers``), ``requires`` (importable modules the
    solver needs; :mod:`cbo.extras` names the extra that installs each), and ``Options``, a dataclass
    of its settings whose optional ``validate()`` raises :class:`SolverOptionError` on bad values.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    exact: ClassVar[bool] = False
    description: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()

    @dataclass
    class Options:
        pass

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        """(usable, reason): every module of ``requires`` importable; override for hardware checks."""
        missing = [m for m in cls.requires if not has_module(m)]
        if missing:
            return False, f"{', '.join(missing)} not installed; install with: {install_command(missing[0])}"
        return True, "ok"

    @classmethod
    def load(cls) -> None:
        """Import the modules ``run`` needs; ``solve()`` calls it before the time limit's clock starts, so that a
        first import (seconds for qiskit) does not eat the time limit. Default: the modules of ``requires``."""
        for module in cls.requires:
            importlib.import_module(module)

    @classmethod
    def make_options(cls, options: dict[str, Any] | None = None) -> Any:
        """This solver's ``Options`` from a dict, checked (unknown names and bad values raise)."""
        return REGISTRY.make_options(cls, options)

    @abc.abstractmethod
    def run(self, problem: Problem, options: Any) -> SolverOutput:
        """Candidate states for ``problem`` (``solve()`` filters, deduplicates and re-scores them)."""


REGISTRY: Registry[type[Solver]] = Registry(
    "solver",
    error=UnknownSolverError,
    option_error=SolverOptionError,
    builtins=(
        "cbo.solvers.auto",
        "cbo.solvers.cpsat",
        "cbo.solvers.enumerate.solver",
        "cbo.solvers.enumerate.gpu",
        "cbo.solvers.ocean",
        "cbo.solvers.qaoa",
        "cbo.solvers.swap",
    ),
)


def register(cls: type[Solver]) -> type[Solver]:
    """Class decorator: add a solver (and its aliases) to the registry."""
    if not (isinstance(cls, type) and issubclass(cls, Solver)):
        raise SolverError(f"only Solver subclasses can be registered as solvers, got {cls!r}.")
    if not cls.name:
        raise SolverError(f"{cls.__name__} has no name.")
    return REGISTRY.register(cls)


def names() -> list[str]:
    """Registered solver names (aliases excluded)."""
    return REGISTRY.names()


def get(name: str) -> type[Solver]:
    """The solver class registered under ``name`` (or an alias)."""
    return REGISTRY.get(name)


def available() -> dict[str, Availability]:
    """Every registered solver with whether it is usable here and why not."""
    out = {}
    for name, cls in REGISTRY.items():
        try:
            ok, reason = cls.availability()
        except Exception as exc:  # an availability probe must never break the listing
            ok, reason = False, f"availability check failed: {exc}"
        out[name] = Availability(name, bool(ok), reason, cls.exact, cls.description)
    return out


def run_solver(name: str, problem: Problem, **options: Any) -> SolverOutput:
    """Run the registered solver ``name`` on an already reduced problem (solvers that combine others use it)."""
    cls = get(name)
    return cls().run(problem, cls.make_options(options))


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
    **options: Any,
) -> RankedStates:
    """The ``k`` lowest-energy states that remove exactly ``remove`` blocks.

    Ctrl-C (SIGINT) while a solver runs in the main thread makes it stop and return its best states so
    far, with ``info["interrupted"] = True`` and ``exact`` False unless it had already finished; a second
    Ctrl-C raises ``KeyboardInterrupt`` at once (as does the first when nothing was found yet).

    Args:
        qubo: the energy and its constraints.
        remove: M, the number of blocks to remove.
        solver: a registered name (see ``cbo.solvers.available()``), a :class:`Solver` instance, or
            any ``dimod.Sampler``.
        k: how many distinct states to return.
        seed: makes randomized solvers reproducible; drawn and recorded when omitted.
        time_limit: seconds; a solver that stops early marks its result inexact.
        keep / force: replace the QUBO's keep/force lists for this call (a block index or name, or a list
            of them).
        progress: show a progress bar on long runs.
        **options: solver settings (each solver's ``Options`` dataclass lists them). The exact
            enumerator takes ``strategy="lexicographic"`` or ``"relaxation"`` (default: chosen from the
            problem), and (as ``auto``, which passes them on) ``backend="ray"`` (enumeration sharded over
            Ray workers, the same result; the ``ray`` extra) or ``"gpu"``, with ``backend_options``.

    Returns:
        :class:`RankedStates`: the states by increasing energy, with the solver's record (``exact``, ``info``).

    Example:
        >>> import numpy as np, cbo
        >>> q = cbo.BlockQUBO(np.diag([3.0, 1.0, 2.0]))
        >>> cbo.solve(q, remove=1, solver="enumerate", k=2).removed(0)
        [1]
    """
    if not isinstance(qubo, BlockQUBO):
        raise InvalidQUBOError(f"solve() needs a BlockQUBO, got {type(qubo).__name__}.")
    if keep is not None or force is not None:
        # one index or name counts as a list of one (the QUBO's rule, with this call's error type)
        given = {name: v for name, v in (("keep", keep), ("force", force)) if v is not None}
        qubo = qubo.with_constraints(**{name: block_list(v, name, error=SolverError) for name, v in given.items()})
    qubo.check_remove(remove)
    k = check_int("k", k, lo=1, error=SolverOptionError)
    k, k_note = cap_k(qubo, int(remove), k)
    time_limit = check_float("time_limit (seconds)", time_limit, lo=0, lo_open=True, finite=False, none_ok=True,
                             error=SolverOptionError)  # fmt: skip
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**31))
    seed = check_seed("seed", seed, error=SolverOptionError)
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
    cls.load()
    problem = Problem(qubo, int(remove), int(k), int(seed), time_limit, progress)
    instance = solver if isinstance(solver, Solver) else cls()
    with stop_on_interrupt(problem.stop):
        out = instance.run(problem, opts)
    wall = problem.elapsed()
    if problem.interrupted and not out.exact:
        out.info["interrupted"] = True
        if not problem.out_of_time():
            out.info["timed_out"] = False
    recorded = {**_options_record(opts), "seed": seed, "time_limit": time_limit, "k": k}
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
        if problem.interrupted:
            raise KeyboardInterrupt(f"solver {cls.name!r} was interrupted before it found a feasible state")
        raise SolverError(
            f"solver {cls.name!r} returned no feasible state for M={remove}"
            + (f" ({out.info['hint']})" if "hint" in out.info else "")
            + "."
        )
    note_fewer_states(result, qubo, int(remove), k, cls.name)
    if k_note:
        result.info["k_capped"] = k_note
    return result


# bytes per asked-for state that solvers may hold at once: the state (one byte per block) and its energy, in the
# result, a candidate pool of up to twice k and the working copies that sort and deduplicate them
STATE_BYTES_FACTOR = 4


def cap_k(qubo: BlockQUBO, remove: int, k: int) -> tuple[int, str | None]:
    """``(k, note)``: ``k`` capped at the number of removal sets the keep and force lists allow (``note`` says so;
    None when not capped), after checking that this many states fit in memory.

    Raises:
        SolverOptionError: ``k`` states of this QUBO need more memory than this machine has free.
    """
    import math

    from cbo.checks import check_memory

    c = qubo.constraints
    free, r = qubo.n - len(c.keep) - len(c.force), remove - len(c.force)
    exist = math.comb(free, r) if 0 <= r <= free else 0
    note = None
    if 0 < exist < k:
        note = (
            f"k={k} is more than the {exist} ways to remove {remove} of these {qubo.n} blocks (C({free}, {r})"
            f"{' with the keep/force lists' if c.keep or c.force else ''}); returning at most {exist}."
        )
        k = exist
    check_memory(
        f"holding k={k} ranked states of {qubo.n} blocks",
        k * (qubo.n + 8) * STATE_BYTES_FACTOR,
        error=SolverOptionError,
        hint="Ask for fewer states (--top / k=).",
    )
    return k, note


def note_fewer_states(result: RankedStates, qubo: BlockQUBO, remove: int, k: int, name: str) -> None:
    """``info["fewer_states"]``: why fewer than the ``k`` states asked for came back, where more exist."""
    import math

    c = qubo.constraints
    exist = math.comb(qubo.n - len(c.keep) - len(c.force), remove - len(c.force))
    if len(result) >= min(k, exist):
        return
    if result.exact:
        why = "the constraints admit no more"  # an exact solver lists every feasible state up to k
    elif c.caps or c.max_removed_params is not None or c.min_removed_params is not None:
        why = "its samples found no more; the caps or the parameter budget may admit no more"
    else:
        why = "its samples converged on fewer distinct states"
    result.info["fewer_states"] = (
        f"{name} returned {len(result)} distinct feasible states of the {k} asked for ({why}); ask it for more "
        "samples (-o num_reads=...) or use a solver that lists k states (enumerate, swap-sa)."
    )


def _options_record(opts: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    if opts is None:
        return rec
    for f in dataclasses.fields(opts):
        v = getattr(opts, f.name)
        rec[f.name] = v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
    return rec
