"""The grid at the pipeline's sizes in the field's currency: each method's removal set scored on the standard
zero-shot suite (lm-eval, the papers' splits), with the paired difference default - method over the same items.

For every point file of ``benchmarks.final_choice`` (its sets: the default route ``refined``, EvoPress, SLEB,
one-at-a-time, BlockPruner where it ran) plus block influence (ShortGPT, ranked on the point's own calibration
windows) and the unpruned model, the set is removed from the point's model (the one its file names: the default
model, or Gemma 3 270M at ``gemma-m4-s0``) and scored task by task. Every score is cached per model, set and task
under ``--cache`` (a stopped run loses only the task it was in, and a later run with the same ``--limit`` and
``--seed`` resumes). ``--limit N`` scores a seeded subset of N items per task (the same items for every method)
and the report says so; without it every item is scored.

    .venv/bin/python -m benchmarks.suite_grid --limit 200 --points m15-s0 --threads 2
    .venv/bin/python -m benchmarks.suite_grid --report                  # the tables of the last run again
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import harness as C

RESULTS = Path(__file__).parent / "results"
POINTS = {
    "m8-s0": "m8-s0-select96.json",
    "m12-s0": "m12-s0-select96.json",
    "m15-s0": "m15-s0-select96.json",
    "sub8-s0": "sub8-s0-stage.json",
    "sub8-s0-select96": "sub8-s0-select96.json",  # the default before staged promotion
    "sub8-s1": "sub8-s1-stage.json",
    "sub8-s2": "sub8-s2-stage.json",
    "sub12-s0": "sub12-s0-stage.json",
    "gemma-m4-s0": "gemma-m4-s0.json",  # Gemma 3 270M, 4 of its 18 layers
}
METHODS = ("refined", "evopress", "sleb", "block_influence", "one-at-a-time", "blockpruner", "unpruned")
LABEL = {"refined": "default (refine + race)", "unpruned": "unpruned"}


def parse(argv: list[str] | None) -> Any:
    p = C.parser(__doc__.splitlines()[0], out="suite_grid", progress=True)
    p.add_argument("--points", default=",".join(POINTS), help=f"points ({', '.join(POINTS)})")
    p.add_argument("--methods", default=",".join(METHODS), help="methods to score (those a point has)")
    p.add_argument("--tasks", default="zeroshot", help="lm-eval tasks or groups (default: the zero-shot suite)")
    p.add_argument(
        "--extra",
        default=None,
        help="more sets: 'LABEL=FILE,...', the default route's set of another final_choice result at the same point "
        "(e.g. the race by KL)",
    )
    p.add_argument("--limit", type=int, default=None, help="a seeded subset of this many items per task")
    p.add_argument("--seed", type=int, default=0, help="seed of the subset")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--cache", type=Path, default=None, help="score cache (default: OUT/scores)")
    p.add_argument(
        "--cached-only",
        action="store_true",
        help="score nothing: tabulate only the sets whose tasks are all cached (a staged run's tables so far)",
    )
    C.add_report_arg(p, "suite_grid")
    return p.parse_args(argv)


def point_row(path: Path) -> dict[str, Any]:
    """The (single) row of a ``benchmarks.final_choice`` result file: its point, granularity and sets, and the
    model it pruned (``"model"``)."""
    result = json.loads(Path(path).read_text())
    return {**result["rows"][0], "model": C.model_of(result)}


def point_sets(row: dict[str, Any], model: Any, tokenizer: Any, methods: list[str]) -> dict[str, list[int]]:
    """``{method: removed block indices}`` of one point (block influence ranked on the point's calibration)."""
    sets = {m: list(row["sets"][m]) for m in methods if m in row["sets"]}
    if "unpruned" in methods:
        sets["unpruned"] = []
    if "block_influence" in methods:
        from argparse import Namespace

        from benchmarks.final_choice import FULL, splits_for
        from cbo.baselines import rank_blocks

        splits = splits_for(Namespace(**FULL), tokenizer, model, int(row["seed"]))
        ranking = rank_blocks("block_influence", model, splits, granularity=row["granularity"])
        count = int(row["remove"]) if row["granularity"] == "layer" else len(row["sets"]["refined"])
        sets["block_influence"] = sorted(int(i) for i in ranking.select(count))
    return sets


def _key(model: str, granularity: str, blocks: list[int], limit: int | None, seed: int) -> str:
    subset = "all" if limit is None else f"limit{limit}-seed{seed}"
    tag = C.model_tag(model)  # none for the default model: its keys predate the tag
    prefix = f"{Path(tag).name}-" if tag else ""
    return f"{prefix}{granularity}-{'-'.join(map(str, blocks)) or 'none'}-{subset}"


def read_scores(path: Path) -> dict:
    """A set's cached suite results and per-item scores (empty when not cached yet)."""
    return json.loads(path.read_text()) if path.is_file() else {"results": {}, "items": {}}


def add_scores(path: Path, done: dict, results: dict, items: dict) -> None:
    """Add one task's results and per-item scores (as ``evaluate_tasks`` fills them) to ``done`` and write it."""
    from cbo.files import atomic_write_text

    done["results"].update(results)
    done["items"].update({t: {str(k): v for k, v in s.items()} for t, s in items.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(done) + "\n")


def score_set(job: C.Run, name: str, granularity: str, blocks: list[int], model: Any, tokenizer: Any) -> dict:
    """The suite's results and per-item scores of one removal set of the model ``name``, from the cache or
    measured (task by task, each saved when it finishes)."""
    from cbo.downstream.harness import evaluate_tasks, parse_tasks, run_units
    from cbo.model.blocks import find_blocks
    from cbo.pipeline.depth import prune_blocks

    args = job.args
    path = Path(args.cache or job.out / "scores") / f"{_key(name, granularity, blocks, args.limit, args.seed)}.json"
    done = read_scores(path)
    todo = [u for u in run_units(parse_tasks(args.tasks)) if u not in done["results"]]
    if not todo:
        return done
    if getattr(args, "cached_only", False):
        return {"results": {}, "items": {}}  # not all cached: left out of the tables
    pruned = prune_blocks(model, find_blocks(model, granularity), blocks) if blocks else model
    for unit in todo:
        items: dict = {}
        results = evaluate_tasks(
            pruned, tokenizer, [unit], limit=args.limit, seed=args.seed, batch_size=args.batch_size,
            progress=not args.no_progress, item_scores=items,
        )  # fmt: skip
        add_scores(path, done, results, items)
    return done


def compare(point: dict[str, dict], units: list[str]) -> dict[str, Any]:
    """Per method: each task's reported metric, the average over ``units`` (the tasks and groups run), LAMBADA's
    perplexity, and default - method over the same items (a paired bootstrap interval)."""
    from cbo.downstream.scores import average, paired_difference, reported

    out = {}
    base = point.get("refined")
    for method, scores in point.items():
        res = scores["results"]
        row = {u: res.get(u, {}).get(reported(u)) for u in units}
        row["average"] = average(res, units)
        row["lambada_ppl"] = res.get("lambada_openai", {}).get("perplexity") if "lambada_openai" in units else None
        row["n"] = {t: int(v.get("n", 0)) for t, v in res.items()}
        if base is not None and method != "refined" and row["average"] is not None and average(base["results"], units):
            row["default_minus"] = list(paired_difference(_items(base), _items(scores), units))
        out[method] = row
    return out


def _items(scores: dict) -> dict:
    return {t: {int(k): v for k, v in s.items()} for t, s in scores["items"].items()}


def lead_growth(points: dict[str, tuple[int, dict[str, dict]]], units: list[str]) -> dict[str, list[float]]:
    """Does the default's lead over block influence grow with the count removed? For each layer point after the
    one that removes least: its lead minus that point's, over the items all four sets were scored on (a paired
    bootstrap interval). ``points``: ``{name: (removed, {method: scores})}`` of the layer points."""
    from cbo.downstream.scores import paired_contrast

    have = {n: (m, s) for n, (m, s) in points.items() if "refined" in s and "block_influence" in s}
    if len(have) < 2:
        return {}
    first = min(have, key=lambda n: have[n][0])
    a1, b1 = _items(have[first][1]["refined"]), _items(have[first][1]["block_influence"])
    out = {}
    for name, (_, scored) in sorted(have.items(), key=lambda kv: kv[1][0]):
        if name != first:
            a2, b2 = _items(scored["refined"]), _items(scored["block_influence"])
            out[f"{name} − {first}"] = list(paired_contrast([(1.0, a2), (-1.0, b2), (-1.0, a1), (1.0, b1)], units))
    return out


def pooled_seeds(groups: dict[str, list[tuple[int, dict[str, dict]]]], units: list[str]) -> dict[str, dict[str, list]]:
    """Default - method pooled over the seeds of one point: ``groups`` is ``{point: [(seed, {method: scores}), ...]}``;
    for each point with two or more seeds (each seed once: two files of one seed, e.g. ``sub8-s0`` and
    ``sub8-s0-select96``, are not a pool of seeds) and each method scored at all of them, the mean over seeds of
    default - method with a paired bootstrap interval over the items (every seed's sets scored on the same items)."""
    from cbo.downstream.scores import paired_contrast

    out: dict[str, dict[str, list]] = {}
    for point, entries in groups.items():
        entries = [(seed, scored) for seed, scored in entries if "refined" in scored]
        if len(entries) < 2 or len({seed for seed, _ in entries}) < len(entries):
            continue
        items = [{m: _items(s) for m, s in scored.items()} for _, scored in entries]  # converted once per set
        w = 1.0 / len(items)
        for method in sorted(set.intersection(*(set(i) for i in items)) - {"refined"}):
            terms = [term for i in items for term in ((w, i["refined"]), (-w, i[method]))]
            out.setdefault(point, {})[method] = [len(items), *paired_contrast(terms, units)]
    return out


def pool_of(row: dict[str, Any]) -> str:
    """The pool a point's seed joins (``pooled_seeds``): one model, granularity and count removed."""
    tag = C.model_tag(row["model"])
    return f"{tag + ', ' if tag else ''}{row['granularity']} M = {row['remove']}"


def run(job: C.Run) -> dict:
    args = job.args
    from cbo.downstream.harness import parse_tasks, run_units
    from cbo.model.loading import load_model

    loaded: dict[str, tuple[Any, Any]] = {}
    methods = C.split_list(args.methods)
    units = run_units(parse_tasks(args.tasks))
    settings = {"limit": args.limit, "seed": args.seed, "tasks": args.tasks, "units": ",".join(units)}
    points, layers, groups = {}, {}, {}
    for name in C.split_list(args.points):
        row = point_row(RESULTS / "final_choice" / POINTS[name])
        granularity, model_name = row["granularity"], row["model"]
        if model_name not in loaded:
            loaded[model_name] = load_model(model_name, quiet=True)
        model, tokenizer = loaded[model_name]
        sets = point_sets(row, model, tokenizer, methods)
        for extra in C.split_list(args.extra):
            label, _, path = extra.partition("=")
            sets[label] = list(point_row(Path(path))["sets"]["refined"])
        scored = {}
        for method, blocks in sets.items():
            if not args.no_progress:
                print(f"{name} {method}: removing {blocks}", flush=True)
            scores = score_set(job, model_name, granularity, blocks, model, tokenizer)
            if scores["results"]:
                scored[method] = scores
        points[name] = {"model": model_name, "sets": sets, "table": compare(scored, units)}
        if granularity == "layer" and not C.model_tag(model_name):  # the lead's growth: the default model's points
            layers[name] = (int(row["remove"]), scored)
        groups.setdefault(pool_of(row), []).append((int(row["seed"]), scored))
        job.save(job.header(points=points, **settings))  # what an interrupted run keeps
    growth, pooled = lead_growth(layers, units), pooled_seeds(groups, units)
    return job.header(points=points, growth=growth, pooled=pooled, **settings)


def markdown(result: dict) -> str:
    names = C.split_list(result.get("units")) if result.get("units") else []
    subset = (
        "every item"
        if result["limit"] is None
        else f"a seeded subset of {result['limit']} items per task (seed {result['seed']})"
    )
    lines = [f"# The grid on {result['tasks']} ({subset})", "", f"`{result['command']}`", ""]
    for name, point in result["points"].items():
        tag = C.model_tag(C.model_of(point))
        lines += [f"## {name}" + (f" ({tag})" if tag else ""), ""]
        ppl = ["LAMBADA PPL"] if "lambada_openai" in names else []
        header = ["method", *names, "average", *ppl, "default − method (avg, 95 % CI)"]
        rows = []
        for method, row in point["table"].items():
            diff = row.get("default_minus")
            rows.append([
                LABEL.get(method, method), *[C.fmt(row[t], 3) for t in names], C.fmt(row["average"], 4),
                *[C.fmt(row["lambada_ppl"], 4) for _ in ppl],
                "—" if diff is None else f"{diff[0]:+.4f} [{diff[1]:+.4f}, {diff[2]:+.4f}]",
            ])  # fmt: skip
        lines += [C.md_table(header, rows), ""]
    trend = [
        [name, f"{d[0]:+.4f} [{d[1]:+.4f}, {d[2]:+.4f}]"]
        for name, point in result["points"].items()
        if (d := point["table"].get("block_influence", {}).get("default_minus")) is not None
    ]
    if trend:
        lines += ["## The default's lead over block influence (average, default − block influence)", ""]
        lines += [C.md_table(["point", "difference (95 % CI, paired over items)"], trend), ""]
    pooled = [
        [point, LABEL.get(method, method), n, f"{d:+.4f} [{lo:+.4f}, {hi:+.4f}]"]
        for point, methods in (result.get("pooled") or {}).items()
        for method, (n, d, lo, hi) in methods.items()
    ]
    if pooled:
        lines += ["## Pooled over seeds (each seed's sets on the same items)", ""]
        lines += [C.md_table(["point", "method", "seeds", "default − method (avg, 95 % CI)"], pooled), ""]
    growth = [[pair, f"{d[0]:+.4f} [{d[1]:+.4f}, {d[2]:+.4f}]"] for pair, d in (result.get("growth") or {}).items()]
    if growth:
        lines += ["Does the lead grow with the count removed? One point's lead minus the smallest point's:", ""]
        lines += [C.md_table(["points", "change of the lead (95 % CI, paired over items)"], growth), ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    C.main("suite_grid", parse, run, markdown, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
