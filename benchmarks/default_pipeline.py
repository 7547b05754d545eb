"""The default pipeline (``prune_depth`` with every default) at M = 8 and 15, its choice measured on the test windows
of ``fidelity.py`` (64 x 256 tokens of *Persuasion* for M = 8, the first 32 for M = 15), so that its test PPL sits
beside the baselines' in BENCHMARKS.md. The test split is only measured, never used to choose.

    .venv/bin/python -m benchmarks.default_pipeline             # about 13 minutes on one CPU thread
    .venv/bin/python -m benchmarks.default_pipeline --quick     # M = 2 on a few short windows (the test suite's)

Writes ``default_pipeline.json`` and ``.md`` to ``--out``; the measured test sets are cached in
``OUT/measured`` (a rerun measures only what is new).
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks import harness as C

# (M, test windows measured) and the prune_depth settings: the defaults, or the quick run's
FULL = {"points": ((8, 64), (15, 32)), "test_seq_len": 256, "prune": {}}
QUICK = {
    "points": ((2, 2),),
    "test_seq_len": 32,
    "prune": {"n_calibration": 2, "n_validation": 2, "seq_len": 32, "top_k": 3, "validate": 3},
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = C.parser(__doc__, out="default_pipeline", quick="M = 2 on a few short windows (seconds to minutes)")
    p.add_argument("--model", default="smollm2-135m", help="model name or folder (default: the default model)")
    p.set_defaults(threads=1)
    return C.main("default_pipeline", p, run, markdown, argv=argv)


def run(job: C.Run) -> dict[str, Any]:
    args, out = job.args, job.out
    settings = QUICK if args.quick else FULL

    from cbo import prune_depth
    from cbo.data.windows import make_splits
    from cbo.measure.measurer import MeasureCache, Measurer
    from cbo.model.blocks import find_blocks
    from cbo.model.loading import load_model

    model, tok = load_model(args.model)
    blocks = find_blocks(model, "layer")
    n_test = max(n for _, n in settings["points"])
    test = make_splits(
        tok, seq_len=settings["test_seq_len"], n_calibration=0, n_validation=0, n_test=n_test, seed=0
    ).test
    measurer = Measurer(
        model, blocks, test, batch_size=8, cache=MeasureCache(out / "measured", model, blocks), retain=False
    )
    result: dict[str, Any] = job.header(quick=bool(args.quick), points={})
    for m, windows in settings["points"]:
        t = C.Stopwatch()
        r = prune_depth(model, tok, remove=m, progress=False, **settings["prune"])
        res = measurer.losses([r.chosen_blocks], windows=windows)
        nll = float(res.ce[0].mean())
        result["points"][str(m)] = {
            "estimator": r.estimator,
            "chosen": r.chosen_blocks,
            "rank": r.chosen_rank,
            "test_windows": windows,
            "test_ppl": math.exp(nll),
            "test_kl": float(res.kl[0].mean()),
            "val_kl": r.pruned_metrics.get("kl"),
            "seconds": t(),
            "options": {k: r.options["search"].get(k) for k in ("top_k", "validate")},
            "data": r.data_info.get("windows"),
        }
        print(m, result["points"][str(m)], flush=True)
        job.save(result)
    return result


def markdown(result: dict[str, Any]) -> str:
    rows = [
        [m, r["estimator"], str(r["chosen"]), r["rank"], r["test_windows"], r["test_ppl"], r["test_kl"], r["val_kl"]]
        for m, r in result["points"].items()
    ]
    header = ["M", "estimator", "removed", "rank", "test windows", "test PPL", "test KL", "validation KL"]
    return "\n".join([*C.report_head("The default pipeline", result), C.md_table(header, rows)])


if __name__ == "__main__":
    main()
