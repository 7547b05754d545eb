"""Width pruning on the default model (SmolLM2-135M): every score, AFR as published and its ablations, MoP.

For each parameter-reduction ratio (fraction of *all* parameters, embeddings included) it prunes the model
with magnitude, Taylor (absolute), AFR (the published recipe, then the earlier aggregation and each step
switched off in turn, see :data:`AFR_VARIANTS`), NTK (NIRVANA), AMP (uniform per layer, its default, and with
the global ranking), CBO depth + NTK width (one-shot), and the MoP scheduler without recovery (AMP width,
antepenultimate depth, KL criterion; MoP with recovery is ``benchmarks/mop_recovery.py``), then reports
held-out perplexity, KL to the original and next-token agreement on the test split, and measured prefill /
decode tokens/s (:func:`cbo.evaluate.throughput`); at the end a few models are re-timed round-robin so that
load on a shared machine hits them alike.

With ``--json``, the file also holds diagnostics of where two scores differ: each method's kept fraction of
heads and neurons per layer, the per-layer distribution of every score's unit importances (quantiles), and
the within-layer Spearman correlation of every score with Taylor; ``--plot`` draws the per-layer allocation.

Data (default Austen splits of :func:`cbo.data.windows.make_splits`): calibration 8 windows x 128 tokens (Emma),
control 4 x 128 (validation novel; MoP criterion), test 16 x 128 (Persuasion). Scores are computed once and
allocated for every ratio; the AFR variants share one set of calibration passes.

Usage:
    python -m benchmarks.width                  # default run (~30 CPU-minutes with 1 thread; measured on a shared box)
    python -m benchmarks.width --quick          # ~1 CPU-minute: ratio 0.1, tiny splits, fewer methods
    python -m benchmarks.width --methods taylor,afr,ntk,amp --no-speed --json out.json --plot alloc.png
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks import harness as C
from cbo.data.windows import make_splits
from cbo.evaluate import count_parameters, evaluate, reference_logits, throughput
from cbo.model.blocks import find_blocks
from cbo.model.loading import load_model
from cbo.pipeline.proposers import CBOProposer, depth_proposer
from cbo.surgery.depth import remove_blocks
from cbo.surgery.width import prune_width
from cbo.width.allocate import allocate
from cbo.width.mop import mixture_of_pruners
from cbo.width.scores import score_units, score_variants
from cbo.width.scores.afr import EARLIER_OPTIONS

METHODS = ("magnitude", "taylor", "afr", "ntk", "amp", "cbo-depth", "mop")
# the published AFR first (its options drive the shared calibration passes), then the ablations
AFR_VARIANTS = {
    "afr": {},
    "afr (earlier aggregation)": EARLIER_OPTIONS,
    "afr -power": {"power": False},
    "afr -clip": {"clip": False},
    "afr, gradient score only": {"companion": "none", "p": 0.5},
    "afr, scale-only standardization": {"standardize": "scale"},
}


def parse_args(argv=None):
    p = C.parser(__doc__, quick="ratio 0.1, tiny splits, fewer methods (< 2 min)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--ratios", type=float, nargs="+", default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--n-calibration", type=int, default=None)
    p.add_argument("--n-control", type=int, default=None)
    p.add_argument("--n-test", type=int, default=None)
    p.add_argument("--no-speed", action="store_true", help="skip the tokens/s measurements")
    p.add_argument("--no-mop", action="store_true")
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated subset of {','.join(METHODS)} (default: all)",
    )
    p.add_argument("--mop-cbo", action="store_true", help="also run MoP with CBO depth candidates (slower)")
    p.add_argument("--json", type=Path, default=None, help="write the rows and the diagnostics here")
    p.add_argument("--plot", type=Path, default=None, help="draw the per-layer allocation of each method here (PNG)")
    p.add_argument(
        "--speed-rounds",
        type=int,
        default=None,
        help="re-time a few models round-robin this many times at the end (median; default 3, quick 0)",
    )
    return p.parse_args(argv)


QUICK = dict(ratios=[0.1], seq_len=64, n_calibration=2, n_control=2, n_test=2, speed_rounds=0)
FULL = dict(ratios=[0.2, 0.4], seq_len=128, n_calibration=8, n_control=4, n_test=16, speed_rounds=3)
SPEED = {"quick": dict(prompt_len=16, new_tokens=4, repeats=1), "full": dict(prompt_len=128, new_tokens=16, repeats=2)}


def settings(args) -> dict:
    """The run's settings: the options given, the rest from the full or --quick ones."""
    base = dict(QUICK if args.quick else FULL, speed=SPEED["quick" if args.quick else "full"])
    for key in FULL:
        value = getattr(args, key)
        if value is not None:
            base[key] = value
    return base


def measure(
    name: str, ratio: float, model, p0: int, test, ref, speed, seconds: float, extra: dict | None = None
) -> dict:
    ev = evaluate(model, test, ref, batch_size=4)
    row = {
        "method": name,
        "ratio": ratio,
        "params": ev["n_params"],
        "removed": 1 - ev["n_params"] / p0,
        "ppl": ev["ppl"],
        "kl": ev["kl"],
        "agreement": ev["agreement"],
        "prune_s": seconds,
    }
    if speed is not None:
        t = throughput(model, **speed)
        row["prefill_tok_s"] = t["prefill_tokens_per_s"]
        row["decode_tok_s"] = t["decode_tokens_per_s"]
    row.update(extra or {})
    print(format_row(row), flush=True)
    return row


def format_row(r: dict) -> str:
    speed = ""
    if "prefill_tok_s" in r:
        speed = f" | {r['prefill_tok_s']:8.0f} | {r['decode_tok_s']:6.1f}"
    return (
        f"| {r['method']:<22} | {r['ratio']:.2f} | {r['removed']:6.1%} | {r['ppl']:8.2f} | {r['kl']:6.3f} | "
        f"{r['agreement']:.3f}{speed} | {r['prune_s']:6.1f} |"
    )


def header(speed: bool) -> str:
    cols = (
        ["method", "target", "removed", "PPL", "KL", "agree"]
        + (["prefill tok/s", "decode tok/s"] if speed else [])
        + ["prune s"]
    )
    return "| " + " | ".join(cols) + " |\n|" + "|".join("---" if c == "method" else "---:" for c in cols) + "|"


def main(argv=None) -> list[dict]:
    return C.main("width", parse_args, run, argv=argv)


def run(job: C.Run) -> list[dict]:
    args = job.args
    cfg = settings(args)
    speed = None if args.no_speed else cfg["speed"]
    t_all = time.perf_counter()
    model, tok = load_model(args.model)
    splits = make_splits(
        tok,
        None,
        seq_len=cfg["seq_len"],
        n_calibration=cfg["n_calibration"],
        n_validation=cfg["n_control"],
        n_test=cfg["n_test"],
    )
    calib, control, test = splits.calibration, splits.validation, splits.test
    print(
        f"model {args.model}, {count_parameters(model):,} parameters; calibration {tuple(calib.shape)}, control "
        f"{tuple(control.shape)}, test {tuple(test.shape)}; torch threads {torch.get_num_threads()}; {platform.processor() or platform.machine()}"
    )
    p0 = count_parameters(model)
    ref = reference_logits(model, test, batch_size=4)
    print(header(speed is not None))
    rows = [measure("original", 0.0, model, p0, test, ref, speed, 0.0)]
    kept = {("original", 0.0): model}  # models re-timed round-robin at the end
    keep = kept.__setitem__ if (speed and cfg["speed_rounds"]) else (lambda key, m: None)

    # scores: computed once, allocated for every ratio; (label, scores, allocation, seconds)
    scored: list[tuple[str, object, str | None, float]] = []
    methods = {m.strip() for m in args.methods.split(",") if m.strip()}
    unknown = methods - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    for name in ("magnitude", "taylor", "afr", "ntk", "amp"):
        if name not in methods:
            continue
        t0 = time.perf_counter()
        if name == "afr" and not args.quick:
            variants = score_variants(model, calib, "afr", list(AFR_VARIANTS.values()))
            for label, s in zip(AFR_VARIANTS, variants):
                scored.append((label, s, None, (time.perf_counter() - t0) / len(AFR_VARIANTS)))
            continue
        if args.quick and name == "taylor":
            continue
        s = score_units(model, calib if name != "magnitude" else None, name)
        t = time.perf_counter() - t0
        if name == "amp":  # AMP's default is uniform; its global ranking shows why
            scored.append(("amp (uniform)", s, "uniform", t))
            scored.append(("amp (global)", s, "global", t))
        else:
            scored.append((name, s, None, t))

    for ratio in cfg["ratios"]:
        for label, s, allocation, t_score in scored:
            t0 = time.perf_counter()
            alloc = allocate(s, ratio=ratio, allocation=allocation)
            pruned = prune_width(model, alloc.plan)
            rows.append(
                measure(
                    label,
                    ratio,
                    pruned,
                    p0,
                    test,
                    ref,
                    speed,
                    t_score + time.perf_counter() - t0,
                    {"allocation": alloc.allocation, "kept": kept_fractions(s, alloc)},
                )
            )
            if label in ("ntk", "amp (uniform)"):
                keep((label, ratio), pruned)
            del pruned
        if not args.quick and "cbo-depth" in methods:
            # one-shot depth + width: half the budget in whole layers chosen by the CBO QUBO, the rest by NTK
            t0 = time.perf_counter()
            per_layer = find_blocks(model, "layer")[0].n_params
            n_layers = int(round(0.5 * ratio * p0 / per_layer))
            layers = CBOProposer(solver="enumerate").layers(model, calib, n_layers)
            pruned = remove_blocks(model, layers)
            ntk = score_units(pruned, calib, "ntk")
            alloc = allocate(
                ntk, remove_params=int(round(ratio * p0)) - (p0 - count_parameters(pruned)), total_params=p0
            )
            pruned = prune_width(pruned, alloc.plan, inplace=True)
            rows.append(
                measure(
                    "cbo depth + ntk", ratio, pruned, p0, test, ref, speed, time.perf_counter() - t0, {"layers": layers}
                )
            )
            keep(("cbo depth + ntk", ratio), pruned)
            del pruned
        mop_runs = (
            [] if (args.no_mop or "mop" not in methods) else ["antepenultimate"] + (["cbo"] if args.mop_cbo else [])
        )
        for depth in mop_runs:
            t0 = time.perf_counter()
            result = mixture_of_pruners(
                model,
                calib,
                control,
                ratio=ratio,
                criterion="kl",
                depth_proposer=depth_proposer(depth),
                width_score="amp",
            )
            label = "mop (amp, kl)" if depth == "antepenultimate" else "mop (amp, kl, cbo depth)"
            extra = {"path": result.path_string()}
            rows.append(measure(label, ratio, result.model, p0, test, ref, speed, time.perf_counter() - t0, extra))
            print(f"    {label} path at {ratio:.2f}: {result.path_string()}", flush=True)
            keep((label, ratio), result.model)
    interleaved = retime(kept, speed, cfg["speed_rounds"]) if speed and cfg["speed_rounds"] and len(kept) > 1 else []
    print(f"total {time.perf_counter() - t_all:.0f} s")
    diagnostics = score_diagnostics(scored)
    print_diagnostics(diagnostics)
    if args.json:
        out = {
            "settings": cfg,
            "data": splits.info,
            "rows": rows,
            "speed_interleaved": interleaved,
            "diagnostics": diagnostics,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
    if args.plot:
        plot_allocation(rows, args.plot)
    return rows


# ------------------------------------------------------------------------------------------ diagnostics


def kept_fractions(scores, alloc) -> dict[str, float]:
    """Fraction of the units kept per ``"layer.kind"``."""
    return {f"{k[0]}.{k[1]}": alloc.kept[k] / scores.units[k].n for k in scores.keys()}


def score_diagnostics(scored: list) -> dict:
    """Per score: the quantiles of its unit importances in every layer, and its within-layer Spearman
    correlation with Taylor (where Taylor was scored)."""
    from cbo.stats import spearman

    qs = (0.05, 0.25, 0.5, 0.75, 0.95)
    taylor = next((s for label, s, _, _ in scored if label == "taylor"), None)
    out: dict = {}
    seen = set()
    for label, s, _, _ in scored:
        if id(s) in seen:
            continue  # AMP's two allocations share one set of scores
        seen.add(id(s))
        per_layer = {}
        for key in s.keys():
            v = s.values[key].detach().double().cpu()
            entry = {"quantiles": [float(x) for x in torch.quantile(v, torch.tensor(qs, dtype=v.dtype))]}
            entry["negative_fraction"] = float((v < 0).double().mean())
            if taylor is not None and label != "taylor" and v.numel() > 2:
                entry["spearman_vs_taylor"] = spearman(v.tolist(), taylor.values[key].double().cpu().tolist())
            per_layer[f"{key[0]}.{key[1]}"] = entry
        out[label] = {"quantiles_at": list(qs), "layers": per_layer}
        if s.info.get("p"):
            ps = list(s.info["p"].values())
            out[label]["p"] = {"min": min(ps), "median": statistics.median(ps), "max": max(ps)}
    return out


def print_diagnostics(diagnostics: dict) -> None:
    """Median within-layer Spearman correlation with Taylor, per score and kind."""
    lines = []
    for label, d in diagnostics.items():
        parts = []
        for kind in ("attention", "mlp"):
            rho = [
                e["spearman_vs_taylor"]
                for k, e in d["layers"].items()
                if k.endswith(kind) and "spearman_vs_taylor" in e
            ]
            if rho:
                parts.append(f"{kind} {statistics.median(rho):+.2f}")
        if parts:
            p = f"; p median {d['p']['median']:.3f}" if "p" in d else ""
            lines.append(f"  {label:<34} within-layer Spearman vs Taylor (median over layers): {', '.join(parts)}{p}")
    if lines:
        print("\nscore diagnostics\n" + "\n".join(lines))


def plot_allocation(rows: list[dict], path: Path) -> None:
    """Kept fraction of MLP neurons and attention units per layer, one panel per (ratio, kind), one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = sorted({r["ratio"] for r in rows if "kept" in r})
    fig, axes = plt.subplots(len(ratios), 2, figsize=(12, 3.2 * len(ratios)), squeeze=False, layout="constrained")
    for i, ratio in enumerate(ratios):
        for j, kind in enumerate(("mlp", "attention")):
            ax = axes[i][j]
            for r in rows:
                if r["ratio"] != ratio or "kept" not in r:
                    continue
                pts = sorted((int(k.split(".")[0]), v) for k, v in r["kept"].items() if k.endswith(kind))
                ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"{r['method']} (PPL {r['ppl']:.3g})"
                )
            ax.set_title(f"{ratio:.0%} of the parameters removed: {kind} kept per layer")
            ax.set_xlabel("layer")
            ax.set_ylim(-0.02, 1.02)
            ax.legend(fontsize=6)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"allocation plot: {path}")


def retime(kept: dict, speed: dict, rounds: int) -> list[dict]:
    """Time the kept models round-robin ``rounds`` times (load on a shared machine hits all alike); medians."""
    samples: dict = {key: [] for key in kept}
    for _ in range(rounds):
        for key, m in kept.items():
            t = throughput(m, **dict(speed, repeats=1))
            samples[key].append((t["prefill_tokens_per_s"], t["decode_tokens_per_s"]))
    base = samples[("original", 0.0)]
    b_pre = statistics.median(x[0] for x in base)
    b_dec = statistics.median(x[1] for x in base)
    print(
        f"\ninterleaved timing, median of {rounds} rounds (prompt {speed['prompt_len']}, {speed['new_tokens']} new tokens)"
    )
    print("| method | target | params | prefill tok/s | x | decode tok/s | x |\n|---|---:|---:|---:|---:|---:|---:|")
    out = []
    for (label, ratio), values in samples.items():
        pre = statistics.median(x[0] for x in values)
        dec = statistics.median(x[1] for x in values)
        n = count_parameters(kept[(label, ratio)])
        print(f"| {label} | {ratio:.2f} | {n:,} | {pre:.0f} | {pre / b_pre:.2f} | {dec:.1f} | {dec / b_dec:.2f} |")
        out.append({"method": label, "ratio": ratio, "params": n, "prefill_tok_s": pre, "decode_tok_s": dec})
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
