"""Recovery after depth pruning: does the order of the candidates before healing predict the order after?

For each M (blocks removed), the default pipeline (``cbo.prune_depth(model, remove=M, top_k=10, validate=10)``)
ranks and validates its low-energy states; the ``--top`` best by validation KL (the pipeline's own order) are
each healed with the same budget (:func:`cbo.recovery.healing`: knowledge distillation from the unpruned model's
logits, LoRA by default) on calibration windows (Emma), and measured before and after on the validation split
(Mansfield Park) and the test split (Persuasion): perplexity and KL to the unpruned model. Per M it reports the
Spearman and Kendall correlation of the test perplexities before vs after, and whether the best state after
healing is the best one before (on test, and as the validation split would choose it). Nothing is chosen on the
test split.

Every healed state is written to ``OUT/recovery.json`` as it finishes, and each heal keeps a checkpoint under
``--checkpoints`` (default ``benchmarks/out/recovery-checkpoints``, not committed), so an interrupted run
resumes where it stopped, mid-heal included; ``--report`` rewrites the Markdown from the JSON.

Usage:
    python -m benchmarks.recovery --threads 1                      # M = 8 and 15, top 5, the default budget
    python -m benchmarks.recovery --removes 8 --top 3 --steps 20   # smaller
    python -m benchmarks.recovery --quick --out benchmarks/out/rq          # about a CPU-minute: fisher, tiny splits
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

from benchmarks import depth_harness as D
from benchmarks import harness as C

NAME = "recovery"
DEFAULT_OUT = C.REPO / "benchmarks" / "results" / "recovery"
DEFAULT_CHECKPOINTS = C.OUT / "recovery-checkpoints"
FULL = dict(removes=[8, 15], top=5, steps=40, batch_size=4, seq_len=128, n_train=64, n_validation=32, n_test=32)
QUICK = dict(removes=[4], top=2, steps=2, batch_size=2, seq_len=32, n_train=8, n_validation=4, n_test=4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = C.parser(
        __doc__, out=DEFAULT_OUT, quick="M=4, top 2, 2 steps, tiny splits, fisher estimator", seed=0, progress=True
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--removes", type=int, nargs="+", default=None, help="values of M (default 8 15)")
    p.add_argument("--top", type=int, default=None, help="validated states healed per M (default 5)")
    p.add_argument("--steps", type=int, default=None, help="heal steps per state (default 40)")
    p.add_argument("--batch-size", type=int, default=None, help="windows per heal step (default 4)")
    p.add_argument("--method", default="lora", choices=["lora", "full"])
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the method's)")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--n-train", type=int, default=None, help="calibration windows the heal trains on (default 64)")
    p.add_argument("--n-validation", type=int, default=None)
    p.add_argument("--n-test", type=int, default=None)
    p.add_argument(
        "--pipeline-windows",
        type=int,
        nargs=3,
        default=None,
        metavar=("CAL", "VAL", "SEQ"),
        help="prune_depth's calibration and validation windows and tokens per window (default: its own, 32 32 128; --quick: the heal's splits)",
    )
    p.add_argument("--estimator", default=None, help="prune_depth's estimator (default: its own; --quick: fisher)")
    p.add_argument("--checkpoints", type=Path, default=None, help="heal checkpoints (default: under benchmarks/out)")
    p.add_argument("--hessian-cache", default=None, help="prune_depth's cache folder (default CBO_HOME/cache)")
    C.add_report_arg(p, NAME)
    args = C.parse_with_defaults(p, argv, FULL, QUICK)
    if args.quick:  # the cheapest estimator
        args.estimator = args.estimator or "fisher"
    if args.top < 2:
        p.error("--top must be at least 2 (rank correlations need two states)")
    return args


def main(argv: list[str] | None = None) -> dict:
    return C.main(NAME, parse_args, run, markdown, argv=argv, show=True)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What decides a row; rows of other settings in an existing JSON are not reused."""
    keys = ("model", "quick", "steps", "batch_size", "method", "lr", "seq_len", "n_train", "n_validation")
    return {k: getattr(args, k) for k in (*keys, "n_test", "estimator", "pipeline_windows", "seed")}


def measure(model: Any, splits: Any, refs: dict[str, Any]) -> dict[str, float]:
    from cbo.evaluate import evaluate

    out = {}
    for split in ("validation", "test"):
        r = evaluate(model, getattr(splits, split), refs[split])
        out[f"{split}_ppl"], out[f"{split}_kl"] = float(r["ppl"]), float(r["kl"])
    return out


def correlations(rows: list[dict]) -> dict[str, Any]:
    """Rank agreement of before vs after within one M, and whether the best state stays the best."""
    from cbo.stats import kendall, spearman

    before = [r["before"]["test_ppl"] for r in rows]
    after = [r["after"]["test_ppl"] for r in rows]
    val_after = [r["after"]["validation_ppl"] for r in rows]
    finite = all(math.isfinite(v) for v in before + after)
    best_before = min(range(len(rows)), key=lambda i: before[i])
    best_after = min(range(len(rows)), key=lambda i: after[i])
    chosen_after = min(range(len(rows)), key=lambda i: val_after[i])  # what validation would pick after healing
    return {
        "n": len(rows),
        "spearman_test_ppl": spearman(before, after) if finite and len(rows) > 2 else math.nan,
        "kendall_test_ppl": kendall(before, after) if finite and len(rows) > 1 else math.nan,
        "spearman_pipeline_order_vs_after": spearman(list(range(len(rows))), after) if len(rows) > 2 else math.nan,
        "best_before_test": rows[best_before]["rank"],
        "best_after_test": rows[best_after]["rank"],
        "same_best_on_test": best_before == best_after,
        "pipeline_choice": rows[0]["rank"],
        "pipeline_choice_is_best_after": best_after == 0,
        "validation_choice_after_healing": rows[chosen_after]["rank"],
    }


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        *C.report_head("Recovery after depth pruning", result),
        f"Heal: {s['method']} (KD from the unpruned model's logits), {s['steps']} steps x {s['batch_size']} windows"
        f" x {s['seq_len']} tokens on {s['n_train']} calibration windows; PPL/KL on {s['n_validation']} validation"
        f" and {s['n_test']} test windows. Original test PPL {C.fmt(result.get('original', {}).get('test_ppl'))}.",
        "",
    ]
    header = ["M", "state (energy rank)", "removed", "val KL (pipeline)", "test PPL before", "test PPL after",
              "test KL before", "test KL after", "val PPL after", "heal s"]  # fmt: skip
    table = []
    for m, block in result["per_m"].items():
        for r in block["rows"]:
            b, a = r["before"], r["after"]
            table.append([m, str(r["rank"]), " ".join(map(str, r["removed"])), r["validation_kl"], b["test_ppl"],
                          a["test_ppl"], b["test_kl"], a["test_kl"], a["validation_ppl"], r["heal_seconds"]])  # fmt: skip
    lines += [C.md_table(header, table), ""]
    corr_header = ["M", "states", "Spearman (test PPL before vs after)", "Kendall", "Spearman (pipeline order vs after)",
                   "best before (test)", "best after (test)", "same best", "pipeline's choice", "validation's choice after"]  # fmt: skip
    corr = []
    for m, block in result["per_m"].items():
        c = block.get("correlations")
        if c:
            corr.append([m, c["n"], c["spearman_test_ppl"], c["kendall_test_ppl"],
                         c["spearman_pipeline_order_vs_after"], str(c["best_before_test"]), str(c["best_after_test"]),
                         "yes" if c["same_best_on_test"] else "no", str(c["pipeline_choice"]),
                         str(c["validation_choice_after_healing"])])  # fmt: skip
    lines += [C.md_table(corr_header, corr), ""]
    return "\n".join(lines)


def run(job: C.Run) -> dict:
    args = job.args
    import torch

    import cbo
    from cbo.evaluate import reference_logits
    from cbo.recovery.healing import check_heal_options, heal
    from cbo.surgery.depth import remove_blocks

    check_heal_options(args.steps, args.method, lr=args.lr, batch_size=args.batch_size)  # bad options: before work
    result: dict[str, Any] = {
        **job.header(),
        "settings": settings(args),
        "per_m": job.previous(settings(args)).get("per_m", {}),
        "wall_time_s": None,  # until it finishes
    }
    # one folder per settings, so a checkpoint is only ever resumed by the heal that wrote it
    tag = hashlib.sha256(json.dumps(settings(args), sort_keys=True).encode()).hexdigest()[:10]
    checkpoints = Path(args.checkpoints or DEFAULT_CHECKPOINTS) / tag
    model, tok, splits = D.load(args, n_calibration=args.n_train, n_validation=args.n_validation, n_test=args.n_test)
    refs = {s: reference_logits(model, getattr(splits, s)) for s in ("validation", "test")}
    result["original"] = measure(model, splits, refs)
    depth_options: dict[str, Any] = dict(seed=args.seed, progress=not args.no_progress)
    if args.estimator:
        depth_options["estimator"] = args.estimator
    if args.hessian_cache:
        depth_options["cache_dir"] = args.hessian_cache
    if args.quick:  # the pipeline on the heal's own tiny splits (no second pass over the text)
        depth_options["splits"] = splits
    elif args.pipeline_windows:
        cal, val, seq = args.pipeline_windows
        depth_options |= dict(n_calibration=cal, n_validation=val, seq_len=seq)
    for m in args.removes:
        key = str(m)
        block = result["per_m"].setdefault(key, {"rows": []})
        k = args.top if args.quick else max(10, args.top)  # the default pipeline ranks and validates 10
        t0 = time.perf_counter()
        report = cbo.prune_depth(model, tok, remove=m, top_k=k, validate=k, **depth_options)
        block["pipeline_seconds"] = time.perf_counter() - t0
        ordered = sorted(report.validation, key=lambda v: v.kl)[: args.top]
        block["pipeline"] = [v.to_json() for v in ordered]
        done = {r["rank"] for r in block["rows"]}
        for v in ordered:
            if v.rank in done:
                continue
            student = remove_blocks(model, v.removed)
            before = measure(student, splits, refs)
            torch.manual_seed(args.seed)
            healed = heal(
                student,
                model,
                splits.calibration,
                steps=args.steps,
                method=args.method,
                lr=args.lr,
                batch_size=args.batch_size,
                seed=args.seed,
                checkpoint_dir=checkpoints / f"m{m}-rank{v.rank}",
                resume=True,
                progress=not args.no_progress,
            )
            after = measure(healed.model, splits, refs)
            block["rows"].append(
                {
                    "rank": v.rank,
                    "removed": list(v.removed),
                    "energy": v.energy,
                    "validation_kl": v.kl,
                    "validation_ppl": v.ppl,
                    "before": before,
                    "after": after,
                    "heal_seconds": healed.seconds,
                    "first_loss": healed.losses[0] if healed.losses else None,
                    "last_loss": healed.losses[-1] if healed.losses else None,
                }
            )
            block["rows"].sort(key=lambda r: [x.rank for x in ordered].index(r["rank"]))
            job.save(result)
            print(f"M={m} rank {v.rank}: test PPL {before['test_ppl']:.2f} -> {after['test_ppl']:.2f}", flush=True)
        block["correlations"] = correlations(block["rows"])
        job.save(result)
    return result


if __name__ == "__main__":
    main()
