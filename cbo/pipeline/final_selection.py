"""``prune_depth(select=N)``: the validated candidates raced on up to N fresh windows before the choice.

The validated states (the default's, or refine's measured sets) enter the race of :mod:`cbo.search.selection`
as finalists, the best ``options.finalists`` of them by the criterion on the validation windows. In a large space
(:func:`cbo.search.budget.large_space`, with the default refine) the finalists are refine's best sets by
calibration KL instead, raced before any validation: the validation windows then measure the chosen set alone,
for the report. Fresh windows are the unused windows of the validation documents
(:func:`cbo.data.pool.fresh_windows`); the race's cost is charged to the method (``report.work["selection"]``), and
every finalist's interval is reported in ``report.selection``, ``report.states.info["selection"]`` and the CLI's
selection table.

Example:
    >>> report = prune_depth("smollm2-135m", remove=8, select=480)     # doctest: +SKIP
    >>> report.selection["stopped"], report.selection["finalists"][1]   # doctest: +SKIP
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from cbo.errors import DataError, InvalidOptionError
from cbo.pipeline.options import AUTO, DEFAULT_SELECT
from cbo.search.selection import Selection, SelectionOptions, check_budget


def check_select(select: Any, options: Any, method: str, validate: int) -> tuple[int | None, SelectionOptions]:
    """The selection budget and options checked before any work (None: no selection; ``"auto"``, the default:
    ``DEFAULT_SELECT`` windows for method ``cbo`` with at least two validated states, else none)."""
    if options is not None and not isinstance(options, SelectionOptions):
        if not isinstance(options, dict):
            raise InvalidOptionError(
                f"select_options must be a SelectionOptions or a dict of its fields, got {type(options).__name__}."
            )
        options = SelectionOptions(**options)
    options = options or SelectionOptions()
    if select == AUTO:  # the default: race CBO's validated states when there are two
        if method != "cbo" or validate < 2:
            return None, options
        select = DEFAULT_SELECT
    if select is None:
        return None, options
    budget = check_budget(select)
    if method != "cbo":
        raise InvalidOptionError(f"select races CBO's validated states; method={method!r} has one. Drop select.")
    if validate < 2:
        raise InvalidOptionError(f"select races the validated states: give validate >= 2, got validate={validate}.")
    return budget, options


def no_fresh_windows(tokenizer: Any, splits: Any) -> str | None:
    """Why no fresh window can be cut for the race (None: they can): no tokenizer, or precomputed windows whose
    text is unknown."""
    info = dict(getattr(splits, "info", {}) or {})
    if tokenizer is None:
        return "no tokenizer"
    if "seq_len" not in info or "documents" not in info:
        return "precomputed windows (splits=) whose text is unknown"
    return None


def finalists_of(validated: Sequence[Any], options: SelectionOptions) -> list[Any]:
    """The validated states that enter the race: the best ``options.finalists`` by the criterion on validation
    (perplexity for ``ce``, KL for ``kl``), ties by energy rank."""

    def key(v: Any) -> tuple[float, int]:
        value = v.ppl if options.criterion == "ce" else v.kl
        return (value if math.isfinite(value) else math.inf, v.rank if v.rank is not None else 0)

    return sorted(validated, key=key)[: options.finalists]


def race_sets(
    model: Any,
    tokenizer: Any,
    text: Any,
    splits: Any,
    blocks: Sequence[Any],
    sets: Sequence[Sequence[int]],
    ranks: Sequence[int | None],
    budget: int,
    options: SelectionOptions,
    *,
    seed: int = 0,
    batch_size: int = 8,
    cache_dir: Path | None = None,
    progress: bool = False,
) -> Selection:
    """Race removal ``sets`` (the first is the incumbent; ``ranks``: their energy ranks) on fresh windows of the
    validation (and, by option, calibration) documents: the validated states' :func:`finalists_of`, or refine's best
    sets in a large space.

    Raises:
        DataError: no tokenizer, or splits whose text is unknown (precomputed windows): no fresh windows can be cut.
    """
    from cbo.data.pool import fresh_windows
    from cbo.measure.cache import MeasureCache
    from cbo.search.selection import PoolSource, race

    why = no_fresh_windows(tokenizer, splits)
    if why is not None:
        raise DataError(
            f"select draws fresh windows from the validation text and cannot here ({why}): give tokenizer= and "
            "text=, not precomputed windows, or drop select."
        )
    pool = fresh_windows(
        tokenizer, text, dict(getattr(splits, "info", {}) or {}), splits=options.text.split("+"),
        used=[splits.calibration, splits.validation, splits.test], seed=seed,
    )  # fmt: skip
    cache = MeasureCache(cache_dir, model, blocks) if cache_dir is not None else None
    source = PoolSource(
        model, blocks, pool, criterion=options.criterion, batch_size=batch_size, cache=cache, progress=progress
    )
    return race(sets, source, budget, options, ranks=list(ranks))


def selection_work(selection: Selection) -> dict[str, Any]:
    """What the race cost, for ``report.work["selection"]``."""
    return {
        "fpe": round(selection.fpe, 4),
        "budget_windows": selection.budget,
        "windows": selection.windows,
        "tokens": selection.tokens,
        "rounds": len(selection.rounds),
        "stopped": selection.stopped,
    }


def selection_table(selection: dict[str, Any]) -> Any:
    """A rich table of the race: every finalist's mean loss and paired interval against the chosen set."""
    from rich.table import Table

    ce = selection["criterion"] == "ce"
    title = (
        f"final selection by {'perplexity' if ce else 'KL to the original'} on {selection['windows']} fresh windows "
        f"({selection['fpe']:.0f} FPE): {selection['stopped']}"
    )
    table = Table(title=title)
    for col, just in (
        ("rank", "right"),
        ("removed blocks", "left"),
        ("windows", "right"),
        ("mean " + ("CE" if ce else "KL"), "right"),
        ("PPL ratio" if ce else "Δ KL", "right"),
        (f"{selection['level']:.1%} interval", "left"),
        ("", "left"),
    ):
        table.add_column(col, justify=just)
    for f in selection["finalists"]:
        chosen = f["status"] == "chosen"
        if ce:
            value, low, high = f.get("ratio"), f.get("ratio_low"), f.get("ratio_high")
        else:
            value, low, high = f["diff"], f["low"], f["high"]
        status = {"chosen": "[bold green]◀ chosen[/]", "tied": "tied"}.get(
            f["status"], f"dropped (round {f['dropped_round']})"
        )
        table.add_row(
            "–" if f["rank"] is None else str(f["rank"]),
            ",".join(map(str, f["removed"])),
            str(f["windows"]),
            f"{f['mean']:.4f}",
            "–" if chosen else f"{value:.4f}",
            "–" if chosen else f"{low:.4f} – {high:.4f}",
            status,
            style="bold" if chosen else None,
        )
    return table


__all__ = [
    "check_select",
    "finalists_of",
    "no_fresh_windows",
    "race_sets",
    "selection_table",
    "selection_work",
]
