"""The final choice among near-ties at the pipeline's own sizes, judged on test windows that no choice reads.

Routes at each point (M, seed), each ``prune_depth`` on the same splits:

- ``validated``: the lowest validation KL among the validated states (``refine=None, select=None``: ``cbo prune
  --no-refine --no-select``, the default before this benchmark; in the results of M = 8 and 15 named ``default``);
- ``raced``: the same states raced on fresh validation windows (``refine=None, select=N``,
  ``cbo.search.selection``);
- ``refined`` (with ``--refine B``): refine's measured sets (``refine=B``), then the race (``cbo prune`` with no
  flags since this benchmark: B = 300, N = 480).

Each route measures anew (the measurement cache is emptied before it; the estimate is cached and charged from its
metadata), so every route is charged what a fresh run spends, in one unit (a forward over one window). With
``--reference FILE`` other methods' sets at the same splits (the search grid's EvoPress and SLEB) are measured
beside, charged their own recorded FPE; so is one-at-a-time (the M blocks whose single removal costs least: the
validated route's ground state, charged its estimate). Every set is then measured window by window on the test windows: the
pipeline's own test split (*Persuasion*) and the Python docs (``cbo.data.domains``, when installed). Each ratio (a
route's test PPL over the validated route's or a reference's) carries a paired bootstrap 95 % interval over the test
windows; below 1 means the route chose better.

Full settings: 32 calibration and 32 validation windows of 128 tokens (the pipeline's), a race of 96 fresh
windows (the default), 64 test windows per domain, M = 8, 12 and 15 (``--seeds``: each seed draws its own
calibration and validation windows, as the search grid does; the test windows are the same for every seed), and
``--granularity sublayer`` (M attention and M MLP halves, M layers' parameters). ``--quick``: a tiny run for the
test suite.
The results ``m8-s0``, ``m12-s0`` and ``m15-s0`` in ``benchmarks/results/final_choice/`` were run with ``--select
480``; the ``-select96`` ones with the default.

    python -m benchmarks.final_choice --remove 15 --refine 300 \\
        --reference benchmarks/results/search/full-layer-15-s0.json
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from benchmarks import depth_harness as D
from benchmarks import harness as C
from benchmarks.search_report import EQUAL

NAME = "final_choice"
FULL = {
    "remove": "8,12,15",
    "seq_len": 128,
    "calibration": 32,
    "validation": 32,
    "test": 64,
    "select": 96,
    "seeds": "0",
    "batch_size": 8,
}
QUICK = {
    "remove": "2",
    "seq_len": 32,
    "calibration": 4,
    "validation": 8,
    "test": 8,
    "select": 16,
    "batch_size": 4,
    "seeds": "0",
}
DOMAIN = "pydocs"


def parse(argv: list[str] | None) -> Any:
    p = C.parser(__doc__, out=NAME, quick="a tiny run (the test suite)", model=True)
    D.add_split_args(p, FULL)
    p.add_argument("--select", type=int, help=f"the race's fresh windows (default {FULL['select']})")
    p.add_argument("--seeds", help="comma-separated seeds (default 0)")
    p.add_argument("--criterion", default="ce", choices=("ce", "kl"), help="what the race compares")
    p.add_argument(
        "--refine", type=budget_arg, help="also refine with this budget (FPE of the rounds), then race; 'auto': the "
        "pipeline's default (the budget scaled with the space, a cheap prior where it is large)",
    )  # fmt: skip
    p.add_argument("--routes", help=f"comma-separated routes to run (default: all of {', '.join(ROUTES)} that apply)")
    p.add_argument(
        "--granularity",
        default="layer",
        choices=("layer", "sublayer"),
        help="sublayer: M attention and M MLP halves removed (M layers' parameters), as the search grid's sublayer "
        "points",
    )
    p.add_argument(
        "--reference",
        help="comma-separated json files of other methods' sets at the same splits (e.g. "
        "benchmarks/results/search/full-layer-15-s0.json: EvoPress and SLEB at M = 15), measured beside",
    )
    return C.parse_with_defaults(p, argv, FULL, QUICK)


def budget_arg(text: str) -> float | str:
    """``--refine``: a number of FPE or ``auto``."""
    return text if text == "auto" else float(text)


def splits_for(args: Any, tokenizer: Any, model: Any, seed: int) -> Any:
    """The splits of one seed, as the search grid draws them (``benchmarks.search_methods.Point``): the seed picks
    the calibration and validation windows; the test windows are the same for every seed (drawn with seed 0)."""
    from dataclasses import replace

    from cbo.data.windows import make_splits

    def draw(s: int) -> Any:
        return make_splits(
            tokenizer, seq_len=args.seq_len, n_calibration=args.calibration, n_validation=args.validation,
            n_test=args.test, seed=s, model=model,
        )  # fmt: skip

    chosen = draw(seed)
    if seed == 0:
        return chosen
    test = draw(0)
    info = {**chosen.info, "hash": {**chosen.info["hash"], "test": test.info["hash"]["test"]}, "test_seed": 0}
    return replace(chosen, test=test.test, info=info)


def test_sets(args: Any, tokenizer: Any, splits: Any, model: Any) -> dict[str, Any]:
    """The test windows by domain: the pipeline's test split and, when installed, the second domain (the same
    windows for every seed)."""
    from cbo.data.domains import domain_installed, load_test_domain

    out = {"austen": splits.test}
    if domain_installed(DOMAIN):
        out[DOMAIN] = load_test_domain(DOMAIN, tokenizer, n=args.test, seq_len=args.seq_len, seed=0, model=model)
    else:
        print(f"test domain {DOMAIN} not installed (cbo setup): measured on the novels only", flush=True)
    return out


ROUTES = ("validated", "raced", "refined")  # validation KL; + the race; refine + the race (with --refine)


def routes(args: Any, model: Any, tokenizer: Any, splits: Any, remove: int, seed: int) -> dict[str, Any]:
    """The reports of every route at one (M, seed). Each measures anew (the measurement cache is emptied before
    each run; the estimate is cached and charged from its metadata), so each is charged what a fresh run spends."""
    from cbo.pipeline import prune_depth

    cache = C.out_dir(args) / "cache"
    common = dict(
        remove=remove, splits=splits, seed=seed, cache_dir=cache, progress=False, batch_size=args.batch_size,
    )  # fmt: skip
    if args.granularity == "sublayer":  # M attention and M MLP halves, as benchmarks.search's sublayer points
        common.update(remove=2 * remove, granularity="sublayer", caps={"attention": remove, "mlp": remove})
    race = {"select": args.select, "select_options": {"criterion": args.criterion}}
    extra = {
        "validated": {"refine": None, "select": None},
        "raced": {"refine": None, **race},
        "refined": {"refine": args.refine, **race},
    }
    out = {}
    chosen = C.split_list(args.routes) if getattr(args, "routes", None) else ROUTES
    for route in [r for r in ROUTES if r in chosen and (args.refine or r != "refined")]:
        shutil.rmtree(cache / "measured", ignore_errors=True)
        out[route] = prune_depth(model, tokenizer, **common, **extra[route])
    return out


def references(args: Any, remove: int, seed: int) -> dict[str, Any]:
    """``--reference`` files' sets for this point, keyed by method: ``{"point": {"remove", "seed"}, "methods":
    {name: {"removed", "fpe"}}}``, or a search grid point's ``point.json`` (``benchmarks.search``: ``{"spec",
    "evaluations"}``; the incumbent at equal cost is left out), whose splits are the same; the points of this run's
    granularity only."""
    out = {}
    for path in C.split_list(args.reference or ""):
        ref = json.loads(Path(path).read_text())
        point, methods = (ref["spec"], ref["evaluations"]) if "spec" in ref else (ref["point"], ref["methods"])
        if point.get("granularity", "layer") != args.granularity:
            continue
        if int(point["remove"]) == remove and int(point["seed"]) == seed:
            out.update({name: m for name, m in methods.items() if name not in ROUTES and name != EQUAL})
    return out


def one_at_a_time(validated: Any, splits: Any) -> dict[str, Any]:
    """One-at-a-time, the M blocks whose removal alone costs least (within the caps at sublayer granularity): the
    ground state of the validated route's diagonal ``singles`` QUBO, charged that estimate (its single removals
    measured on every calibration window); nothing when the route used another estimator."""
    if validated.states is None or validated.qubo.metadata.get("estimator") != "singles":
        return {}
    charge = float(validated.work["estimate_fpe"]) * int(splits.calibration.shape[0])
    return {"one-at-a-time": {"removed": validated.states.removed(0), "fpe": charge}}


def point(args: Any, model: Any, tokenizer: Any, splits: Any, remove: int, seed: int) -> dict[str, Any]:
    """One (M, seed): every route's choice and cost, the references', and their per-window test NLL on every
    domain, each as a PPL ratio against the validated route's and against each reference's (paired bootstrap)."""
    from cbo.measure.measurer import Measurer
    from cbo.model.blocks import find_blocks
    from cbo.stats import paired_ppl_ratio

    reports = routes(args, model, tokenizer, splits, remove, seed)
    sets = {name: sorted(r.chosen_blocks) for name, r in reports.items()}
    fpe = {name: r.work["total_fpe"] for name, r in reports.items()}  # one unit: a forward over one window
    refs = one_at_a_time(reports["validated"], splits) if "validated" in reports else {}
    refs.update(references(args, remove, seed))
    for name, ref in refs.items():
        sets[name], fpe[name] = sorted(ref["removed"]), float(ref["fpe"])
    row: dict[str, Any] = {
        "remove": remove,
        "granularity": args.granularity,
        "seed": seed,
        "sets": sets,
        "fpe": fpe,
        "references": sorted(refs),
        "selection": {name: r.selection for name, r in reports.items() if r.selection is not None},
        "refine": reports["refined"].work["refine"] if "refined" in reports else None,
        "estimate_windows": {name: r.work.get("estimate_windows") for name, r in reports.items()},
        "test": {},
    }
    blocks = find_blocks(model, args.granularity)
    names = list(sets)
    for domain, windows in test_sets(args, tokenizer, splits, model).items():
        ce = Measurer(model, blocks, windows, batch_size=args.batch_size, retain=False).losses(list(sets.values())).ce
        by = dict(zip(names, ce))
        row["test"][domain] = {
            "windows": int(ce.shape[1]),
            "ppl": {name: math.exp(float(by[name].mean())) for name in names},
            "ratio": {  # route / baseline, below 1: the route is better
                f"{name}/{base}": list(paired_ppl_ratio(by[name], by[base], seed=seed))
                for base in [*(["validated"] if "validated" in reports else []), *sorted(refs)]
                for name in names
                if name != base and name in reports
            },
        }
    print(json.dumps(row), flush=True)
    return row


def run(r: C.Run) -> dict[str, Any]:
    args = r.args
    from cbo.model.loading import load_model

    model, tokenizer = load_model(args.model, device=D.device_of(args))
    rows = []
    for s in map(int, C.split_list(args.seeds)):
        splits = splits_for(args, tokenizer, model, s)
        rows += [point(args, model, tokenizer, splits, int(m), s) for m in C.split_list(args.remove)]
    return r.header(
        model=args.model, rows=rows, select=args.select, criterion=args.criterion, refine=args.refine,
        seq_len=args.seq_len,
    )  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    parts = [
        f"# The final choice at the pipeline's sizes (race: select={result['select']}, {result['criterion']};"
        f" refine: {result.get('refine')})\n",
        "FPE: everything charged, in forward passes over one window. Ratio: the route's test PPL over the"
        " baseline's, paired bootstrap 95 % interval over the test windows (below 1: the route is better).\n",
    ]
    for row in result["rows"]:
        head = ["method", "FPE", "removed", *(f"{d} PPL" for d in row["test"])]
        body = [
            [
                name,
                f"{row['fpe'][name]:.0f}",
                ",".join(map(str, s)),
                *(f"{t['ppl'][name]:.1f}" for t in row["test"].values()),
            ]
            for name, s in row["sets"].items()
        ]
        where = " (sublayer: M attention and M MLP halves)" if row.get("granularity") == "sublayer" else ""
        parts.append(f"## M = {row['remove']}{where}, seed {row['seed']}\n\n" + C.md_table(head, body))
        ratios = next(iter(row["test"].values()))["ratio"]
        head = ["ratio", *row["test"]]
        body = [
            [key, *(f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]" for r in (t["ratio"][key] for t in row["test"].values()))]
            for key in ratios
        ]
        parts.append(C.md_table(head, body))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> Any:
    return C.main(NAME, parse, run, markdown, argv=argv, show=True)


if __name__ == "__main__":
    main()
