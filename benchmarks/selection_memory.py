"""Peak memory of `cbo prune` with and without the final selection, at two selection budgets.

More evidence must not mean more memory: the final selection (``prune_depth(select=N)``) measures its finalists
batch by batch against the original's distributions of that batch, and keeps per-window losses only. Each run
below is a process of its own (``prune_depth`` at the default sizes: 32 calibration and 32 validation windows of
128 tokens), and reports its peak resident set size (``VmHWM``): without selection, and with each budget of fresh
windows. The measured values (not the Hessian) are measured anew in every run, so each run does its own work.

    python -m benchmarks.selection_memory                                   # smollm2-135m, budgets 64 and 480
    python -m benchmarks.selection_memory --model gemma3-270m --remove 4    # the issue's case, if installed
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from benchmarks import harness as C

NAME = "selection_memory"


def peak_rss_bytes() -> int:
    """This process's peak resident set size (``VmHWM`` of /proc/self/status; ru_maxrss elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def child(args) -> None:
    """One prune in this process; hands back its peak RSS, the selection's work and the wall time."""
    from cbo.pipeline import prune_depth

    C.setup_torch(args.threads)
    cache = Path(args.cache)
    shutil.rmtree(cache / "measured", ignore_errors=True)  # the Hessian is cached, every measurement is new
    t0 = time.perf_counter()
    select = None if args.select == 0 else args.select
    report = prune_depth(
        args.model, remove=args.remove, refine=None, select=select, cache_dir=cache, progress=False, seed=args.seed,
        select_options={"criterion": args.criterion},
    )  # fmt: skip
    C.print_result(
        {
            "select": select,
            "peak_rss_bytes": peak_rss_bytes(),
            "wall_time_s": time.perf_counter() - t0,
            "chosen": report.chosen_blocks,
            "selection": report.work.get("selection"),
        }
    )


def markdown(result: dict) -> str:
    rows = []
    for r in result["runs"]:
        sel = r.get("selection") or {}
        rows.append(
            [
                "none" if r["select"] is None else r["select"],
                sel.get("windows", 0),
                C.fmt(sel.get("fpe", 0.0)),
                sel.get("stopped", "–"),
                f"{r['peak_rss_bytes'] / 2**30:.2f}",
                f"{r['wall_time_s']:.0f}",
                ",".join(map(str, r["chosen"])),
            ]
        )
    header = [
        "select (windows)",
        "windows measured",
        "selection FPE",
        "stopped",
        "peak RSS (GiB)",
        "wall (s)",
        "chosen",
    ]
    return (
        f"# Peak memory of the final selection: {result['model']}, remove {result['remove']}\n\n"
        + C.md_table(header, rows)
        + f"\n\n{result['machine']}\n"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = C.parser(__doc__, out=NAME, seed=0)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--remove", type=int, default=4)
    p.add_argument("--budgets", default="64,480", help="selection budgets in fresh windows, comma-separated")
    p.add_argument("--criterion", default="ce", choices=("ce", "kl"))
    p.add_argument("--select", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run(r: C.Run) -> dict | None:
    args = r.args
    if args.select is not None:  # one measured run in its own process
        child(args)
        return None
    forwarded = ["--model", args.model, "--remove", str(args.remove), "--seed", str(args.seed)]
    forwarded += ["--criterion", args.criterion, "--cache", str(r.out / "cache")]
    if args.threads:
        forwarded += ["--threads", str(args.threads)]
    runs = []
    for budget in [0] + [int(b) for b in C.split_list(args.budgets)]:
        measured = C.run_in_process(NAME, *forwarded, "--select", str(budget))
        print(json.dumps(measured), flush=True)
        runs.append(measured)
    return {"model": args.model, "remove": args.remove, "runs": runs, "machine": C.machine_line()}


def main(argv: list[str] | None = None) -> None:
    C.main(NAME, parse, run, markdown, argv=argv, torch=False, show=True)


if __name__ == "__main__":
    main()
