"""BlockQUBO: the energy E(x) = ½xᵀHx − g·x over block-removal states, with its constraints.

``x_i = 1`` means block ``i`` is removed. The number of removed blocks M is chosen at solve time,
so one QUBO serves every M; keep/force lists, per-kind caps and a parameter budget are stored here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from cbo.checks import blocks_where, check_in_range, check_int, is_int
from cbo.errors import CorruptFileError, InfeasibleError, InvalidQUBOError
from cbo.files import archive_checksum, read_archive, write_archive

FILE_FORMAT = "cbo.blockqubo"
FILE_VERSION = 1
_SYMMETRY_RTOL = 1e-9
_MAX_ENERGY = 1e300  # energies are sums of up to N² entries; beyond this float64 arithmetic overflows
ARRAY_KEYS = ("H", "g", "sizes")


@dataclass(frozen=True)
class Constraints:
    """Side constraints on which blocks may be removed (indices into the block list)."""

    keep: tuple[int, ...] = ()
    force: tuple[int, ...] = ()
    caps: Mapping[str, int] = field(default_factory=dict)
    max_removed_params: int | None = None
    min_removed_params: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "keep": list(self.keep),
            "force": list(self.force),
            "caps": dict(self.caps),
            "max_removed_params": self.max_removed_params,
            "min_removed_params": self.min_removed_params,
        }

    @property
    def has_caps_or_budget(self) -> bool:
        return bool(self.caps) or self.max_removed_params is not None or self.min_removed_params is not None


class BlockQUBO:
    """Quadratic energy over N blocks with block metadata and removal constraints.

    ``E(x) = ½ xᵀ H x − g·x + offset``. Since ``x_i² = x_i`` the linear term could be folded into
    the diagonal; both are kept so that H and g keep their meaning (Hessian, gradient).

    Args:
        H: (N, N) symmetric matrix. Asymmetric input is refused unless ``symmetrize=True``.
        g: (N,) linear vector (defaults to zeros).
        names: block names (default ``block0..``).
        kinds: block kinds such as ``"layer"``, ``"attention"``, ``"mlp"`` (default ``"block"``).
        sizes: parameter count of each block (default 1 each).
        keep / force: blocks never / always removed, by index or name.
        caps: ``{kind: max removed of that kind}``.
        max_removed_params / min_removed_params: parameter budget on the removed blocks.
        metadata: JSON-serializable facts about where the QUBO came from.

    Example:
        >>> q = BlockQUBO(np.eye(3), np.zeros(3))
        >>> float(q.energy([1, 0, 1]))
        1.0
    """

    def __init__(
        self,
        H: Any,
        g: Any | None = None,
        *,
        names: Sequence[str] | None = None,
        kinds: Sequence[str] | str | None = None,
        sizes: Sequence[int] | None = None,
        keep: Iterable[int | str] = (),
        force: Iterable[int | str] = (),
        caps: Mapping[str, int] | None = None,
        max_removed_params: int | None = None,
        min_removed_params: int | None = None,
        offset: float = 0.0,
        metadata: Mapping[str, Any] | None = None,
        symmetrize: bool = False,
    ) -> None:
        H = _as_float_matrix(H, "H")
        n = H.shape[0]
        if not np.allclose(H, H.T, rtol=_SYMMETRY_RTOL, atol=_SYMMETRY_RTOL * max(1.0, np.abs(H).max(initial=0))):
            if not symmetrize:
                i, j = np.unravel_index(np.argmax(np.abs(H - H.T)), H.shape)
                raise InvalidQUBOError(
                    f"H is not symmetric: H[{i},{j}]={H[i, j]!r} but H[{j},{i}]={H[j, i]!r}. "
                    "Pass symmetrize=True to use (H + Hᵀ)/2, which gives the same energies."
                )
        H = 0.5 * H + 0.5 * H.T  # halves first: the sum of two large finite entries must not overflow
        if g is None:
            g = np.zeros(n)
        if _holds_complex(g):
            raise InvalidQUBOError("g holds complex numbers; a QUBO's entries must be real (pass g.real).")
        g = np.asarray(g, dtype=np.float64)
        if g.shape != (n,):
            raise InvalidQUBOError(f"g has shape {g.shape}; it must be ({n},) to match H of shape {H.shape}.")
        if not np.all(np.isfinite(g)):
            raise InvalidQUBOError(f"g contains NaN or inf at index {int(np.flatnonzero(~np.isfinite(g))[0])}.")
        if not np.isfinite(offset):
            raise InvalidQUBOError(f"offset must be finite, got {offset!r}.")
        _check_magnitude(H, g)
        self.H: np.ndarray = H
        self.g: np.ndarray = g
        self.offset = float(offset)
        self.names: tuple[str, ...] = _names(names, n)
        self.kinds: tuple[str, ...] = _kinds(kinds, n)
        self.sizes: np.ndarray = _sizes(sizes, n)
        self.metadata: dict[str, Any] = dict(metadata or {})
        try:
            json.dumps(self.metadata)
        except TypeError as exc:
            raise InvalidQUBOError(f"metadata must be JSON-serializable: {exc}") from exc
        self.constraints = self._make_constraints(keep, force, caps, max_removed_params, min_removed_params)
        self.H.setflags(write=False)
        self.g.setflags(write=False)
        self.sizes.setflags(write=False)

    # ----------------------------------------------------------------- construction helpers
    @classmethod
    def from_qubo_matrix(cls, Q: Any, **kwargs: Any) -> BlockQUBO:
        """Build from a plain QUBO matrix with ``E(x) = xᵀQx`` (upper-triangular or full Q)."""
        Q = _as_float_matrix(Q, "Q")
        S = 0.5 * (Q + Q.T)
        return cls(2.0 * S, np.zeros(Q.shape[0]), **kwargs)

    @classmethod
    def from_bqm(cls, bqm: Any, **kwargs: Any) -> BlockQUBO:
        """Build from a binary ``dimod.BinaryQuadraticModel`` (SPIN models are converted)."""
        import dimod

        if bqm.vartype is dimod.SPIN:
            bqm = bqm.change_vartype(dimod.BINARY, inplace=False)
        labels = list(bqm.variables)
        index = {v: i for i, v in enumerate(labels)}
        n = len(labels)
        H = np.zeros((n, n))
        for v, bias in bqm.linear.items():
            H[index[v], index[v]] = 2.0 * bias
        for (u, v), bias in bqm.quadratic.items():
            H[index[u], index[v]] += bias
            H[index[v], index[u]] += bias
        kwargs.setdefault("names", [str(v) for v in labels])
        return cls(H, np.zeros(n), offset=float(bqm.offset), **kwargs)

    def with_constraints(self, **changes: Any) -> BlockQUBO:
        """A copy with some constraints replaced (keep, force, caps, max/min_removed_params)."""
        allowed = {"keep", "force", "caps", "max_removed_params", "min_removed_params"}
        bad = set(changes) - allowed
        if bad:
            raise InvalidQUBOError(f"unknown constraint(s) {sorted(bad)}; valid: {sorted(allowed)}")
        c = self.constraints
        args = {
            "keep": changes.get("keep", c.keep),
            "force": changes.get("force", c.force),
            "caps": changes.get("caps", c.caps),
            "max_removed_params": changes.get("max_removed_params", c.max_removed_params),
            "min_removed_params": changes.get("min_removed_params", c.min_removed_params),
        }
        new = self.copy()
        new.constraints = new._make_constraints(**args)
        return new

    def copy(self) -> BlockQUBO:
        new = object.__new__(BlockQUBO)
        new.__dict__.update(self.__dict__)
        new.metadata = dict(self.metadata)
        new.constraints = replace(self.constraints)
        return new

    # ----------------------------------------------------------------- basic properties
    @property
    def n(self) -> int:
        """Number of blocks (variables)."""
        return self.H.shape[0]

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        c = self.constraints
        extra = []
        if c.keep:
            extra.append(f"keep={[self.names[i] for i in c.keep]}")
        if c.force:
            extra.append(f"force={[self.names[i] for i in c.force]}")
        if c.caps:
            extra.append(f"caps={dict(c.caps)}")
        if c.max_removed_params is not None or c.min_removed_params is not None:
            extra.append(f"removed_params in [{c.min_removed_params}, {c.max_removed_params}]")
        kinds = sorted(set(self.kinds))
        return f"BlockQUBO(n={self.n}, kinds={kinds}" + (", " + ", ".join(extra) if extra else "") + ")"

    def index(self, block: int | str) -> int:
        """Index of a block given by index or name."""
        if is_int(block):
            i = int(block)
            if not 0 <= i < self.n:
                raise InvalidQUBOError(f"block index {i} is out of range; valid: 0..{self.n - 1}.")
            return i
        if isinstance(block, str):
            try:
                return self.names.index(block)
            except ValueError:
                raise InvalidQUBOError(
                    f"no block named {block!r}; names are {list(self.names[:6])}{'...' if self.n > 6 else ''}."
                ) from None
        raise InvalidQUBOError(f"a block is given by index or name, got {block!r} of type {type(block).__name__}.")

    @property
    def linear(self) -> np.ndarray:
        """Per-block energy of removing that block alone: ½H_ii − g_i."""
        return 0.5 * np.diag(self.H) - self.g

    def qubo_matrix(self) -> np.ndarray:
        """Symmetric Q with ``E(x) = Σ_i Q_ii x_i + Σ_{i<j} Q_ij x_i x_j + offset``."""
        Q = np.array(self.H, dtype=np.float64, copy=True)
        np.fill_diagonal(Q, self.linear)
        return Q

    # ----------------------------------------------------------------- energy and feasibility
    def energy(self, X: Any) -> np.ndarray | float:
        """Energy of one state (N,) or a batch (B, N) of 0/1 states; exact float64."""
        X = np.asarray(X)
        single = X.ndim == 1
        X2 = np.atleast_2d(X).astype(np.float64)
        if X2.shape[1] != self.n:
            raise InvalidQUBOError(f"states have {X2.shape[1]} entries; this QUBO has {self.n} blocks.")
        if X2.size and not np.all((X2 == 0) | (X2 == 1)):
            raise InvalidQUBOError("states must contain only 0 and 1.")
        e = 0.5 * np.einsum("bi,ij,bj->b", X2, self.H, X2) - X2 @ self.g + self.offset
        return float(e[0]) if single else e

    def feasible(self, X: Any, remove: int | None = None) -> np.ndarray | bool:
        """Whether states satisfy the constraints (and Σx = remove when given)."""
        X = np.asarray(X)
        single = X.ndim == 1
        X2 = np.atleast_2d(X).astype(np.int64)
        ok = np.ones(X2.shape[0], dtype=bool)
        c = self.constraints
        if remove is not None:
            ok &= X2.sum(1) == remove
        if c.keep:
            ok &= X2[:, list(c.keep)].sum(1) == 0
        if c.force:
            ok &= X2[:, list(c.force)].sum(1) == len(c.force)
        kinds = np.array(self.kinds)
        for kind, cap in c.caps.items():
            ok &= X2[:, kinds == kind].sum(1) <= cap
        removed_params = X2 @ self.sizes
        if c.max_removed_params is not None:
            ok &= removed_params <= c.max_removed_params
        if c.min_removed_params is not None:
            ok &= removed_params >= c.min_removed_params
        return bool(ok[0]) if single else ok

    def check_remove(self, remove: int) -> None:
        """Raise a clear error when no state with Σx = ``remove`` can satisfy the constraints."""
        c = self.constraints
        where = blocks_where("QUBO", self.n, len(c.keep))
        remove = check_in_range("remove", remove, 0, self.n - len(c.keep), where, error=InfeasibleError)
        if remove < len(c.force):
            raise InfeasibleError(
                f"remove={remove} is smaller than the {len(c.force)} forced blocks; use M >= {len(c.force)}."
            )
        kinds = np.array(self.kinds)
        removable = np.ones(self.n, dtype=bool)
        removable[list(c.keep)] = False
        reachable = 0
        for kind in sorted(set(self.kinds)):
            avail = int((removable & (kinds == kind)).sum())
            cap = c.caps.get(kind)
            forced = sum(1 for i in c.force if self.kinds[i] == kind)
            if cap is not None and forced > cap:
                raise InfeasibleError(
                    f"{forced} forced blocks are of kind {kind!r} but its cap is {cap}; raise the cap or force fewer."
                )
            reachable += avail if cap is None else min(avail, cap)
        if remove > reachable:
            raise InfeasibleError(
                f"remove={remove} cannot be met: the caps {dict(c.caps)} and keep-list allow at most {reachable} removals."
            )
        if c.max_removed_params is not None or c.min_removed_params is not None:
            lo, hi = self._removed_params_range(remove)
            if c.max_removed_params is not None and lo > c.max_removed_params:
                raise InfeasibleError(
                    f"removing {remove} blocks removes at least {lo} parameters, above max_removed_params="
                    f"{c.max_removed_params}; raise the budget or remove fewer blocks."
                )
            if c.min_removed_params is not None and hi < c.min_removed_params:
                raise InfeasibleError(
                    f"removing {remove} blocks removes at most {hi} parameters, below min_removed_params="
                    f"{c.min_removed_params}; lower it or remove more blocks."
                )

    def _removed_params_range(self, remove: int) -> tuple[int, int]:
        """Fewest and most parameters any M-subset (respecting keep/force, ignoring caps) removes."""
        c = self.constraints
        forced = int(self.sizes[list(c.force)].sum()) if c.force else 0
        free = [i for i in range(self.n) if i not in set(c.keep) | set(c.force)]
        r = remove - len(c.force)
        s = np.sort(self.sizes[free])
        return forced + int(s[:r].sum()), forced + int(s[::-1][:r].sum())

    # ----------------------------------------------------------------- dimod / qiskit
    def safe_penalty(self) -> float:
        """A λ for ``λ(Σx − M)²`` under which no infeasible state undercuts the best feasible one.

        From an infeasible state with Σx = M ± k, k single flips reach a feasible state; each flip
        changes E by at most Δ = max_i(|Q_ii| + Σ_{j≠i}|Q_ij|) while the penalty falls by ≥ λk.
        Any λ > Δ therefore makes the feasible optimum the global one. The same λ is used for the
        keep/force penalties.
        """
        Q = self.qubo_matrix()
        off = np.abs(Q).sum(1) - np.abs(np.diag(Q))
        delta = float(np.max(np.abs(np.diag(Q)) + off, initial=0.0))
        return 1.01 * delta + 1e-9 if delta > 0 else 1.0

    def to_bqm(self, remove: int, penalty: float | None = None) -> Any:
        """A ``dimod.BinaryQuadraticModel`` of E plus λ(Σx − M)² and keep/force penalties.

        Variables are labelled by block name. Per-kind caps and the parameter budget are not
        encoded (they need slack variables); samples must be filtered with :meth:`feasible`.
        """
        import dimod

        self.check_remove(remove)
        lam = self.safe_penalty() if penalty is None else float(penalty)
        if not np.isfinite(lam) or lam < 0:
            raise InvalidQUBOError(f"penalty must be a finite number >= 0, got {penalty!r}.")
        Q = self.qubo_matrix()
        n = self.n
        # λ(Σx − M)² = λ[Σ_i (1 − 2M) x_i + 2 Σ_{i<j} x_i x_j + M²]
        linear = {self.names[i]: Q[i, i] + lam * (1 - 2 * remove) for i in range(n)}
        for i in self.constraints.keep:
            linear[self.names[i]] += lam
        for i in self.constraints.force:
            linear[self.names[i]] -= lam
        iu, ju = np.triu_indices(n, 1)
        quad = {(self.names[i], self.names[j]): Q[i, j] + 2 * lam for i, j in zip(iu, ju)}
        offset = self.offset + lam * remove * remove + lam * len(self.constraints.force)
        return dimod.BinaryQuadraticModel(linear, quad, offset, dimod.BINARY)

    def to_quadratic_program(self, remove: int, name: str = "cbo") -> Any:
        """A ``qiskit_optimization.QuadraticProgram`` with Σx = M and every constraint native."""
        from cbo.extras import require

        qo = require("qiskit_optimization", "QuadraticProgram export")
        self.check_remove(remove)
        qp = qo.QuadraticProgram(name)
        vars_ = [f"x{i}" for i in range(self.n)]
        for v in vars_:
            qp.binary_var(v)
        Q = self.qubo_matrix()
        quad = {(vars_[i], vars_[j]): float(Q[i, j]) for i, j in zip(*np.triu_indices(self.n, 1)) if Q[i, j] != 0}
        qp.minimize(constant=self.offset, linear={v: float(Q[i, i]) for i, v in enumerate(vars_)}, quadratic=quad)
        qp.linear_constraint({v: 1 for v in vars_}, "==", remove, "remove_M")
        c = self.constraints
        for i in c.keep:
            qp.linear_constraint({vars_[i]: 1}, "==", 0, f"keep_{i}")
        for i in c.force:
            qp.linear_constraint({vars_[i]: 1}, "==", 1, f"force_{i}")
        for kind, cap in c.caps.items():
            members = {vars_[i]: 1 for i in range(self.n) if self.kinds[i] == kind}
            qp.linear_constraint(members, "<=", cap, f"cap_{kind}")
        sizes = {v: int(self.sizes[i]) for i, v in enumerate(vars_)}
        if c.max_removed_params is not None:
            qp.linear_constraint(sizes, "<=", c.max_removed_params, "max_removed_params")
        if c.min_removed_params is not None:
            qp.linear_constraint(sizes, ">=", c.min_removed_params, "min_removed_params")
        return qp

    # ----------------------------------------------------------------- save / load
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "n": self.n,
            "names": list(self.names),
            "kinds": list(self.kinds),
            "offset": self.offset,
            "constraints": self.constraints.to_json(),
            "metadata": self.metadata,
        }

    def save(self, path: str | Path) -> Path:
        """Write one self-describing file: arrays + JSON metadata + SHA-256 checksum (atomically)."""
        return write_archive(Path(path), dict(zip(ARRAY_KEYS, (self.H, self.g, self.sizes))), self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> BlockQUBO:
        """Read a file written by :meth:`save`; truncated, edited, damaged or foreign files are refused.

        Raises:
            CorruptFileError: for every way a file can be unreadable or inconsistent (never a zlib, JSON,
                type or key error).
        """
        path = Path(path)
        if not path.exists():
            raise CorruptFileError(f"no QUBO file at {str(path)!r}.")
        label = repr(str(path))
        meta, arrays = read_archive(path, ARRAY_KEYS)
        fmt, version = meta.get("format"), meta.get("version", 0)
        if fmt != FILE_FORMAT:
            raise CorruptFileError(f"{label} has format {fmt!r}, expected {FILE_FORMAT!r}.")
        if not is_int(version):
            raise CorruptFileError(f"{label} has version {version!r}; a version must be a whole number.")
        if version > FILE_VERSION:
            raise CorruptFileError(
                f"{label} has version {version}, newer than this CBO reads ({FILE_VERSION}); upgrade cbo."
            )
        stored = meta.pop("sha256", None)
        if stored != archive_checksum(arrays, meta):
            raise CorruptFileError(
                f"{label} failed its checksum: the file was edited or damaged after it was saved. "
                "Recompute or re-save the QUBO."
            )
        try:
            c = meta["constraints"]
            return cls(
                arrays["H"],
                arrays["g"],
                names=meta["names"],
                kinds=meta["kinds"],
                sizes=arrays["sizes"],
                keep=c["keep"],
                force=c["force"],
                caps=c["caps"],
                max_removed_params=c["max_removed_params"],
                min_removed_params=c["min_removed_params"],
                offset=meta["offset"],
                metadata=meta["metadata"],
            )
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            # InvalidQUBOError / InfeasibleError are ValueErrors: a file that passes its checksum but does not
            # describe a valid QUBO was written by something other than BlockQUBO.save
            raise CorruptFileError(f"{label} does not describe a valid QUBO ({type(exc).__name__}: {exc}).") from exc

    # ----------------------------------------------------------------- internals
    def _make_constraints(
        self,
        keep: Iterable[int | str],
        force: Iterable[int | str],
        caps: Mapping[str, int] | None,
        max_removed_params: int | None,
        min_removed_params: int | None,
    ) -> Constraints:
        keep_i = tuple(sorted({self.index(b) for b in block_list(keep, "keep")}))
        force_i = tuple(sorted({self.index(b) for b in block_list(force, "force")}))
        both = set(keep_i) & set(force_i)
        if both:
            raise InfeasibleError(
                f"blocks {[self.names[i] for i in sorted(both)]} are both kept and forced; remove them from one list."
            )
        caps = dict(caps or {})
        for kind, cap in caps.items():
            if kind not in self.kinds:
                raise InvalidQUBOError(f"cap given for kind {kind!r}, but the kinds are {sorted(set(self.kinds))}.")
            caps[kind] = check_int(f"cap for kind {kind!r}", cap, 0, error=InvalidQUBOError)
        for label, v in (("max_removed_params", max_removed_params), ("min_removed_params", min_removed_params)):
            check_int(label, v, 0, none_ok=True, error=InvalidQUBOError)
        if (
            max_removed_params is not None
            and min_removed_params is not None
            and min_removed_params > max_removed_params
        ):
            raise InfeasibleError(
                f"min_removed_params={min_removed_params} exceeds max_removed_params={max_removed_params}."
            )
        return Constraints(
            keep_i,
            force_i,
            caps,
            None if max_removed_params is None else int(max_removed_params),
            None if min_removed_params is None else int(min_removed_params),
        )


def _check_magnitude(H: np.ndarray, g: np.ndarray) -> None:
    """Refuse entries so large that an energy (a sum of up to N² terms) overflows float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        bound = 0.5 * float(np.abs(H).sum()) + float(np.abs(g).sum())
    if not np.isfinite(bound) or bound > _MAX_ENERGY:
        raise InvalidQUBOError(
            f"the QUBO's entries are too large (the sum of their magnitudes is {bound:.3g}, above {_MAX_ENERGY:.0e}): "
            "energies would overflow float64. Rescale H and g (the minimizers do not change)."
        )


def block_list(blocks: Any, label: str, *, error: type[Exception] = InvalidQUBOError) -> list[Any]:
    """A keep/force argument as a list: one index or name counts as a list of one; anything else is ``error``
    (the QUBO's own; ``solve()`` raises its SolverError with the same words)."""
    if blocks is None:
        return []
    if isinstance(blocks, str) or is_int(blocks):
        return [blocks]
    try:
        items = list(blocks)
    except TypeError:
        raise error(
            f"{label} must be a block index, a block name or a list of them, got {type(blocks).__name__} {blocks!r}."
        ) from None
    return items


def _holds_complex(M: Any) -> bool:
    """True for a nested list (or another sequence) with a complex entry (np.iscomplexobj sees only arrays)."""
    try:
        return np.asarray(M).dtype.kind == "c"
    except (TypeError, ValueError):
        return False


def _as_float_matrix(M: Any, label: str) -> np.ndarray:
    if np.iscomplexobj(M) or _holds_complex(M):
        raise InvalidQUBOError(f"{label} holds complex numbers; a QUBO's entries must be real (pass {label}.real).")
    try:
        A = np.array(M, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidQUBOError(f"{label} must be a numeric matrix: {exc}") from exc
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise InvalidQUBOError(f"{label} must be a square matrix, got shape {A.shape}.")
    if A.shape[0] == 0:
        raise InvalidQUBOError(f"{label} is empty; a QUBO needs at least one block.")
    bad = ~np.isfinite(A)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise InvalidQUBOError(f"{label} contains {A[i, j]!r} at [{i},{j}]; all entries must be finite.")
    return A


def _names(names: Sequence[str] | None, n: int) -> tuple[str, ...]:
    if names is None:
        return tuple(f"block{i}" for i in range(n))
    names = tuple(str(x) for x in names)
    if len(names) != n:
        raise InvalidQUBOError(f"{len(names)} names given for {n} blocks.")
    if len(set(names)) != n:
        dup = sorted({x for x in names if names.count(x) > 1})
        raise InvalidQUBOError(f"block names must be unique; repeated: {dup}.")
    return names


def _kinds(kinds: Sequence[str] | str | None, n: int) -> tuple[str, ...]:
    if kinds is None:
        return ("block",) * n
    if isinstance(kinds, str):
        return (kinds,) * n
    kinds = tuple(str(k) for k in kinds)
    if len(kinds) != n:
        raise InvalidQUBOError(f"{len(kinds)} kinds given for {n} blocks.")
    return kinds


def _sizes(sizes: Sequence[int] | None, n: int) -> np.ndarray:
    if sizes is None:
        return np.ones(n, dtype=np.int64)
    s = np.asarray(sizes)
    if s.shape != (n,):
        raise InvalidQUBOError(f"sizes has shape {s.shape}; expected ({n},).")
    if not np.issubdtype(s.dtype, np.integer):
        if not np.all(np.isfinite(s)) or not np.all(s == np.round(s)):
            raise InvalidQUBOError("sizes must be whole parameter counts.")
    s = s.astype(np.int64)
    if (s < 0).any():
        raise InvalidQUBOError(f"sizes must be >= 0; block {int(np.flatnonzero(s < 0)[0])} has {int(s.min())}.")
    return s
