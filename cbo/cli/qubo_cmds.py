"""`cbo solve`, `cbo qubo info|random` and `cbo solvers`: commands on QUBO files."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.markup import escape
from rich.table import Table

from cbo.cli import app, common
from cbo.cli.common import OVERWRITE_FILES_HELP, claim_outputs, console, err_console, fail, plain
from cbo.cli.tables import print_table
from cbo.errors import CBOError
from cbo.qubo.block_qubo import BlockQUBO
from cbo.qubo.states import RankedStates

qubo_app = typer.Typer(help="Inspect and create QUBO files.", no_args_is_help=True)
app.add_typer(qubo_app, name="qubo")


def states_table(states: RankedStates, extra: Optional[dict[str, list]] = None, title: str = "") -> Table:
    """A rich table of ranked states; ``extra`` adds columns (one value per state). The removed blocks are
    listed in full (wrapped inside their cell, never cut), however many there are."""
    table = Table(title=title or None)
    for col in ("rank", "removed", "energy", "gap", "Hamming"):
        if col == "removed":
            table.add_column(col, justify="left", overflow="fold", ratio=1, min_width=12)
        else:
            table.add_column(col, justify="right", no_wrap=True)
    for name in extra or {}:
        table.add_column(name, justify="right", no_wrap=True)
    for s in states:
        row = [str(s.rank), plain(", ".join(map(str, s.removed))), f"{s.energy:.6g}", f"{s.gap:.4g}", str(s.hamming)]
        for values in (extra or {}).values():
            v = values[s.rank] if s.rank < len(values) else None
            row.append("" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)))
        table.add_row(*row)
    return table


def print_states(states: RankedStates, title: str = "") -> None:
    console.print(states_table(states, title=title))
    flag = "[green]exact (proven top-K)[/]" if states.exact else "[yellow]heuristic (not proven)[/]"
    console.print(f"solver {escape(states.solver)}, {flag}, {states.wall_time:.3f} s")
    if states.info.get("interrupted"):
        console.print("[yellow]interrupted: these are the best states found so far.[/]")
    if states.info.get("timed_out"):
        console.print("[yellow]time limit reached: these are the best states found so far.[/]")


def union_blocks(qubo: BlockQUBO, stored: tuple, given: Optional[str]) -> Optional[list]:
    """The blocks stored in the file plus those given on the command line (None when none are given)."""
    if not given:
        return None
    extra = [qubo.index(b) for b in common.parse_blocks(given)]
    return sorted(set(map(int, stored)) | set(extra))


@app.command()
def solve(
    file: Path = typer.Argument(..., help="QUBO file written by BlockQUBO.save or `cbo hessian`."),
    remove: int = typer.Option(..., "--remove", "-m", help="M, the number of blocks to remove."),
    top: int = typer.Option(10, "--top", "-k", help="How many ranked states to return."),
    solver: str = typer.Option("auto", "--solver", "-s", help="Solver name; see `cbo solvers`."),
    keep: Optional[str] = typer.Option(
        None, help="Blocks never removed, e.g. '0,29' or names; added to the keep list stored in the file."
    ),
    force: Optional[str] = typer.Option(
        None, help="Blocks always removed; added to the force list stored in the file."
    ),
    seed: Optional[int] = typer.Option(None, help="Seed for randomized solvers."),
    time_limit: Optional[float] = typer.Option(None, help="Seconds; best-so-far is returned, marked inexact."),
    option: list[str] = typer.Option([], "--option", "-o", help="Solver option KEY=VALUE (JSON value)."),
    as_json: bool = typer.Option(False, "--json", help="Print the ranked states as JSON."),
    out: Optional[Path] = typer.Option(None, help="Write the ranked states to this JSON file."),
    plot: Optional[Path] = typer.Option(None, help="Write the energy spectrum plot to this PNG."),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_FILES_HELP),
) -> None:
    """Find the lowest-energy ways to remove M blocks.

    Ctrl-C stops the solver: the best states found so far are printed (marked interrupted) and the command
    exits with status 130.
    """
    from cbo.solvers import solve as run_solve

    with contextlib.ExitStack() as held:  # the outputs, held until they are written
        try:
            held.enter_context(claim_outputs((out, plot), inputs=(file,), replace_files=overwrite))
            qubo = BlockQUBO.load(file)
            opts = common.parse_options(option, "--option")
            c = qubo.constraints
            states = run_solve(
                qubo,
                remove,
                solver,
                top,
                seed=seed,
                time_limit=time_limit,
                keep=union_blocks(qubo, c.keep, keep),
                force=union_blocks(qubo, c.force, force),
                progress=not as_json,
                **opts,
            )
        except CBOError as exc:
            fail(exc)
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted before any state was found.[/]")
            raise typer.Exit(130) from None
        if out:
            states.save(out)
        if plot:
            from cbo.plot import plot_spectrum

            plot_spectrum(states, path=plot)
    if as_json:
        typer.echo(json.dumps(states.to_json(), indent=1))
    else:
        print_states(states, title=escape(f"{file.name}: remove {remove} of {qubo.n}"))
    for note in ("k_capped", "fewer_states"):
        if states.info.get(note):
            err_console.print(f"[yellow]note: {escape(states.info[note])}[/]")
    if states.info.get("interrupted"):
        if as_json:
            err_console.print("[yellow]interrupted: these are the best states found so far.[/]")
        raise typer.Exit(130)


# solvers that need a Python object, so that `cbo solve -s NAME` cannot use them
PYTHON_ONLY = {"dimod": " [Python only: cbo.solve(q, M, solver=<a dimod.Sampler>); not usable with `cbo solve -s`]"}


@app.command()
def solvers() -> None:
    """List the solvers, whether each can run here, and why not."""
    from cbo.solvers import available

    rows = (
        (
            name,
            "[green]yes[/]" if a.ok else "[red]no[/]",
            "yes" if a.exact else "no",
            escape((a.description if a.ok else a.reason) + (PYTHON_ONLY.get(name, "") if a.ok else "")),
        )
        for name, a in available().items()
    )
    print_table("CBO solvers", ("name", "usable", "exact", "description / reason"), rows)


@qubo_app.command("info")
def qubo_info(file: Path = typer.Argument(..., help="QUBO file.")) -> None:
    """Show a QUBO file's blocks, constraints and matrix statistics."""
    try:
        q = BlockQUBO.load(file)
    except CBOError as exc:
        fail(exc)
    console.print(plain(repr(q)))
    off = q.H[~np.eye(q.n, dtype=bool)]
    lin = q.linear
    console.print(
        f"linear (single-removal energy) min {lin.min():.4g}  median {np.median(lin):.4g}  max {lin.max():.4g}"
    )
    if off.size:
        console.print(f"couplings: min {off.min():.4g}  max {off.max():.4g}  negative {100 * (off < 0).mean():.1f}%")
    console.print(f"eigenvalues of H: min {np.linalg.eigvalsh(q.H).min():.4g}")
    if q.metadata:
        console.print(plain("metadata: " + json.dumps(q.metadata, sort_keys=True)[:2000]))
    rows = ((str(i), plain(q.names[i]), plain(q.kinds[i]), str(int(q.sizes[i])), f"{lin[i]:.4g}") for i in range(q.n))
    print_table("blocks", ("i", "name", "kind", "params", "linear"), rows)


@qubo_app.command("random")
def qubo_random(
    n: int = typer.Option(..., "--n", help="Number of blocks."),
    seed: int = typer.Option(0, help="Seed; the instance is a pure function of (n, seed)."),
    output: Path = typer.Option(..., "-o", "--output", help="File to write."),
    heavy_ends: bool = typer.Option(False, help="Make the first and last block expensive to remove."),
    rank: Optional[int] = typer.Option(None, help="Rank of the coupling (default n//8)."),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_FILES_HELP),
) -> None:
    """Write a synthetic instance shaped like a block Hessian."""
    from cbo.qubo.instances import random_block_qubo

    try:
        with claim_outputs((output,), replace_files=overwrite):
            q = random_block_qubo(n, seed, rank=rank, heavy_ends=heavy_ends)
            q.save(output)
    except CBOError as exc:
        fail(exc)
    console.print(plain(f"wrote {output} ({q!r})"))
