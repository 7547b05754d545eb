"""The unpruned models on the standard suite beside the figures their publishers report, and what the suite costs
on this machine: wall time, items per second and peak memory per task.

Each task runs on its own (``cbo.evaluate_tasks`` on the in-memory model), so its wall time is its own; the peak
memory is the process's peak resident set after the task (it only grows). ``--limit N`` scores a seeded subset of
N items per task, and the report says so and projects the full suite's wall time from the measured items per
second (labelled as a projection); without it every item is scored and the times are measured.

    .venv/bin/python -m benchmarks.suite_reference --models smollm2-135m --limit 100 --threads 2
    .venv/bin/python -m benchmarks.suite_reference --models smollm2-135m,gemma3-270m     # every item (hours on CPU)
"""

from __future__ import annotations

import resource
import time
from typing import Any

from benchmarks import harness as C

# What the publishers report, with the metric and setting; None where they report nothing comparable.
PUBLISHED: dict[str, dict[str, Any]] = {
    "gemma3-270m": {
        "source": "Gemma 3 270M model card (Google, Aug 2025): the pre-trained model's figures, and where it gives "
        "none, the instruction-tuned model's (IT)",
        "tasks": {
            "hellaswag": (40.9, "10-shot"),
            "boolq": (61.4, "0-shot"),
            "piqa": (67.7, "0-shot; IT 66.2"),
            "arc_easy": (57.7, "0-shot"),
            "winogrande": (52.3, "0-shot, IT"),
        },
    },
    "smollm2-135m": {
        "source": "an lm-eval 0-shot run of SmolLM2-135M-Instruct published beside a fine-tune of it "
        "(lldois/SmolLM2-135M-Reasoning-SLERP-Champion, 'Baseline' column); the SmolLM2 card reports lighteval "
        "figures with other prompts",
        "tasks": {
            "arc_easy": (54.12, "0-shot acc"),
            "arc_challenge": (27.73, "0-shot acc_norm"),
            "hellaswag": (42.99, "0-shot acc_norm"),
            "piqa": (66.92, "0-shot acc_norm"),
        },
    },
}


def parse(argv: list[str] | None) -> Any:
    p = C.parser(__doc__.splitlines()[0], out="suite_reference", progress=True)
    p.add_argument("--models", default="smollm2-135m", help="installed models (smollm2-135m, gemma3-270m)")
    p.add_argument("--tasks", default="zeroshot", help="tasks or groups (default: the zero-shot suite)")
    p.add_argument("--limit", type=int, default=None, help="a seeded subset of this many items per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--scores", default=None, help="also save each item's scores here, in benchmarks.suite_grid's cache format "
        "(each model's unpruned set; then the grid reuses them)",
    )  # fmt: skip
    return p.parse_args(argv)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def save_items(args: Any, model: str, results: dict, items: dict) -> None:
    """Add one task's results and per-item scores to the grid's cache file of the unpruned ``model``."""
    from pathlib import Path

    from benchmarks.suite_grid import _key, add_scores, read_scores

    path = Path(args.scores) / f"{_key(model, 'layer', [], args.limit, args.seed)}.json"
    add_scores(path, read_scores(path), results, items)


def run(job: C.Run) -> dict:
    from cbo.downstream.harness import evaluate_tasks, parse_tasks, run_units
    from cbo.downstream.subsets import subset_plan
    from cbo.model.loading import load_model

    args = job.args
    units = run_units(parse_tasks(args.tasks))
    plan = subset_plan(units, None, args.seed)  # every task's full size, for the projection
    models = {}
    for name in C.split_list(args.models):
        start = time.perf_counter()
        model, tokenizer = load_model(name, quiet=True)
        rows = {"load_s": round(time.perf_counter() - start, 1), "tasks": {}}
        for unit in units:
            start = time.perf_counter()
            items: dict = {}
            results = evaluate_tasks(
                model, tokenizer, [unit], limit=args.limit, seed=args.seed, batch_size=args.batch_size,
                progress=not args.no_progress, item_scores=items,
            )  # fmt: skip
            wall = time.perf_counter() - start
            if args.scores:
                save_items(args, name, results, items)
            n = int(sum(r.get("n", 0) for r in results.values()))
            full = sum(plan.totals.get(t, 0) for t in plan.members.get(unit, (unit,)))
            rows["tasks"][unit] = {
                "results": results, "wall_s": round(wall, 1), "items": n, "items_full": full,
                "items_per_s": round(n / wall, 2) if wall else None, "peak_rss_mb": round(peak_rss_mb()),
            }  # fmt: skip
            job.save(job.header(models={**models, name: rows}, limit=args.limit, seed=args.seed))
        models[name] = rows
        del model
    return job.header(models=models, limit=args.limit, seed=args.seed)


def markdown(result: dict) -> str:
    from cbo.downstream.scores import reported, suite_average

    subset = "every item" if result["limit"] is None else f"a seeded subset of {result['limit']} items per task"
    lines = [f"# The unpruned models on the standard suite ({subset})", "", f"`{result['command']}`", ""]
    lines += [f"Machine: {C.machine_line(result['machine'])}", ""]
    for name, rows in result["models"].items():
        published = PUBLISHED.get(name, {"source": "none found", "tasks": {}})
        lines += [f"## {name}", "", f"Published: {published['source']}.", ""]
        table = []
        total_wall = projected = 0.0
        for unit, row in rows["tasks"].items():
            res = row["results"].get(unit, {})
            metric = reported(unit)
            value, err = res.get(metric), res.get(f"{metric}_stderr")
            pub = published["tasks"].get(unit)
            total_wall += row["wall_s"]
            rate = row["items_per_s"] or 0
            projected += row["items_full"] / rate if rate else 0
            table.append([
                unit, metric, "—" if value is None else f"{100 * value:.1f} ± {100 * (err or 0):.1f}",
                "—" if pub is None else f"{pub[0]} ({pub[1]})", f"{row['items']} of {row['items_full']}",
                row["wall_s"], row["items_per_s"], row["peak_rss_mb"],
            ])  # fmt: skip
        header = ["task", "metric", "ours (%, ± stderr)", "published", "items", "wall s", "items/s", "peak RSS MB"]
        lines += [C.md_table(header, table), ""]
        average = suite_average({u: r["results"].get(u, {}) for u, r in rows["tasks"].items()})
        if average is not None:
            lines.append(f"Suite average: {100 * average:.2f}.")
        lines.append(f"Wall time: {total_wall:.0f} s measured (model load {rows['load_s']} s).")
        if result["limit"] is not None:
            lines.append(f"Every item, projected from the measured items/s (not measured): {projected / 3600:.1f} h.")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    C.main("suite_reference", parse, run, markdown, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
