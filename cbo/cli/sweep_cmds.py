"""`cbo sweep`: a resumable grid of solver × M × seed × instance, locally or on Ray, as one results table."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from cbo.cli import app
from cbo.cli.common import claim_outputs, console, err_console, fail
from cbo.errors import CBOError


def _ints(values: list[str], what: str) -> list[int]:
    """'4,8' and repeated options -> [4, 8]."""
    out: list[int] = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(int(part))
            except ValueError:
                raise CBOError(f"{what} takes integers such as 4,8; got {part!r}.") from None
    return out


def _names(values: list[str]) -> list[str]:
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def _solver_options(items: list[str]) -> dict[str, dict]:
    """'sa:num_reads=200' -> {'sa': {'num_reads': 200}} (values are JSON when they parse)."""
    out: dict[str, dict] = {}
    for item in items:
        head, sep, value = item.partition("=")
        solver, colon, key = head.partition(":")
        if not (sep and colon and solver and key):
            raise CBOError(f"--option takes SOLVER:KEY=VALUE, e.g. sa:num_reads=200; got {item!r}.")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        out.setdefault(solver.strip(), {})[key.strip()] = parsed
    return out


@app.command()
def sweep(
    instance: list[str] = typer.Option(
        ..., "--instance", "-i", help="QUBO file or synthetic:N:SEED[:heavy]; repeat for several."
    ),
    solver: list[str] = typer.Option(..., "--solver", "-s", help="Solver name(s), repeated or comma-separated."),
    remove: list[str] = typer.Option(..., "--remove", "-m", help="M values, e.g. -m 4,8 or -m 4 -m 8."),
    seeds: list[str] = typer.Option(["0"], "--seeds", help="Seeds of each solver run, e.g. 0,1,2."),
    top: int = typer.Option(10, "--top", "-k", help="States each run returns."),
    time_limit: Optional[float] = typer.Option(None, help="Seconds per run."),
    option: list[str] = typer.Option([], "--option", "-o", help="Solver option SOLVER:KEY=VALUE (JSON value)."),
    reference: bool = typer.Option(True, help="Add the exact enumeration of each instance and M as reference."),
    reference_time_limit: Optional[float] = typer.Option(
        300.0, help="Seconds for each reference; past it the best known states are the reference."
    ),
    out: Path = typer.Option(Path("sweep.jsonl"), "--out", help="JSONL file of finished cells (resumes from it)."),
    table: Optional[Path] = typer.Option(None, help="Results table (.csv, .md or .jsonl); default: OUT with .csv."),
    backend: str = typer.Option("local", help="local (this process) or ray (one Ray task per cell)."),
    address: Optional[str] = typer.Option(None, help="Ray cluster address (default: RAY_ADDRESS, else local)."),
    workers: Optional[int] = typer.Option(None, help="Ray: most cells running at once (default: cluster CPUs)."),
    retry_failed: bool = typer.Option(False, help="Run again the cells that ended in an error."),
    quiet: bool = typer.Option(False, help="No progress bar or summary."),
) -> None:
    """Run solvers over a grid of instances, M and seeds; finished cells are kept, so a rerun resumes (also after
    Ctrl-C, which stops the cell running and exits with status 130)."""
    from cbo.solvers.sweep import check_records_file, make_grid, results_table, run_sweep, write_table

    held = contextlib.ExitStack()  # the record and the table, held until the command ends
    try:
        held.enter_context(
            claim_outputs((out, table or out.with_suffix(".csv")), inputs=tuple(instance), make_parents=True)
        )
        check_records_file(out)
        cells = make_grid(
            instance,
            _names(solver),
            _ints(remove, "--remove"),
            _ints(seeds, "--seeds"),
            k=top,
            time_limit=time_limit,
            options=_solver_options(option),
            reference=reference,
            reference_time_limit=reference_time_limit,
        )
        before = len({c.key for c in cells})
        records = run_sweep(
            cells, out, backend=backend, address=address, workers=workers, retry_failed=retry_failed, progress=not quiet
        )
        rows = results_table(records)
        path = write_table(rows, table or out.with_suffix(".csv"))
    except CBOError as exc:
        fail(exc)
    except KeyboardInterrupt:
        from cbo.solvers.sweep import read_records

        kept = len(read_records(out)) if out.exists() else 0
        err_console.print(
            f"[yellow]interrupted: the {kept} finished cells are kept in {escape(str(out))}; run the same command "
            "again to resume.[/]"
        )
        raise typer.Exit(130) from None
    finally:
        held.close()
    failed = [r for r in rows if r.get("status") != "ok"]
    if quiet:
        _exit_if_all_failed(rows, failed)
        return
    view = Table(title=escape(f"sweep: {before} cells, results in {path}"))
    cols = ("instance", "remove", "solver", "seed", "wall_time_s", "gap", "top10_recall", "distinct_states", "status")
    for col in cols:
        view.add_column(col, justify="left" if col in ("instance", "solver", "status") else "right")
    for r in rows:
        view.add_row(*[_fmt(r.get(c)) for c in cols])
    console.print(view)
    _exit_if_all_failed(rows, failed)


def _exit_if_all_failed(rows: list[dict], failed: list[dict]) -> None:
    """Status 1 when no cell of the grid succeeded (a sweep of errors is not a result)."""
    if rows and len(failed) == len(rows):
        err_console.print(
            f"[red]every one of the {len(rows)} cells failed[/]; the first: {escape(str(failed[0].get('error', '')))}"
        )
        raise typer.Exit(1)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
