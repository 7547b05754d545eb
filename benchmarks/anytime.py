"""Anytime curves side by side: methods of one search-grid point run in different sessions, on one axis.

Each ``--point`` is a ``point.json`` of ``benchmarks.search`` (its ``evaluations``: every incumbent's calibration
KL on the whole pool against the FPE charged, and the final set's per-window test NLL). The points must be the same
grid point (the same calibration pool and test windows: their spec and unpruned test PPL are checked). The table
gives each method's incumbent KL at FPE checkpoints (the last incumbent at or below that cost; "–" before its
first), whether the first method is at or below every other there, and the final sets' test PPL ratio with a
paired bootstrap 95 % interval over the test windows; the plot draws every curve.

    .venv/bin/python -m benchmarks.anytime \\
        --point benchmarks/results/search/full/sublayer-8-s0.point.json --point OUT/sublayer-8-s0/point.json \\
        --rename refine="default (scaled budget)" --out benchmarks/results/search/anytime-sublayer-8-s0
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks import harness as C

CHECKPOINTS = (250, 500, 750, 1000, 1500, 2000, 2500, 3000, 3500)


def parse(argv: list[str] | None) -> Any:
    p = C.parser(__doc__.splitlines()[0], out="anytime", threads=False)
    p.add_argument("--point", action="append", required=True, help="a point.json of benchmarks.search (repeat)")
    p.add_argument("--rename", action="append", default=[], help="METHOD=LABEL for the table and plot (repeat)")
    p.add_argument("--first", default=None, help="the method compared with every other (default: the last point's)")
    return p.parse_args(argv)


def merge(entries: list[dict[str, Any]], rename: dict[str, str]) -> dict[str, Any]:
    """One entry with every point's evaluations (a later point's method replaces an earlier one of the same name);
    refuses points of another spec or other test windows."""
    spec, ppl = entries[0]["spec"], entries[0].get("original_test_ppl")
    evaluations: dict[str, Any] = {}
    for entry in entries:
        if entry["spec"] != spec:
            raise SystemExit(f"points of different specs: {entry['spec']} and {spec}")
        if ppl is not None and entry.get("original_test_ppl") is not None:
            if not math.isclose(entry["original_test_ppl"], ppl, rel_tol=1e-6):
                raise SystemExit("points with other test windows (their unpruned test PPL differs)")
        evaluations.update({rename.get(m, m): e for m, e in entry["evaluations"].items()})
    return {"spec": spec, "original_test_ppl": ppl, "evaluations": evaluations}


def incumbent(curve: list[dict[str, Any]], fpe: float) -> float | None:
    """The calibration KL of the last incumbent at or below ``fpe`` FPE (None before the first)."""
    before = [c["calibration_kl"] for c in curve if c["fpe"] <= fpe]
    return before[-1] if before else None


def table(entry: dict[str, Any], first: str) -> dict[str, Any]:
    from cbo.stats import paired_ppl_ratio

    evals = entry["evaluations"]
    end = max(e["fpe"] for e in evals.values())
    checkpoints = [x for x in CHECKPOINTS if x < end] + [end]
    rows = []
    for x in checkpoints:
        kl = {m: incumbent(e["curve"], x) for m, e in evals.items()}
        others = [v for m, v in kl.items() if m != first and v is not None]
        ahead = None if kl[first] is None or not others else all(kl[first] <= v + 1e-12 for v in others)
        rows.append({"fpe": x, "kl": kl, "first_at_or_below": ahead})
    finals = {
        m: {"fpe": e["fpe"], "calibration_kl": e["calibration_kl"], "test_ppl": e["test_ppl"]} for m, e in evals.items()
    }
    ratios = {
        f"{first}/{m}": list(paired_ppl_ratio(evals[first]["test_nll"], e["test_nll"]))
        for m, e in evals.items()
        if m != first
    }
    return {"checkpoints": rows, "finals": finals, "ratios": ratios}


def run(job: C.Run) -> dict:
    from benchmarks.search_report import plot_point

    args = job.args
    rename = dict(r.split("=", 1) for r in args.rename)
    entries = [json.loads(Path(p).read_text()) for p in args.point]
    entry = merge(entries, rename)
    last = list(entries[-1]["evaluations"])[0]
    first = args.first or rename.get(last, last)
    plot_point(entry, job.out / f"anytime-{entry['spec']['name']}.png")
    return job.header(point=entry["spec"]["name"], first=first, points=args.point, **table(entry, first))


def markdown(result: dict) -> str:
    first = result["first"]
    methods = list(result["finals"])
    lines = [f"# Anytime curves at {result['point']}", "", f"`{result['command']}`", ""]
    lines += ["Incumbent calibration KL (whole pool) at each FPE charged; – before a method's first incumbent.", ""]
    body = [
        [f"{r['fpe']:,.0f}", *("–" if r["kl"][m] is None else f"{r['kl'][m]:.4f}" for m in methods),
         {True: "yes", False: "no", None: "–"}[r["first_at_or_below"]]]
        for r in result["checkpoints"]
    ]  # fmt: skip
    lines += [C.md_table(["FPE", *methods, f"{first} at or below"], body), ""]
    body = [
        [m, f"{f['fpe']:,.0f}", f"{f['calibration_kl']:.4f}", f"{f['test_ppl']:.1f}"]
        for m, f in result["finals"].items()
    ]
    lines += [C.md_table(["method", "FPE", "calibration KL", "test PPL"], body), ""]
    for key, (ratio, low, high) in result["ratios"].items():
        lines.append(f"Test PPL ratio {key}: {ratio:.3f} [{low:.3f}, {high:.3f}] (paired bootstrap over test windows).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    C.main("anytime", parse, run, markdown, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
