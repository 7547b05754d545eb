"""Gemma 3 270M (a second dense family, 18 blocks, 262k vocabulary, ``<bos>`` windows) pruned end to end by the
CLI: ``cbo prune gemma3-270m --remove 4`` with CBO's default method and with block influence (ShortGPT), then
both pruned folders and the original evaluated on the held-out novel (*Persuasion*, never used for a choice).

Every step runs as its own process under ``/usr/bin/time -v``, so each one's peak resident memory is its own;
a finished step is kept in ``OUT/steps/<step>.json`` and a rerun does only the steps that are missing.

    .venv/bin/python -m benchmarks.gemma                                    # 8 calibration, 8 validation windows
    .venv/bin/python -m benchmarks.gemma --n-calibration 32 --n-validation 32 --n-test 32
    .venv/bin/python -m benchmarks.gemma --report                           # rewrite the Markdown from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness as C

NAME = "gemma"
METHODS = {"cbo": "cbo", "block influence": "block_influence"}


def timed(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd`` under ``/usr/bin/time -v``: its stdout, wall time and peak resident memory."""
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    cpu = [re.search(rf"{k} time \(seconds\): ([\d.]+)", proc.stderr) for k in ("User", "System")]
    return {
        "stdout": proc.stdout,
        "wall_time_s": wall,
        "cpu_time_s": sum(float(m.group(1)) for m in cpu if m),
        "peak_rss_bytes": int(peak.group(1)) * 1024 if peak else None,
        "command": " ".join(cmd),
    }


def json_of(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{") :])


def prune_step(args: argparse.Namespace, method: str, folder: Path, env: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "cbo.cli", "prune", args.model, "--remove", str(args.remove), "--method", method]
    cmd += ["--n-calibration", str(args.n_calibration), "--n-validation", str(args.n_validation)]
    cmd += ["--seq-len", str(args.seq_len), "--seed", str(args.seed), "--out", str(folder), "--json", "-q"]
    run = timed(cmd, env)
    run.pop("stdout")
    return run | report_fields(folder)


def report_fields(folder: Path) -> dict:
    """What the benchmark keeps of the report.json `cbo prune --out` wrote beside the pruned model."""
    report = json.loads((folder / "report.json").read_text())
    return {
        "chosen_blocks": report["chosen"]["removed"],
        "chosen_names": report["chosen"]["removed_names"],
        "validation_original": report["original"],
        "validation_pruned": report["pruned"],
        "validation": report["validation"],
        "timings_s": report["timings_s"],
    }


def evaluate_main(args: argparse.Namespace) -> None:
    """The ``evaluate`` step (in its own process): held-out PPL, KL and agreement of the original and each folder."""
    C.setup_torch(args.threads)
    from cbo.data.windows import make_splits
    from cbo.evaluate import evaluate, reference_logits
    from cbo.model.loading import load_model
    from cbo.surgery.io import load_pruned

    model, tok = load_model(args.model, quiet=True)
    splits = make_splits(
        tok, seq_len=args.seq_len, n_calibration=args.n_calibration, n_validation=args.n_validation,
        n_test=args.n_test, seed=args.seed, model=model,
    )  # fmt: skip
    test = splits.test
    bos = getattr(tok, "bos_token_id", None)
    ref = reference_logits(model, test)
    rows = {"original": evaluate(model, test, ref)}
    del model
    for label, folder in zip(args.labels.split(","), args.folders.split(",")):
        pruned = load_pruned(folder)
        rows[label] = evaluate(pruned, test, ref) | {"layers": pruned.config.num_hidden_layers}
        del pruned
    out = {"test_windows": list(test.shape), "bos_first": bool(bos is not None and (test[:, 0] == bos).all())}
    print(json.dumps(out | {"rows": rows}, default=str))


def memory_main(args: argparse.Namespace) -> None:
    """The ``memory`` step (in its own process): the measurer on one batch of 8 windows of 128 tokens, the
    logits over chunks of positions (cbo.model.head) or, with ``--chunk-bytes`` huge, over every position at once."""
    import resource

    C.setup_torch(args.threads)
    import cbo.model.head
    from cbo.data.windows import make_splits
    from cbo.measure.measurer import Measurer
    from cbo.model.blocks import find_blocks
    from cbo.model.loading import load_model

    cbo.model.head.CHUNK_BYTES = args.chunk_bytes
    model, tok = load_model(args.model, quiet=True)
    windows = make_splits(tok, seq_len=128, n_calibration=0, n_validation=8, n_test=0, seed=args.seed).validation
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    measurer = Measurer(model, find_blocks(model), windows, batch_size=8, retain=False)
    out = measurer.losses([(7, 8, 9, 12)])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"kl": float(out.kl.mean()), "ce": float(out.ce.mean()), "rss_after_load": loaded, "rss": peak}))


def markdown(result: dict) -> str:
    steps = result["steps"]
    ev = steps.get("evaluate", {})
    rows = []
    for label in ["original", *METHODS]:
        metrics = (ev.get("rows") or {}).get(label, {})
        prune = steps.get(f"prune {label}", {})
        rows.append(
            [
                label,
                str(prune.get("chosen_blocks", "-")),
                metrics.get("ppl"),
                metrics.get("kl"),
                metrics.get("agreement"),
                metrics.get("n_params"),
                (prune.get("peak_rss_bytes") or 0) / 2**30 if prune else None,
                prune.get("wall_time_s"),
            ]
        )
    s = result["settings"]
    lines = [
        f"Gemma 3 270M, `cbo prune {s['model']} --remove {s['remove']}` ({s['n_calibration']} calibration and "
        f"{s['n_validation']} validation windows of {s['seq_len']} tokens, `<bos>` first: "
        f"{ev.get('bos_first')}); held-out test: {s['n_test']} windows of *Persuasion*.",
        "",
        C.md_table(
            ["model", "removed", "test PPL", "test KL", "agreement", "parameters", "prune peak RSS (GiB)", "prune s"],
            rows,
        ),
        "",
        f"Evaluation step peak RSS: {(ev.get('peak_rss_bytes') or 0) / 2**30:.2f} GiB "
        f"(the original's test log-probabilities held for the KL: {s['n_test']} x {s['seq_len']} x 262k float32).",
        f"Machine: {result['machine'].get('cpu')}, torch threads {result['machine'].get('torch_threads')}, "
        f"load average at start {result['machine'].get('load_average_at_start')}.",
        f"Command: `{result['command']}`",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--remove", type=int, default=4)
    p.add_argument("--n-calibration", type=int, default=8)
    p.add_argument("--n-validation", type=int, default=8)
    p.add_argument("--n-test", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads of every step")
    p.add_argument("--out", type=Path, default=C.REPO / "benchmarks" / "results" / NAME)
    p.add_argument(
        "--models",
        type=Path,
        default=C.OUT / NAME,
        help="where the pruned folders and the finished steps go (not committed; a rerun does only what is missing)",
    )
    p.add_argument("--step", default=None, help=argparse.SUPPRESS)
    p.add_argument("--chunk-bytes", type=int, default=128 * 2**20, help=argparse.SUPPRESS)
    p.add_argument("--labels", default="", help=argparse.SUPPRESS)
    p.add_argument("--folders", default="", help=argparse.SUPPRESS)
    C.add_report_arg(p, NAME)
    C.main(NAME, p, run, markdown, argv=argv, torch=False, show=True)
    return 0


def run(job: C.Run) -> dict | None:
    args = job.args
    if args.step == "evaluate":  # a child process: one step
        evaluate_main(args)
        return None
    if args.step == "memory":
        memory_main(args)
        return None
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(C.REPO))
    steps_dir = args.models / "steps"  # one JSON a finished step: the resume points
    models_dir = args.models
    settings = {k: getattr(args, k) for k in ("model", "remove", "n_calibration", "n_validation", "n_test")}
    settings |= {"seq_len": args.seq_len, "seed": args.seed, "threads": args.threads}
    # the steps ran in child processes: this process's CPU time says nothing
    result = {**job.header(), "settings": settings, "steps": {}, "cpu_time_s": None}
    folders = {label: models_dir / method for label, method in METHODS.items()}
    for label, method in METHODS.items():
        path = steps_dir / f"prune {label}.json"
        if path.exists() and (folders[label] / "report.json").exists():
            step = json.loads(path.read_text()) | report_fields(folders[label])
            result["steps"][f"prune {label}"] = step
            C.write_json(path, step)
            continue
        print(f"pruning with {label} ...", file=sys.stderr, flush=True)
        result["steps"][f"prune {label}"] = step = prune_step(args, method, folders[label], env)
        C.write_json(path, step)
        print(f"  removed {step['chosen_blocks']} in {step['wall_time_s']:.0f} s", file=sys.stderr, flush=True)
    path = steps_dir / "evaluate.json"
    if path.exists():
        result["steps"]["evaluate"] = json.loads(path.read_text())
    else:
        print("evaluating on the held-out text ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, "-m", "benchmarks.gemma", "--step", "evaluate", "--model", args.model]
        cmd += ["--n-calibration", str(args.n_calibration), "--n-validation", str(args.n_validation)]
        cmd += ["--n-test", str(args.n_test), "--seq-len", str(args.seq_len), "--seed", str(args.seed)]
        cmd += ["--threads", str(args.threads), "--labels", ",".join(folders)]
        cmd += ["--folders", ",".join(str(f) for f in folders.values())]
        run = timed(cmd, env)
        step = run | json_of(run.pop("stdout"))
        result["steps"]["evaluate"] = step
        C.write_json(path, step)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
