"""MoP with its recovery steps, with both depth proposers, against one-shot width pruning at the same budget.

MoP (``cbo.width.mop.mixture_of_pruners``, AMP width, KL criterion) runs with a short recovery fine-tune of
every candidate between moves (``--recovery-steps``) and a final recovery (``--final-steps``), with the paper's
depth proposer (the antepenultimate layer) and with CBO's (the ground state of the current model's QUBO). Its
recovery budget is counted in optimizer steps (every candidate's, the discarded ones included, plus the final
ones), and one-shot Taylor and AMP at the same ratio get a single recovery of exactly that many steps, so the
comparison is fair; rows without any recovery are printed beside them. Recovery is MoP's own (next-token loss,
LoRA, :func:`cbo.recovery.finetune.recover`) everywhere.

Data as in ``benchmarks/width.py``: calibration 8 x 128 tokens (Emma; scores and recovery), control 4 x 128
(Mansfield Park; MoP's criterion), test 16 x 128 (Persuasion; reported only). Each finished row is written to
``OUT/mop_recovery.json`` at once, and a rerun with the same settings skips it.

Usage:
    python -m benchmarks.mop_recovery --threads 1                        # 20 % and 40 %, both proposers
    python -m benchmarks.mop_recovery --ratios 0.2 --proposers antepenultimate --recovery-steps 2 --final-steps 8
    python -m benchmarks.mop_recovery --quick --out benchmarks/out/mq            # a minute or two: 10 %, tiny splits
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

from benchmarks import depth_harness as D
from benchmarks import harness as C

NAME = "mop_recovery"
DEFAULT_OUT = C.REPO / "benchmarks" / "results" / "mop_recovery"
PROPOSERS = ("antepenultimate", "cbo")
FULL = dict(ratios=[0.2, 0.4], recovery_steps=2, final_steps=8, seq_len=128, n_calibration=8, n_control=4, n_test=16)
QUICK = dict(ratios=[0.1], recovery_steps=1, final_steps=1, seq_len=32, n_calibration=4, n_control=2, n_test=2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = C.parser(__doc__, out=DEFAULT_OUT, quick="ratio 0.1, one recovery step, tiny splits", seed=0)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--ratios", type=float, nargs="+", default=None, help="fractions of all parameters removed")
    p.add_argument("--proposers", default=",".join(PROPOSERS), help=f"comma-separated subset of {PROPOSERS}")
    p.add_argument("--recovery-steps", type=int, default=None, help="steps per MoP candidate (default 2)")
    p.add_argument("--final-steps", type=int, default=None, help="MoP's final recovery steps (default 8)")
    p.add_argument("--method", default="lora", choices=["lora", "full"])
    p.add_argument("--lr", type=float, default=1e-4, help="recovery learning rate (MoP's default 1e-4)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--n-calibration", type=int, default=None)
    p.add_argument("--n-control", type=int, default=None)
    p.add_argument("--n-test", type=int, default=None)
    C.add_report_arg(p, NAME)
    args = C.parse_with_defaults(p, argv, FULL, QUICK)
    args.proposers = C.split_list(args.proposers)
    bad = sorted(set(args.proposers) - set(PROPOSERS))
    if bad:
        p.error(f"unknown proposers {bad}; choose from {list(PROPOSERS)}")
    if args.recovery_steps < 0 or args.final_steps < 0:
        p.error("--recovery-steps and --final-steps must be >= 0")
    return args


def main(argv: list[str] | None = None) -> dict:
    return C.main(NAME, parse_args, run, markdown, argv=argv, show=True)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("model", "quick", "recovery_steps", "final_steps", "method", "lr", "batch_size", "seq_len")
    return {k: getattr(args, k) for k in (*keys, "n_calibration", "n_control", "n_test", "seed")}


def mop_budget(result: Any, recovery_steps: int, final_steps: int) -> int:
    """Optimizer steps a MoP run spent on recovery: every candidate it built, plus the final recovery."""
    built = sum((s.depth_layer is not None and not s.final) + (s.width_params > 0) for s in result.path)
    return built * recovery_steps + final_steps


def markdown(result: dict) -> str:
    s = result["settings"]
    title = "MoP with recovery vs one-shot width pruning at the same recovery budget"
    setup = (
        f"Recovery: {s['method']}, next-token loss, lr {s['lr']}, {s['batch_size']} x {s['seq_len']}-token windows"
        f" per step; MoP: {s['recovery_steps']} steps per candidate + {s['final_steps']} final. Test PPL of the"
        f" original {C.fmt(result.get('original', {}).get('ppl'))}."
    )
    header = ["ratio", "method", "recovery steps", "removed", "test PPL", "test KL", "agreement", "path", "seconds"]
    rows = [
        [r["ratio"], r["method"], r["recovery_steps"], r["removed"], r["ppl"], r["kl"], r["agreement"],
         r.get("path") or "–", r["seconds"]]
        for r in result["rows"]
    ]  # fmt: skip
    return "\n".join([*C.report_head(title, result), setup, "", C.md_table(header, rows), ""])


def run(job: C.Run) -> dict:
    args = job.args
    from cbo.evaluate import evaluate, reference_logits
    from cbo.pipeline.proposers import depth_proposer
    from cbo.recovery.finetune import recover
    from cbo.recovery.healing import check_heal_options
    from cbo.width.mop import check_mop_options, mixture_of_pruners
    from cbo.width.prune import width_prune

    check_mop_options("kl", args.method)
    check_heal_options(max(args.recovery_steps, 1), args.method, lr=args.lr, batch_size=args.batch_size)
    result: dict[str, Any] = {
        **job.header(),
        "settings": settings(args),
        "rows": job.previous(settings(args)).get("rows", []),
        "wall_time_s": None,  # until it finishes
    }
    model, tok, splits = D.load(args, n_calibration=args.n_calibration, n_validation=args.n_control, n_test=args.n_test)
    calib, control, test = splits.calibration, splits.validation, splits.test
    ref = reference_logits(model, test, batch_size=4)
    original = evaluate(model, test, ref, batch_size=4)
    result["original"] = {"ppl": original["ppl"], "params": original["n_params"]}
    p0 = original["n_params"]

    recovery_options = {
        "recovery_steps": args.recovery_steps,
        "final_recovery_steps": args.final_steps,
        "recovery": args.method,
        "recovery_lr": args.lr,
        "batch_size": args.batch_size,
        "seed": args.seed,
    }

    def has_row(ratio: float, label: str) -> bool:
        return any((r["ratio"], r["method"]) == (ratio, label) for r in result["rows"])

    def row(ratio: float, method: str, pruned: Any, steps: int, seconds: float, **extra: Any) -> None:
        ev = evaluate(pruned, test, ref, batch_size=4)
        entry = {"ratio": ratio, "method": method, "recovery_steps": steps, "removed": 1 - ev["n_params"] / p0,
                 "ppl": ev["ppl"], "kl": ev["kl"], "agreement": ev["agreement"], "seconds": seconds, **extra}  # fmt: skip
        result["rows"].append(entry)
        job.save(result)
        print(f"{ratio:.0%} {method}: {steps} recovery steps, test PPL {ev['ppl']:.2f}", flush=True)

    for ratio in args.ratios:
        budget = None
        for proposer in args.proposers:
            label = f"MoP ({proposer} depth, AMP width, KL) + recovery"
            previous_row = next((r for r in result["rows"] if (r["ratio"], r["method"]) == (ratio, label)), None)
            if previous_row is not None:
                budget = budget or previous_row["recovery_steps"]
                continue
            t0 = time.perf_counter()
            proposer_fn = depth_proposer(proposer, seed=args.seed)
            mop = mixture_of_pruners(
                model, calib, control, ratio=ratio, criterion="kl", depth_proposer=proposer_fn, **recovery_options
            )
            steps = mop_budget(mop, args.recovery_steps, args.final_steps)
            budget = budget or steps
            row(ratio, label, mop.model, steps, time.perf_counter() - t0, path=mop.path_string())
        # one-shot at MoP's budget (the first proposer's, when the two differ), and without recovery
        steps = budget if budget is not None else args.final_steps
        for score in ("taylor", "amp"):
            labels = [(f"one-shot {score}", 0), (f"one-shot {score} + recovery", steps)]
            todo = [(label, n) for label, n in labels if not has_row(ratio, label)]
            if not todo:
                continue
            t0 = time.perf_counter()
            pruned, _ = width_prune(model, calib, ratio=ratio, score=score, batch_size=args.batch_size)
            seconds = time.perf_counter() - t0
            for label, n in todo:
                t1 = time.perf_counter()
                healed = pruned
                if n:  # a copy: the unrecovered model is the other row
                    healed = recover(copy.deepcopy(pruned), calib, steps=n, lr=args.lr, method=args.method,
                                     batch_size=args.batch_size, seed=args.seed)  # fmt: skip
                row(ratio, label, healed, n, seconds + time.perf_counter() - t1)
    return result


if __name__ == "__main__":
    main()
