"""The final choice among near-ties at the pipeline's own sizes: the default's choice (the lowest validation KL
among the validated states) against the final selection's race on fresh validation windows
(``prune_depth(select=N)``), judged on test windows that no choice reads.

Each point (M, seed) runs ``prune_depth`` twice on the same splits and cache, so the estimate and the validation are
shared and the race's fresh windows are its only extra cost. Both chosen sets are then measured, window by window,
on the test windows: the pipeline's own test split (*Persuasion*) and the Python docs (``cbo.data.domains``, when
installed). The PPL ratio race/default carries a paired bootstrap 95 % interval over the test windows; below 1
means the race chose better.

Full settings: 32 calibration and 32 validation windows of 128 tokens (the pipeline's), a race of 480 fresh windows,
64 test windows per domain, M = 8, 12 and 15. ``--quick``: a tiny run for the test suite.
"""

from __future__ import annotations

import json
import math
from typing import Any

from benchmarks import depth_harness as D
from benchmarks import harness as C

NAME = "final_choice"
FULL = {
    "remove": "8,12,15",
    "seq_len": 128,
    "calibration": 32,
    "validation": 32,
    "test": 64,
    "select": 480,
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
    return C.parse_with_defaults(p, argv, FULL, QUICK)


def test_sets(args: Any, tokenizer: Any, splits: Any, model: Any) -> dict[str, Any]:
    """The test windows by domain: the pipeline's test split and, when installed, the second domain."""
    from cbo.data.domains import domain_installed, load_test_domain

    out = {"austen": splits.test}
    if domain_installed(DOMAIN):
        out[DOMAIN] = load_test_domain(
            DOMAIN, tokenizer, n=args.test, seq_len=args.seq_len, seed=args.seed, model=model
        )
    else:
        print(f"test domain {DOMAIN} not installed (cbo setup): measured on the novels only", flush=True)
    return out


def point(args: Any, model: Any, tokenizer: Any, splits: Any, remove: int, seed: int) -> dict[str, Any]:
    """One (M, seed): both choices, their cost and their per-window test NLL on every domain."""
    from cbo.measure.measurer import Measurer
    from cbo.model.blocks import find_blocks
    from cbo.pipeline import prune_depth
    from cbo.stats import paired_ppl_ratio

    common = dict(
        remove=remove, splits=splits, seed=seed, cache_dir=C.out_dir(args) / "cache", progress=False,
        batch_size=args.batch_size,
    )  # fmt: skip
    default = prune_depth(model, tokenizer, **common)
    raced = prune_depth(model, tokenizer, select=args.select, select_options={"criterion": args.criterion}, **common)
    blocks = find_blocks(model, "layer")
    sets = [sorted(default.chosen_blocks), sorted(raced.chosen_blocks)]
    row: dict[str, Any] = {
        "remove": remove,
        "seed": seed,
        "default": sets[0],
        "raced": sets[1],
        "selection": raced.selection,
        "fpe": {"default": default.work["total_fpe"], "raced": raced.work["total_fpe"]},
        "test": {},
    }
    for domain, windows in test_sets(args, tokenizer, splits, model).items():
        losses = Measurer(model, blocks, windows, batch_size=args.batch_size, retain=False).losses(sets)
        ce = losses.ce
        ratio, low, high = paired_ppl_ratio(ce[1], ce[0], seed=seed)
        row["test"][domain] = {
            "windows": int(ce.shape[1]),
            "default_ppl": math.exp(float(ce[0].mean())),
            "raced_ppl": math.exp(float(ce[1].mean())),
            "ratio": [ratio, low, high],
        }
    print(json.dumps(row), flush=True)
    return row


def run(r: C.Run) -> dict[str, Any]:
    args = r.args
    model, tokenizer, splits = D.load(
        args, n_calibration=args.calibration, n_validation=args.validation, n_test=args.test
    )
    rows = [
        point(args, model, tokenizer, splits, int(m), int(s))
        for m in C.split_list(args.remove)
        for s in C.split_list(args.seeds)
    ]
    return r.header(rows=rows, select=args.select, criterion=args.criterion, seq_len=args.seq_len)


def markdown(result: dict[str, Any]) -> str:
    header = ["M", "seed", "domain", "default PPL", "race PPL", "ratio [95 % CI]", "race set = default set", "FPE"]
    rows = []
    for row in result["rows"]:
        for domain, t in row["test"].items():
            ratio, low, high = t["ratio"]
            rows.append(
                [
                    row["remove"],
                    row["seed"],
                    domain,
                    f"{t['default_ppl']:.1f}",
                    f"{t['raced_ppl']:.1f}",
                    f"{ratio:.3f} [{low:.3f}, {high:.3f}]",
                    "yes" if row["default"] == row["raced"] else "no",
                    f"{row['fpe']['default']:.0f} → {row['fpe']['raced']:.0f}",
                ]
            )
    return f"# The final choice: default vs the race (select={result['select']})\n\n" + C.md_table(header, rows)


def main(argv: list[str] | None = None) -> Any:
    return C.main(NAME, parse, run, markdown, argv=argv, show=True)


if __name__ == "__main__":
    main()
