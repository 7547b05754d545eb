"""Search that pays: refine, EvoPress, SLEB, BlockPruner, singles + validation and random search, by cost.

For each grid point (granularity, M, calibration seed) and each method, the search runs on the calibration split
(Emma; a pool of ``--calibration`` windows, the seed picks which), chooses with calibration and validation
(Mansfield Park) only, and is charged its forward-pass equivalents (FPE: one full forward pass of the model over
one window; see ``cbo.measure.executors``). Reported, without charge to the method:

* the anytime curve: after each step (generation, round, greedy step, batch) the method's incumbent, its KL to
  the original on the whole calibration pool, and — for up to ``--curve-points`` incumbents per method — its
  test perplexity (Persuasion, the same ``--test`` windows for every seed);
* the final choice's test PPL, with a paired bootstrap 95 % interval of its PPL ratio against the best baseline
  (resampling test windows).

Every method is checkpointed (a rerun resumes where it stopped and loses no finished step) and every evaluation
is cached under ``--out``, so a grid can be staged over several sessions: ``--points`` and ``--methods`` choose
what runs now; ``--report`` rewrites the tables and plots from what is there.

    .venv/bin/python -m benchmarks.search --points layer-15-s0                  # one grid point
    .venv/bin/python -m benchmarks.search                                       # the whole grid
    .venv/bin/python -m benchmarks.search --quick                               # minutes; what the test suite runs
    .venv/bin/python -m benchmarks.search --report                              # tables and plots only
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks import depth_harness as D
from benchmarks import harness as C
from benchmarks.search_methods import APPLIES, Point, parse_point, run_method
from benchmarks.search_report import EQUAL, METHODS, in_progress, markdown, plot_point

BASELINES = ("evopress", "sleb", "blockpruner", "singles", "random")
POINTS = ("layer-8-s0", "layer-12-s0", "layer-15-s0", "layer-15-s1", "layer-15-s2", "sublayer-8-s0")
DEFAULTS = {
    "points": ",".join(POINTS),
    "methods": ",".join(METHODS),
    "calibration": 32,
    "validation": 32,
    "test": 64,
    "seq_len": 128,
    "offspring": 32,
    "generations": None,
    "stage_windows": "1,16",
    "sleb_windows": 8,
    "blockpruner_windows": 8,
    "refine_fraction": 0.25,
    "validate": 10,
    "curve_points": 8,
    "bootstrap": 2000,
}
QUICK = {  # every method at both points in a few CPU minutes (what tests/benchmarks/test_search_bench.py runs)
    "points": "layer-3-s0,sublayer-2-s0",
    "methods": ",".join(METHODS),
    "calibration": 2,  # refine and random measure on 2 high-fidelity windows in quick mode: the whole pool
    "validation": 2,
    "test": 16,  # 256 test tokens: enough that no pruned set's test PPL comes out below the original's by chance
    "seq_len": 16,
    "offspring": 4,
    "generations": 2,
    "stage_windows": "1,1",
    "sleb_windows": 1,
    "blockpruner_windows": 1,
    "refine_fraction": 0.5,
    "validate": 3,
    "curve_points": 2,
    "bootstrap": 200,
    # refine's (and random search's) budget: the sublayer prior (60 units on 2 windows, ~75 FPE) and the validation
    # reserve (8 FPE) leave two rounds (~18 FPE each) at sublayer and four at layer granularity
    "refine_budget": 130,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = C.parser(__doc__, out="search", out_help="checkpoints, caches, results", quick="tiny settings", model=True)
    p.add_argument("--points", help=f"grid points GRAN-M-sSEED, comma-separated (default {DEFAULTS['points']})")
    p.add_argument("--methods", help=f"methods to run (default {DEFAULTS['methods']})")
    p.add_argument("--calibration", type=int, help="calibration pool windows (default 32)")
    p.add_argument("--validation", type=int, help="validation windows (default 32)")
    p.add_argument("--test", type=int, help="test windows (default 64)")
    p.add_argument("--offspring", type=int, help="EvoPress λ (default 32, the published setting; 16 is its fast one)")
    p.add_argument("--generations", type=int, help="EvoPress generations (default: int(k(n-k)/1.5), published)")
    p.add_argument(
        "--evopress-budget",
        type=float,
        default=None,
        help="stop EvoPress once it has spent this many FPE (a capped run; its checkpoint resumes without it)",
    )
    p.add_argument("--stage-windows", help="EvoPress windows of selection stage 1 and 2 (default 1,16)")
    p.add_argument("--sleb-windows", type=int, help="calibration windows SLEB measures with (default 8)")
    p.add_argument(
        "--blockpruner-windows", type=int, help="calibration windows BlockPruner measures (default 8, as SLEB)"
    )
    p.add_argument(
        "--refine-fraction",
        type=float,
        help="refine's budget as a fraction of EvoPress's FPE at the same point (default 0.25)",
    )
    p.add_argument("--refine-budget", type=float, default=None, help="refine's budget in FPE (overrides the fraction)")
    p.add_argument("--validate", type=int, help="states validated by singles and refine (default 10)")
    p.add_argument(
        "--refine-local",
        type=float,
        default=None,
        help="refine's trust-region share of a batch (default: the pipeline's for the space, "
        "cbo.search.budget.space_options: 0.5, or 0.85 around the incumbent alone in a large space)",
    )
    p.add_argument(
        "--refine-thompson",
        type=float,
        default=None,
        help="refine's posterior-draw share (default: the pipeline's for the space: 0.25, or 0.1 in a large space)",
    )
    p.add_argument(
        "--refine-options", type=json.loads, default={}, help="more refine options as JSON, e.g. '{\"batch\": 24}'"
    )
    p.add_argument("--curve-points", type=int, help="incumbents per method whose test PPL is measured (default 8)")
    p.add_argument("--bootstrap", type=int, help="bootstrap resamples of the test windows (default 2000)")
    p.add_argument("--no-plot", action="store_true")
    C.add_report_arg(p, "search")
    return C.parse_with_defaults(p, argv, DEFAULTS, QUICK)


# ------------------------------------------------------------------------------------------------ evaluation
def curve_indices(steps: list[dict[str, Any]], count: int) -> list[int]:
    """Up to ``count`` steps, spread evenly in log FPE, always the last."""
    import numpy as np

    idx = [k for k, st in enumerate(steps) if st.get("removed")]
    if len(idx) <= count:
        return idx
    fpe = np.log([max(steps[k]["fpe"], 1e-9) for k in idx])
    targets = np.linspace(fpe[0], fpe[-1], count)
    chosen = {idx[int(np.argmin(np.abs(fpe - t)))] for t in targets} | {idx[-1]}
    return sorted(chosen)


def at_equal_cost(results: dict[str, Any]) -> dict[str, Any] | None:
    """EvoPress's incumbent after its last generation within refine's FPE: the anytime comparison at equal cost."""
    if "refine" not in results or "evopress" not in results:
        return None
    spent = results["refine"]["fpe"]
    steps = [st for st in results["evopress"]["steps"] if st["fpe"] <= spent]
    if not steps:
        return None
    last = steps[-1]
    return {"removed": last["removed"], "fpe": last["fpe"], "steps": steps}


def evaluate_point(point: Point, results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Calibration KL of every incumbent, test PPL of the curve's incumbents, per-window test NLL of the finals."""
    out: dict[str, Any] = {}
    results = dict(results)
    equal = at_equal_cost(results)
    if equal is not None:
        results[EQUAL] = equal
    for method, r in results.items():
        steps = r["steps"]
        sets = [st["removed"] for st in steps if st.get("removed")]
        distinct = [list(s) for s in dict.fromkeys(tuple(s) for s in sets)]
        kl = dict(zip(map(tuple, distinct), point.evaluate("calibration", distinct).mean(axis=1)))
        picks = curve_indices(steps, int(args.curve_points))
        test_sets = [steps[k]["removed"] for k in picks]
        ce = point.evaluate("test", test_sets, loss="ce")
        curve = []
        best_kl = math.inf
        for k, st in enumerate(steps):
            if not st.get("removed"):
                continue
            best_kl = float(kl[tuple(st["removed"])])
            row = {"fpe": st["fpe"], "calibration_kl": best_kl}
            if k in picks:
                row["test_ppl"] = math.exp(float(ce[picks.index(k)].mean()))
            curve.append(row)
        final_ce = point.evaluate("test", [r["removed"]], loss="ce")[0]
        out[method] = {
            "removed": r["removed"],
            "fpe": r["fpe"],
            "calibration_kl": float(point.evaluate("calibration", [r["removed"]]).mean()),
            "test_ppl": math.exp(float(final_ce.mean())),
            "test_nll": final_ce.tolist(),
            "curve": curve,
        }
    return out


def compare(evals: dict[str, Any], resamples: int) -> dict[str, Any]:
    """refine's test PPL ratio against each baseline and against the best baseline (by test PPL), with intervals."""
    from cbo.stats import paired_ppl_ratio

    if "refine" not in evals:
        return {}
    ref = evals["refine"]["test_nll"]
    out = {}
    for method, e in evals.items():
        if method != "refine":
            out[method] = paired_ppl_ratio(ref, e["test_nll"], resamples)
    base = [m for m in evals if m not in ("refine", EQUAL)]
    if base:
        best = min(base, key=lambda m: evals[m]["test_ppl"])
        out["best_baseline"] = best
    return out


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> dict:
    return C.main("search", parse_args, run, argv=argv)


def run(job: C.Run) -> dict:
    """The grid points asked for (none with ``--report``), then the tables of every point on disk."""
    args, out = job.args, job.out
    if args.report:
        results = {"benchmark": "search", "command": C.command_line(), "points": {}}
        results["in_progress"] = in_progress(out)
        return write_tables(out, results)
    from cbo.model.loading import load_model

    model, tok = load_model(args.model, device=D.device_of(args))
    points = [parse_point(p) for p in C.split_list(args.points)]
    methods = C.split_list(args.methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; valid: {list(METHODS)}")
    results: dict[str, Any] = job.header(points={})
    for spec in points:
        point = Point(spec, model, tok, args, out)
        runs: dict[str, Any] = {}
        for method in METHODS:
            if method in methods and point.granularity in APPLIES.get(method, ("layer", "sublayer")):
                runs[method] = run_method(point, method, args)
        # every method already finished at this point enters the tables, also those run in an earlier session
        for method in METHODS:
            if method not in runs and point.result_path(method).exists():
                runs[method] = json.loads(point.result_path(method).read_text())
        evals = evaluate_point(point, runs, args)
        entry = {"spec": spec, "model": args.model, "evaluations": evals, "ratios": compare(evals, int(args.bootstrap))}
        entry["original_test_ppl"] = math.exp(float(point.evaluate("test", [[]], loss="ce")[0].mean()))
        entry["runs"] = {m: {k: v for k, v in r.items() if k != "rounds"} for m, r in runs.items()}
        C.write_json(point.dir / "point.json", entry)
        if not args.no_plot:
            plot_point(entry, out / f"search-{point.name}.png")
        point.close()
    return write_tables(out, results)


def write_tables(out: Path, results: dict) -> dict:
    """``search.json`` and ``search.md`` from every grid point finished under ``out`` (``point.json``)."""
    for path in sorted(out.glob("*/point.json")):
        results["points"][path.parent.name] = json.loads(path.read_text())
    C.write_json(out / "search.json", results)
    (out / "search.md").write_text(markdown(results))
    print(f"wrote {out / 'search.md'} from {len(results['points'])} grid points", flush=True)
    return results


if __name__ == "__main__":
    main()
