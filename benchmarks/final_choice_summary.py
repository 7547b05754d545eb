"""One table over ``benchmarks.final_choice`` results: the default route against every method beside it, and the
issue's checks at each point.

For each (granularity, M, seed) row of each result file given: the route that refines and races (``refined``, the
default when the file's race budget is the pipeline's 96 windows) with its FPE as a fraction of EvoPress's, its test
PPL ratio (paired bootstrap 95 % interval over the test windows) against EvoPress, SLEB, BlockPruner (sublayer
points), one-at-a-time, the search grid's ``singles`` (one-at-a-time's 10 lowest sets validated, the default before
refine) and the validated route on every test domain, and the checks:

* **≤ EvoPress**: on every domain the ratio is at most 1 or its interval holds 1, at no more than half of EvoPress's
  FPE, everything charged;
* **beats SLEB / BlockPruner / one-at-a-time / singles**: on every domain the whole interval is below 1.

A check whose method was not measured at the point is ``–``. Nothing is computed anew; the figures are the files'.

    .venv/bin/python -m benchmarks.final_choice_summary benchmarks/results/final_choice/*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks import harness as C

ROUTE = "refined"  # refine + the race: the default route (its race budget is the file's "select")
BEATS = ("sleb", "blockpruner", "one-at-a-time", "singles")  # the methods the route must beat on every domain
AGAINST = ("evopress", *BEATS, "validated")


def interval(r: list[float]) -> str:
    return f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]"


def ratio(row: dict[str, Any], domain: str, base: str) -> list[float] | None:
    key = f"{ROUTE}/{base}"
    return row["test"][domain]["ratio"].get(key)


def checks(row: dict[str, Any]) -> dict[str, str]:
    """The issue's checks at one point: "yes", "no" or "–" (the method was not measured here)."""
    domains = list(row["test"])
    out = {}
    ev = [ratio(row, d, "evopress") for d in domains]
    if all(r is not None for r in ev):
        cheap = row["fpe"][ROUTE] <= 0.5 * row["fpe"]["evopress"]
        level = all(r[0] <= 1 or r[1] <= 1 <= r[2] for r in ev)
        out["≤ EvoPress at ≤ 50 % FPE"] = "yes" if cheap and level else "no"
    else:
        out["≤ EvoPress at ≤ 50 % FPE"] = "–"
    for base in BEATS:
        rs = [ratio(row, d, base) for d in domains]
        out[f"beats {base}"] = "–" if None in rs else ("yes" if all(r[2] < 1 for r in rs) else "no")
    return out


def renamed(row: dict[str, Any]) -> dict[str, Any]:
    """A row of the first result files, where the validated route was named ``default``, in today's names."""
    name = lambda k: "validated" if k == "default" else k  # noqa: E731
    key = lambda k: "/".join(map(name, k.split("/")))  # noqa: E731
    row = {
        **row,
        "sets": {name(k): v for k, v in row["sets"].items()},
        "fpe": {name(k): v for k, v in row["fpe"].items()},
    }
    row["test"] = {d: {**t, "ratio": {key(k): v for k, v in t["ratio"].items()}} for d, t in row["test"].items()}
    return row


def rows_of(paths: list[str]) -> list[dict[str, Any]]:
    """Every row with the route, labelled with its file's race budget and model (the default model's first)."""
    rows = []
    for path in paths:
        result = json.loads(Path(path).read_text())
        for row in map(renamed, result["rows"]):
            if ROUTE in row["sets"]:
                rows.append({**row, "select": result.get("select"), "model": C.model_of(result)})
    rows.sort(
        key=lambda r: (C.model_tag(r["model"]), r.get("granularity", "layer"), r["remove"], r["seed"], r["select"] or 0)
    )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    domains = sorted({d for r in rows for d in r["test"]}, key=lambda d: (d != "austen", d))
    head = ["point", "race", "FPE", "÷ EvoPress FPE"]
    head += [f"÷ {b}, {d}" for b in AGAINST for d in domains]
    body, verdicts = [], []
    for r in rows:
        where = f"M = {r['remove']}" + (" sublayer" if r.get("granularity") == "sublayer" else "") + f", s{r['seed']}"
        where = f"{tag}, {where}" if (tag := C.model_tag(r["model"])) else where
        evo = r["fpe"].get("evopress")
        line = [where, str(r["select"]), f"{r['fpe'][ROUTE]:.0f}", f"{r['fpe'][ROUTE] / evo:.2f}" if evo else "–"]
        for b in AGAINST:
            for d in domains:
                x = ratio(r, d, b) if d in r["test"] else None
                line.append(interval(x) if x is not None else "–")
        body.append(line)
        verdicts.append([where, str(r["select"]), *checks(r).values()])
    check_head = ["point", "race", *checks(rows[0]).keys()] if rows else ["point"]
    return (
        "# The default route (refine + race) against the methods beside it\n\n"
        "Ratio: the route's test PPL over the method's, paired bootstrap 95 % interval over the test windows (below 1:"
        " the route is better). FPE: everything charged, forward passes over one window.\n\n"
        + C.md_table(head, body)
        + "\n\n"
        + C.md_table(check_head, verdicts)
        + "\n"
    )


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="final_choice.json files (benchmarks/results/final_choice/*.json)")
    p.add_argument("--out", help="also write the table to this Markdown file")
    args = p.parse_args(argv)
    text = markdown(rows_of(args.files))
    if args.out:
        Path(args.out).write_text(text)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
