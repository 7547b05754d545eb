"""What sharing each context saves: the standard suite scored by lm-eval's own loop (each request whole) and by
CBO's shared-context scorer (:mod:`cbo.downstream.shared_prefix`) on the same items, with the wall time of each,
the ratio, and how many items' scores differ (they should not: the same log-likelihoods up to float rounding).

    .venv/bin/python -m benchmarks.suite_scorer --limit 100 --threads 2
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import harness as C


def parse(argv: list[str] | None) -> Any:
    p = C.parser(__doc__.splitlines()[0], out="suite_scorer", progress=True)
    p.add_argument("--model", default="smollm2-135m", help="an installed model")
    p.add_argument("--tasks", default="zeroshot", help="tasks or groups (default: the zero-shot suite)")
    p.add_argument("--limit", type=int, default=100, help="a seeded subset of this many items per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    return p.parse_args(argv)


def differing(a: dict, b: dict) -> int:
    """Items of one task whose scores (any metric) differ between two runs."""
    return sum(1 for doc, scores in a.items() if any(abs(v - b[doc][m]) > 1e-9 for m, v in scores.items()))


def run(job: C.Run) -> dict:
    from cbo.downstream.harness import evaluate_tasks, parse_tasks, run_units
    from cbo.model.loading import load_model

    args = job.args
    model, tokenizer = load_model(args.model, quiet=True)
    rows = {}
    for unit in run_units(parse_tasks(args.tasks)):
        row: dict[str, Any] = {}
        items: dict[str, dict] = {}
        for scorer in ("whole", "shared"):
            items[scorer] = {}
            start = time.perf_counter()
            results = evaluate_tasks(
                model, tokenizer, [unit], limit=args.limit, seed=args.seed, batch_size=args.batch_size,
                shared_contexts=scorer == "shared", progress=not args.no_progress, item_scores=items[scorer],
            )  # fmt: skip
            row[f"{scorer}_s"] = round(time.perf_counter() - start, 1)
            row["items"] = int(sum(r.get("n", 0) for r in results.values()))
        row["speedup"] = round(row["whole_s"] / row["shared_s"], 2)
        row["differing_items"] = sum(differing(items["whole"][t], items["shared"][t]) for t in items["whole"])
        rows[unit] = row
        job.save(job.header(model=args.model, tasks=rows, limit=args.limit, seed=args.seed))
    return job.header(model=args.model, tasks=rows, limit=args.limit, seed=args.seed)


def markdown(result: dict) -> str:
    rows = result["tasks"]
    lines = [
        f"# Shared contexts against each request whole ({result['model']}, a seeded subset of {result['limit']} "
        "items per task)", "", f"`{result['command']}`", "", f"Machine: {C.machine_line(result['machine'])}", "",
    ]  # fmt: skip
    table = [
        [u, r["items"], r["whole_s"], r["shared_s"], f"{r['speedup']:.2f}×", r["differing_items"]]
        for u, r in rows.items()
    ]
    whole, shared = sum(r["whole_s"] for r in rows.values()), sum(r["shared_s"] for r in rows.values())
    table.append(["all", sum(r["items"] for r in rows.values()), round(whole, 1), round(shared, 1),
                  f"{whole / shared:.2f}×" if shared else "—", sum(r["differing_items"] for r in rows.values())])  # fmt: skip
    lines += [C.md_table(["task", "items", "whole s", "shared s", "speed-up", "items scored differently"], table), ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    C.main("suite_scorer", parse, run, markdown, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
