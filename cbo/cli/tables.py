"""The plain listings of the commands (solvers, estimators, a QUBO's blocks, width scores) as rich tables."""

from __future__ import annotations

from typing import Iterable, Sequence

from rich.table import Table

from cbo.cli.common import console


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Print a rich table of plain left-aligned ``columns`` (the listings: solvers, estimators, blocks, scores)."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)
