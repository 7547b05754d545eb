"""Speed of pruned models: prefill and decode tokens/s and peak memory, original vs depth-, width- and
combined-pruned, on the CPU (or the GPU when one is present).

Variants (built from the default model, saved, then each measured in a fresh process so that its peak memory is
its own):

* ``original``;
* ``depth``: M decoder layers removed (default M = 8 of 30, the blocks chosen by block influence on a few
  calibration windows; speed does not depend on *which* layers go, all layers have the same shape);
* ``width``: about ``--width-ratio`` of the parameters removed by width pruning (heads and MLP neurons,
  ``cbo.width.width_prune`` with the data-free magnitude score; speed depends on the shapes, not the score);
* ``combined``: the depth model, then width pruning of the same parameter count as ``width``.

Reported: median prefill and decode throughput over ``--repeats`` runs after a warm-up
(:func:`cbo.evaluate.throughput`, greedy decoding with the KV cache), the measured speed-up over the original,
and for depth the ideal ``N / (N − M)`` (the layers' share only; embeddings and the LM head do not shrink).

    .venv/bin/python -m benchmarks.speed                    # CPU, or the GPU when present
    .venv/bin/python -m benchmarks.speed --quick            # seconds; the test suite's run
    .venv/bin/python -m benchmarks.speed --device cuda --batch-sizes 1,16
"""

from __future__ import annotations

import argparse
import os
import resource
from pathlib import Path
from typing import Any

from benchmarks import depth_harness as D
from benchmarks import harness as C

VARIANTS = ("original", "depth", "width", "combined")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = C.parser(__doc__, out="speed", out_help="results; pruned models in OUT/models", quick="short runs", model=True)
    p.add_argument("--remove", type=int, default=8, help="layers removed for depth (default 8)")
    p.add_argument("--width-ratio", type=float, default=0.25, help="fraction of parameters width pruning removes")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 128; quick 16)")
    p.add_argument("--new-tokens", type=int, default=None, help="decoded tokens (default 64; quick 4)")
    p.add_argument("--batch-sizes", default=None, help="comma-separated batch sizes (default 1,8; quick 1)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per setting, median reported (default 5)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="which variants to measure")
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # internal: measure one saved model
    quick = {"prompt_len": 16, "new_tokens": 4, "batch_sizes": "1", "repeats": 1, "seq_len": 32}
    full = {"prompt_len": 128, "new_tokens": 64, "batch_sizes": "1,8", "repeats": 5, "seq_len": 128}
    return C.parse_with_defaults(p, argv, full, quick)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Unlike ``getrusage``'s ``ru_maxrss``, it starts afresh at exec,
    so it does not inherit the peak of the parent that built the pruned models."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_one(args: argparse.Namespace) -> dict:
    """In a fresh process: load one saved model and time it."""
    import torch

    from cbo.evaluate import count_parameters, throughput
    from cbo.model.loading import load_model

    C.setup_torch(args.threads)
    device = D.device_of(args)
    before = _rss_mb()
    model, _ = load_model(args.measure, device=device)
    loaded = _rss_mb()
    out: dict[str, Any] = {
        "n_params": count_parameters(model),
        "n_layers": int(model.config.num_hidden_layers),
        "param_mb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20,
        "rss_after_load_mb": loaded,
        "rss_model_mb": loaded - before,
        "runs": [],
    }
    for bs in [int(b) for b in C.split_list(args.batch_sizes)]:
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        r = throughput(
            model, prompt_len=args.prompt_len, new_tokens=args.new_tokens, batch_size=bs, repeats=args.repeats
        )
        r["peak_memory_mb"] = r.pop("peak_memory_bytes") / 2**20
        out["runs"].append(r)
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def build_variants(args: argparse.Namespace, folder: Path) -> dict[str, dict]:
    """Prune and save every variant; returns {variant: {"path", "removed_layers", ...}}."""
    from cbo.baselines import select_blocks
    from cbo.evaluate import count_parameters
    from cbo.model.loading import resolve_model
    from cbo.surgery.depth import remove_blocks
    from cbo.surgery.io import save_pruned
    from cbo.width import width_prune

    wanted = C.split_list(args.variants)
    model, tok, splits = D.load(args, n_calibration=4, n_validation=0, n_test=0)
    total = count_parameters(model)
    n_layers = int(model.config.num_hidden_layers)
    info: dict[str, dict] = {"original": {"path": resolve_model(args.model), "n_layers": n_layers}}
    removed = []
    if {"depth", "combined"} & set(wanted):
        removed = select_blocks("block_influence", model, splits, args.remove)
    if "depth" in wanted or "combined" in wanted:
        depth = remove_blocks(model, removed)
        if "depth" in wanted:
            info["depth"] = {"path": str(save_pruned(depth, folder / "depth", tok)), "removed_layers": removed}
    budget = int(round(args.width_ratio * total))
    if "width" in wanted:
        width, alloc = width_prune(model, splits.calibration, remove_params=budget, score="magnitude")
        info["width"] = {
            "path": str(save_pruned(width, folder / "width", tok)),
            "removed_params": total - count_parameters(width),
        }
        del width
    if "combined" in wanted:
        both, _ = width_prune(depth, splits.calibration, remove_params=budget, score="magnitude", total_params=total)
        info["combined"] = {
            "path": str(save_pruned(both, folder / "combined", tok)),
            "removed_layers": removed,
            "removed_params": total - count_parameters(both),
        }
    return {k: v for k, v in info.items() if k in wanted}


def main(argv: list[str] | None = None) -> dict | None:
    return C.main("speed", parse_args, run, markdown, argv=argv, show=True)


def run(job: C.Run) -> dict | None:
    args, out = job.args, job.out
    if args.measure:  # a child process: one variant, handed back to the parent
        C.print_result(measure_one(args))
        return None
    print("building the pruned variants", flush=True)
    variants = build_variants(args, out / "models")
    result: dict[str, Any] = {
        **job.header(),
        "device": D.device_of(args),
        "settings": dict(vars(args)),
        "variants": {},
    }
    for name, info in variants.items():
        cmd = ["--measure", info["path"], "--batch-sizes", args.batch_sizes]
        cmd += [
            "--prompt-len",
            str(args.prompt_len),
            "--new-tokens",
            str(args.new_tokens),
            "--repeats",
            str(args.repeats),
        ]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        if args.device:
            cmd += ["--device", args.device]
        print(f"measuring {name}", flush=True)
        result["variants"][name] = {**info, **C.run_in_process("speed", *cmd)}
        job.save(result)
    n = variants.get("original", {}).get("n_layers")
    result["ideal_depth_speedup"] = n / (n - args.remove) if n else None
    return result


def markdown(result: dict) -> str:
    m = result["machine"]
    s = result["settings"]
    base = result["variants"].get("original")
    lines = [
        "# Speed of pruned models",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {m['cpu']}, {m['cores']} cores, device {result['device']}"
        + (f" ({m['gpu']})" if m.get("gpu") else "")
        + f", torch threads {m['torch_threads']}, load average at start {m['load_average_at_start']}  ",
        f"Wall time: {result['wall_time_s']:.0f} s. Prompt {s['prompt_len']} random tokens, {s['new_tokens']} "
        f"greedy tokens with the KV cache; median of {s['repeats']} runs after a warm-up.",
        "",
    ]
    header = [
        "variant",
        "params",
        "layers",
        "batch",
        "prefill tok/s",
        "decode tok/s",
        "prefill speed-up",
        "decode speed-up",
        "peak memory MB",
    ]
    rows = []
    for name, v in result["variants"].items():
        for k, run in enumerate(v["runs"]):
            ref = base["runs"][k] if base else None
            rows.append(
                [
                    name,
                    f"{v['n_params'] / 1e6:.1f}M",
                    str(v["n_layers"]),
                    str(run["batch_size"]),
                    C.fmt(run["prefill_tokens_per_s"]),
                    C.fmt(run["decode_tokens_per_s"]),
                    C.fmt(run["prefill_tokens_per_s"] / ref["prefill_tokens_per_s"], 3) if ref else "–",
                    C.fmt(run["decode_tokens_per_s"] / ref["decode_tokens_per_s"], 3) if ref else "–",
                    C.fmt(v["peak_rss_mb"] if result["device"] == "cpu" else run["peak_memory_mb"]),
                ]
            )
    lines += [C.md_table(header, rows), ""]
    if result.get("ideal_depth_speedup"):
        lines += [
            f"Ideal depth speed-up N/(N−M) = {result['ideal_depth_speedup']:.3f} (the layers only; the embeddings "
            "and the LM head are not pruned). Peak memory: the measuring process's peak resident set on the CPU "
            "(model + activations + Python), `torch.cuda.max_memory_allocated` on a GPU.",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
