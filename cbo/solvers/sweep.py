"""Solver sweeps: a grid of solver × M × seed × instance, locally or on Ray, resumable, one results table.

Every cell of the grid is one ``cbo.solve`` call. A finished cell is appended to a JSONL file at
once (one line, flushed and fsynced), keyed by a hash of everything that determines its result
(instance contents, M, solver, seed, k, time limit, options); a restarted sweep reads the file and
runs only the cells whose key is missing. A cell that raised a CBOError is finished too (its row
says ``status = error``); ``retry_failed=True`` runs those again.

For each (instance, M) the sweep adds a *reference* cell: the exact enumerator under a time limit.
When it finishes, its top-10 is the exact reference; when it does not, the reference is the best
known: the 10 lowest-energy distinct states found by any cell of that (instance, M). The table has
one row per run cell with the columns in :data:`COLUMNS`, computed by :func:`solver_row`, which the
solver benchmark uses too.

Instances are QUBO files (``BlockQUBO.save``) or synthetic specs ``synthetic:N:SEED`` (and
``synthetic:N:SEED:heavy`` for expensive first/last blocks), see :func:`load_instance`.

Example:
    >>> cells = make_grid(["synthetic:30:1"], ["swap-sa", "sa"], removes=[8], seeds=[0, 1])  # doctest: +SKIP
    >>> records = run_sweep(cells, "sweep.jsonl")                                           # doctest: +SKIP
    >>> write_table(results_table(records), "sweep.csv")                                    # doctest: +SKIP
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from cbo.checks import check_int
from cbo.errors import CBOError, DataError, InvalidQUBOError
from cbo.progress import progress_bar
from cbo.qubo.block_qubo import BlockQUBO
from cbo.solvers.base import get, solve
from cbo.solvers.sweep_records import append_record, check_records_file, drop_torn_tail, read_records

#: Columns of the results table (one row per solver run).
COLUMNS = [
    "instance",
    "n",
    "remove",
    "solver",
    "seed",
    "status",
    "wall_time_s",
    "best_energy",
    "reference_energy",
    "reference",
    "gap",
    "rel_gap",
    "top10_recall",
    "feasible_fraction",
    "distinct_states",
    "exact",
    "error",
]

REFERENCE_SOLVER = "enumerate"
RECALL_K = 10


# --------------------------------------------------------------------------------------- instances
def load_instance(spec: str | os.PathLike) -> BlockQUBO:
    """A QUBO from a file path or a synthetic spec ``synthetic:N:SEED`` (``:heavy`` adds heavy ends).

    Example:
        >>> load_instance("synthetic:12:3").n
        12
    """
    text = str(spec)
    if text.startswith("synthetic:"):
        from cbo.qubo.instances import random_block_qubo

        parts = text.split(":")[1:]
        heavy = False
        if parts and parts[-1] == "heavy":
            heavy = True
            parts = parts[:-1]
        try:
            if not 1 <= len(parts) <= 2:
                raise ValueError
            n = int(parts[0])
            seed = int(parts[1]) if len(parts) == 2 else 0
        except ValueError:
            raise InvalidQUBOError(
                f"bad synthetic instance {text!r}; write synthetic:N:SEED or synthetic:N:SEED:heavy, e.g. synthetic:80:1."
            ) from None
        return random_block_qubo(n, seed=seed, heavy_ends=heavy)
    path = Path(text)
    if not path.exists():
        raise DataError(f"instance file {text!r} does not exist; give a QUBO file or synthetic:N:SEED.")
    return BlockQUBO.load(path)


def instance_id(spec: str | os.PathLike) -> str:
    """What identifies an instance's contents: the spec for synthetic ones, a hash of a file's bytes."""
    text = str(spec)
    if text.startswith("synthetic:"):
        return text
    path = Path(text)
    if not path.exists():
        raise DataError(f"instance file {text!r} does not exist; give a QUBO file or synthetic:N:SEED.")
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:32]


# --------------------------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class Cell:
    """One solve of the grid. ``options`` is the solver options as sorted JSON text."""

    instance: str
    remove: int
    solver: str
    seed: int = 0
    k: int = 10
    time_limit: float | None = None
    options: str = "{}"
    role: str = "run"  # "run", or "reference" (the exact enumerator under a time limit)
    instance_id: str = ""

    @property
    def key(self) -> str:
        """Hash of everything that determines the cell's result."""
        fields = dataclasses.asdict(self)
        fields["instance"] = self.instance_id or self.instance
        fields.pop("instance_id")
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]

    def solver_options(self) -> dict[str, Any]:
        return json.loads(self.options)


def make_grid(
    instances: Sequence[str | os.PathLike],
    solvers: Sequence[str],
    removes: Sequence[int],
    seeds: Sequence[int] = (0,),
    *,
    k: int = 10,
    time_limit: float | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    reference: bool = True,
    reference_time_limit: float | None = 300.0,
) -> list[Cell]:
    """The cells of a sweep: every instance × M × solver × seed, plus one reference cell per (instance, M).

    Args:
        instances: QUBO files or ``synthetic:N:SEED`` specs.
        solvers: registered solver names.
        removes: the values of M.
        seeds: seeds of every solver run.
        k: states each run returns.
        time_limit: seconds per run (None: no limit).
        options: per-solver options, ``{"sa": {"num_reads": 200}}``.
        reference: add the exact-enumeration reference cells.
        reference_time_limit: seconds for each reference; when it runs out the reference is the
            best known (the best states of every cell of that instance and M).
    """
    if not instances or not solvers or not removes or not seeds:
        raise CBOError("a sweep needs at least one instance, solver, M and seed.")
    options = dict(options or {})
    for name in solvers:
        get(name)  # fail early on an unknown solver
    unknown = sorted(set(options) - set(solvers))
    if unknown:
        raise CBOError(f"options given for solver(s) {unknown} that are not in the sweep {list(solvers)}.")
    check_int("k", k, 1, error=CBOError)
    cells: list[Cell] = []
    for spec in instances:
        ident = instance_id(spec)
        for m in removes:
            if reference:
                cells.append(
                    Cell(
                        str(spec),
                        int(m),
                        REFERENCE_SOLVER,
                        0,
                        max(k, RECALL_K),
                        reference_time_limit,
                        "{}",
                        "reference",
                        ident,
                    )
                )
            for name in solvers:
                opts = json.dumps(options.get(name, {}), sort_keys=True)
                for seed in seeds:
                    cells.append(Cell(str(spec), int(m), name, int(seed), int(k), time_limit, opts, "run", ident))
    return cells


# --------------------------------------------------------------------------------------- one cell
def run_cell(cell: Cell, qubo: BlockQUBO | None = None) -> dict[str, Any]:
    """Solve one cell (``qubo``: the instance, already loaded); a CBOError becomes a record with ``status = "error"``."""
    record: dict[str, Any] = {"key": cell.key, "cell": dataclasses.asdict(cell), "started": time.time()}
    try:
        q = qubo if qubo is not None else load_instance(cell.instance)
        record["n"] = q.n
        states = solve(
            q,
            cell.remove,
            cell.solver,
            cell.k,
            seed=cell.seed,
            time_limit=cell.time_limit,
            **cell.solver_options(),
        )
    except CBOError as exc:
        record.update(status="error", error=f"{type(exc).__name__}: {exc}")
        return record
    info = states.info
    if info.get("interrupted"):
        # Ctrl-C stopped the solver: the cell is not finished (a rerun solves it again), and the sweep stops
        raise KeyboardInterrupt(f"interrupted while solving {cell.solver} on {cell.instance}, M={cell.remove}")
    record.update(
        status="ok",
        error="",
        wall_time_s=float(states.wall_time),
        energies=[float(e) for e in states.energies],
        states=[[int(i) for i in np.flatnonzero(x)] for x in states.states],
        exact=bool(states.exact),
        feasible_fraction=_feasible_fraction(info, states.exact),
        distinct_states=len(states),
    )
    return record


def _feasible_fraction(info: dict[str, Any], exact: bool) -> float | None:
    if info.get("feasible_fraction") is not None:
        return float(info["feasible_fraction"])
    cand, feas = info.get("candidates"), info.get("feasible_candidates")
    if cand:
        return float(feas) / float(cand)
    return 1.0 if exact else None


# --------------------------------------------------------------------------------------- results
def solver_row(
    energies: Sequence[float],
    reference_energies: Sequence[float],
    *,
    reference: str,
    wall_time_s: float | None = None,
    feasible_fraction: float | None = None,
    exact: bool | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """One results-table row: how a solver's ranked energies compare with a reference top-10.

    Args:
        energies: the solver's distinct feasible states' energies, ascending (``RankedStates.energies``).
        reference_energies: the reference's lowest energies, ascending (exact top-10, or best known).
        reference: ``"exact"`` or ``"best-known"``.
        wall_time_s / feasible_fraction / exact: copied into the row.
        **fields: more columns (instance, n, remove, solver, seed, ...).

    Returns:
        A dict with every column of :data:`COLUMNS`: ``gap`` = best − reference ground energy,
        ``rel_gap`` = gap / |reference|, ``top10_recall`` = the share of the reference top-10 that
        the solver matched (a state with energy at or below the reference's 10th counts; ties safe),
        ``distinct_states`` = how many states it returned.
    """
    E = np.sort(np.asarray(energies, dtype=np.float64))
    R = np.sort(np.asarray(reference_energies, dtype=np.float64))[:RECALL_K]
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(status="ok", error="")
    row.update(fields)
    row.update(
        wall_time_s=wall_time_s,
        feasible_fraction=feasible_fraction,
        exact=exact,
        distinct_states=int(len(E)),
        reference=reference,
    )
    if len(E):
        row["best_energy"] = float(E[0])
    if len(R):
        ref = float(R[0])
        row["reference_energy"] = ref
        if len(E):
            gap = float(E[0]) - ref
            row["gap"] = gap
            row["rel_gap"] = gap / abs(ref) if ref != 0 else (0.0 if gap == 0 else math.inf)
            tol = 1e-9 * max(1.0, abs(float(R[-1])))
            row["top10_recall"] = min(int(np.sum(E <= R[-1] + tol)), len(R)) / len(R)
        else:
            row["top10_recall"] = 0.0
    return row


def results_table(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run cell (the columns of :data:`COLUMNS`), against the exact or best-known reference."""
    records = list(records)
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rec in records:
        c = rec["cell"]
        groups.setdefault((c["instance_id"] or c["instance"], c["remove"]), []).append(rec)
    rows = []
    for recs in groups.values():
        refs = [r for r in recs if r["cell"]["role"] == "reference" and r["status"] == "ok"]
        exact_ref = next((r for r in refs if r["exact"]), None)
        if exact_ref is not None:
            ref_energies, ref_kind = exact_ref["energies"][:RECALL_K], "exact"
        else:
            # best known: the lowest distinct states any cell found
            seen: dict[tuple[int, ...], float] = {}
            for r in recs:
                if r["status"] == "ok":
                    for e, s in zip(r["energies"], r["states"]):
                        seen[tuple(s)] = min(float(e), seen.get(tuple(s), math.inf))
            ref_energies, ref_kind = sorted(seen.values())[:RECALL_K], "best-known"
        for r in recs:
            c = r["cell"]
            if c["role"] != "run":
                continue
            base = {
                "instance": c["instance"],
                "n": r.get("n"),
                "remove": c["remove"],
                "solver": c["solver"],
                "seed": c["seed"],
            }
            if r["status"] != "ok":
                row = {col: None for col in COLUMNS}
                row.update(base, status="error", error=r.get("error", ""))
            else:
                row = solver_row(
                    r["energies"],
                    ref_energies,
                    reference=ref_kind,
                    wall_time_s=r["wall_time_s"],
                    feasible_fraction=r["feasible_fraction"],
                    exact=r["exact"],
                    **base,
                )
            rows.append(row)
    return rows


def write_table(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Write the results table: ``.csv`` (default), ``.jsonl``, or ``.md`` (a Markdown table)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps({c: r.get(c) for c in COLUMNS}) + "\n" for r in rows), encoding="utf-8")
    elif suffix == ".md":
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(_fmt(r.get(c)) for c in COLUMNS) + " |" for r in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        with path.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({c: "" if r.get(c) is None else r.get(c) for c in COLUMNS})
    return path


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


# --------------------------------------------------------------------------------------- the sweep
def run_sweep(
    cells: Sequence[Cell],
    out: str | os.PathLike,
    *,
    backend: str = "local",
    address: str | None = None,
    workers: int | None = None,
    retry_failed: bool = False,
    on_cell: Callable[[dict[str, Any]], Any] | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Run the cells not yet in ``out`` (a JSONL file), appending each record as soon as it finishes.

    Args:
        cells: from :func:`make_grid`.
        out: the JSONL file; created when missing, read to skip finished cells when present.
        backend: ``"local"`` (one cell after another in this process) or ``"ray"`` (one Ray task
            per cell, as many at once as the cluster has CPUs).
        address: Ray cluster address (default ``RAY_ADDRESS``, else a local instance).
        workers: Ray: the most cells running at once (default: the cluster's CPUs).
        retry_failed: run cells again whose record says ``status = error``.
        on_cell: called with each new record after it is written.
        progress: show a progress bar.

    Returns:
        The records of every cell of ``cells`` (old and new), in grid order.
    """
    if backend not in ("local", "ray"):
        raise CBOError(f"unknown sweep backend {backend!r}; valid: 'local', 'ray'.")
    out = Path(out)
    check_records_file(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    drop_torn_tail(out)
    done: dict[str, dict[str, Any]] = {}
    for rec in read_records(out):
        if rec.get("status") == "ok" or not retry_failed:
            done[rec["key"]] = rec
    todo: list[Cell] = []
    seen: set[str] = set()
    for cell in cells:
        if cell.key not in done and cell.key not in seen:
            todo.append(cell)
            seen.add(cell.key)
    bar = progress_bar(progress and bool(todo), total=len(todo), unit="cell", desc="sweep")

    def finish(record: dict[str, Any]) -> None:
        record["finished"] = time.time()
        append_record(out, record)
        done[record["key"]] = record
        bar.update(1)
        if on_cell is not None:
            on_cell(record)

    try:
        if backend == "local":
            for cell in todo:
                finish(run_cell(cell))
        else:
            _run_on_ray(todo, finish, address, workers)
    finally:
        bar.close()
    return [done[c.key] for c in cells if c.key in done]


def _run_cell_remote(cell: Cell, qubo: BlockQUBO | None) -> dict[str, Any]:
    # one CPU per cell: keep numba's thread pool to it
    try:
        import numba

        numba.set_num_threads(1)
    except ImportError:
        pass
    return run_cell(cell, qubo)


def _run_on_ray(todo: list[Cell], finish: Callable[[dict[str, Any]], None], address: str | None, workers: int | None):
    from cbo.solvers.enumerate.ray import cluster_cpus, init_ray, release_workers

    if not todo:
        return
    ray = init_ray(address)
    release_workers()  # kept enumeration workers would hold the CPUs the cells need
    limit = workers or max(1, cluster_cpus(ray))
    remote = ray.remote(num_cpus=1)(_run_cell_remote)
    # QUBO files are read here and shipped through the object store: the nodes need not share a disk
    shipped: dict[str, Any] = {}
    for cell in todo:
        if not cell.instance.startswith("synthetic:") and cell.instance not in shipped:
            try:
                shipped[cell.instance] = ray.put(load_instance(cell.instance))
            except CBOError:
                shipped[cell.instance] = None  # the cell records the error itself
    pending = list(todo)
    running: list[Any] = []
    try:
        while pending or running:
            while pending and len(running) < limit:
                cell = pending.pop(0)
                running.append(remote.remote(cell, shipped.get(cell.instance)))
            ready, running = ray.wait(running, num_returns=1)
            finish(ray.get(ready[0]))
    except BaseException:
        # an interruption keeps every cell that already finished; unfinished ones are cancelled
        if running:
            ready, rest = ray.wait(running, num_returns=len(running), timeout=0)
            for ref in ready:
                try:
                    finish(ray.get(ref))
                except Exception:  # noqa: BLE001 - a second error must not hide the first
                    pass
            for ref in rest:
                ray.cancel(ref, force=True)
        raise
