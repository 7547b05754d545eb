"""Downstream tasks (lm-eval) of the default model and depth-pruned versions of it, on the local tasks made from
the held-out novel (*Persuasion*): ``austen_cloze`` (LAMBADA-style last word) and ``austen_choice`` (four-way
continuation).

Variants: the original; each ``--remove`` set (comma-separated block indices; several sets separated by ``;``),
removed with :func:`cbo.surgery.depth.remove_blocks` and evaluated in memory through
:func:`cbo.evaluate_tasks`. The defaults are the M = 8 sets of BENCHMARKS.md: CBO's default (``singles``, best
of the top-10 validated) and block influence (ShortGPT).

    .venv/bin/python -m benchmarks.downstream                       # all items (274 cloze, 500 choice)
    .venv/bin/python -m benchmarks.downstream --limit 50 --threads 1
    .venv/bin/python -m benchmarks.downstream --remove "4,5,13,14,15,16,17,18" --json out.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks import harness as C

DEFAULT_SETS = {
    "cbo singles M=8": [4, 5, 13, 14, 15, 16, 17, 18],
    "block influence M=8": [12, 13, 14, 15, 16, 17, 25, 26],
}


def _sets(spec: str | None) -> dict[str, list[int]]:
    if not spec:
        return dict(DEFAULT_SETS)
    out = {}
    for part in spec.split(";"):
        blocks = [int(b) for b in part.split(",") if b.strip()]
        out[f"removed {blocks}"] = blocks
    return out


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="model name or folder")
    p.add_argument("--tasks", default="austen_cloze,austen_choice", help="lm-eval tasks")
    p.add_argument("--remove", default=None, help="block sets to remove: '1,2,3;4,5,6' (default: BENCHMARKS.md's)")
    p.add_argument("--limit", type=int, default=None, help="items per task (default: all)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    return C.main("downstream", p, run, argv=argv)


def run(job: C.Run) -> int:
    args = job.args
    from cbo.downstream.harness import evaluate_tasks
    from cbo.model.loading import load_model
    from cbo.surgery.depth import remove_blocks

    model, tokenizer = load_model(args.model, quiet=True)
    variants = {"original": []} | _sets(args.remove)
    rows = []
    for name, blocks in variants.items():
        t0 = time.perf_counter()
        candidate = remove_blocks(model, blocks) if blocks else model
        results = evaluate_tasks(
            candidate, tokenizer, args.tasks, limit=args.limit, batch_size=args.batch_size, progress=False
        )
        rows.append({"variant": name, "removed": blocks, "results": results, "seconds": time.perf_counter() - t0})
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    metrics = [(task, m) for task, ms in rows[0]["results"].items() for m in ms if not m.endswith("_stderr")]
    metrics = [(t, m) for t, m in metrics if m != "n"]
    print("| variant | " + " | ".join(f"{t} {m}" for t, m in metrics) + " |")
    print("|---|" + "---:|" * len(metrics))
    for row in rows:
        cells = []
        for task, metric in metrics:
            value = row["results"][task][metric]
            err = row["results"][task].get(f"{metric}_stderr")
            cells.append(f"{value:.4g}" + (f" ± {err:.2g}" if err is not None and err == err else ""))
        print(f"| {row['variant']} | " + " | ".join(cells) + " |")
    n = {task: int(ms["n"]) for task, ms in rows[0]["results"].items()}
    print(f"\nitems: {n}; machine: {C.machine()}")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": C.machine(), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
