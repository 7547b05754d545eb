"""Cost of each Hessian estimator relative to one bare forward+backward pass over the same data.

Every case runs in its own process (so peak memory is the case's own): the model is loaded, a tiny warm-up
pass runs, then the case is timed (best of ``--repeats``). The reference is a plain training step over the
same windows: ``model(x, labels=x).loss.backward()`` with weight gradients. Peak memory is the peak resident
set size (CPU) or ``torch.cuda.max_memory_allocated`` (GPU) above the loaded model.

``exact`` (N Hessian-vector products per batch) is measured on 1 window against a fwd+bwd over that same
window; ``pairwise`` (1 + N + N(N-1)/2 forward passes) is measured with a subset of the blocks gated and its
full cost predicted from the pass count, which is exact up to timing noise (every pass is the same forward).

    .venv/bin/python benchmarks/hessian.py                    # default model, 8 x 128 tokens
    .venv/bin/python benchmarks/hessian.py --json bench.json --only fwd+bwd,fisher
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

CASES = {
    # name: (description, windows used, estimator or None, options)
    "forward": ("one forward pass, no gradients", "full", None, {}),
    "fwd+bwd": ("bare forward + backward with weight gradients (the reference)", "full", None, {}),
    "fisher": ("fisher, KL, sampled labels (the default)", "full", "fisher", {"loss": "kl"}),
    "fisher-empirical": ("fisher, KL, true next tokens", "full", "fisher", {"loss": "kl", "labels": "empirical"}),
    "fisher-ce": ("fisher, CE, sampled labels + the CE gradient", "full", "fisher", {"loss": "ce"}),
    "fisher-4draws": ("fisher, KL, 4 label draws per batch", "full", "fisher", {"loss": "kl", "samples": 4}),
    "fwd+bwd@1": ("bare forward + backward on 1 window (reference for exact)", "one", None, {}),
    "exact@1": ("exact, KL, all N gates, on 1 window", "one", "exact", {"loss": "kl"}),
    "pairwise@subset": ("pairwise, KL, a subset of the blocks gated", "full", "pairwise", {"loss": "kl"}),
}
PAIRWISE_SUBSET = 5


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_case(name: str, args: argparse.Namespace) -> dict:
    import torch

    from cbo.blocks import find_blocks
    from cbo.hessian import estimate_hessian
    from cbo.models import load_model

    torch.manual_seed(0)
    model, tok = load_model(args.model, device=args.device)
    vocab = model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(0)
    windows = torch.randint(0, vocab, (args.n, args.seq_len), generator=gen).to(args.device)
    _, scope, estimator, opts = CASES[name]
    data = windows if scope == "full" else windows[:1]
    blocks = find_blocks(model, "layer")
    n_blocks = len(blocks)
    extra: dict = {}
    if name == "pairwise@subset":
        step = max(1, (n_blocks - 1) // (PAIRWISE_SUBSET - 1))
        chosen = sorted({min(n_blocks - 1, i * step) for i in range(PAIRWISE_SUBSET)})
        blocks = [blocks[i] for i in chosen]
        extra["gated_blocks"] = [b.name for b in blocks]

    def once(x, blocks=blocks):
        if estimator is None:
            if name == "forward":
                with torch.no_grad():
                    model(input_ids=x, use_cache=False)
            else:
                for p in model.parameters():
                    p.requires_grad_(True)
                for i in range(0, x.shape[0], args.batch_size):
                    b = x[i : i + args.batch_size]
                    model(input_ids=b, labels=b, use_cache=False).loss.backward()
                model.zero_grad(set_to_none=True)
            return None
        return estimate_hessian(
            model, tok, x, estimator=estimator, blocks=blocks, batch_size=args.batch_size, progress=False, **opts
        )

    once(windows[:1, :16])  # warm-up on a tiny input
    cuda = str(args.device).startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = _rss_mb()
    times = []
    q = None
    repeats = 1 if name in ("exact@1", "pairwise@subset") else args.repeats
    for _ in range(repeats):
        t = time.perf_counter()
        q = once(data)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda else _peak_rss_mb()) - base
    out = {"case": name, "time_s": min(times), "times_s": times, "peak_mb": peak, "tokens": int(data.numel())}
    if q is not None:
        out["forward_passes"] = q.metadata["forward_passes"]
        out["backward_passes"] = q.metadata["backward_passes"]
    if name == "pairwise@subset":
        n_sub = len(blocks)
        out["passes_measured"] = 1 + n_sub + n_sub * (n_sub - 1) // 2
        out["passes_full"] = 1 + n_blocks + n_blocks * (n_blocks - 1) // 2
    out.update(extra, n_blocks=n_blocks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=8, help="windows")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--case", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print("RESULT " + json.dumps(run_case(args.case, args)))
        return

    names = [c for c in CASES if not args.only or c in args.only.split(",")]
    results = {}
    for name in names:
        cmd = [sys.executable, __file__, "--case", name] + [
            f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("case", "only", "json")
        ]
        print(f"running {name} ...", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"case {name} failed")
        results[name] = json.loads(lines[-1][len("RESULT ") :])
    report(results, args)


def report(results: dict, args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    ref = results.get("fwd+bwd", {}).get("time_s")
    ref1 = results.get("fwd+bwd@1", {}).get("time_s")
    table = Table(title=f"Hessian estimators on {args.model}, {args.n}x{args.seq_len} tokens, {args.device}")
    for col in ("case", "what", "time s", "÷ fwd+bwd", "predicted full ÷ fwd+bwd", "peak MB", "passes f/b"):
        table.add_column(col, justify="left" if col in ("case", "what") else "right")
    for name, r in results.items():
        base = ref1 if name.endswith("@1") else ref
        ratio = r["time_s"] / base if base else None
        predicted = ""
        if name == "pairwise@subset" and ref:
            full = r["time_s"] * r["passes_full"] / r["passes_measured"]
            r["predicted_full_s"] = full
            r["predicted_full_ratio"] = full / ref
            predicted = f"{full / ref:.0f} ({full / 60:.1f} min)"
        if ratio is not None:
            r["ratio"] = ratio
        passes = f"{r['forward_passes']}/{r['backward_passes']}" if "forward_passes" in r else ""
        table.add_row(
            name,
            CASES[name][0],
            f"{r['time_s']:.2f}",
            "" if ratio is None else f"{ratio:.2f}",
            predicted,
            f"{r['peak_mb']:.0f}",
            passes,
        )
    Console(width=170).print(table)
    load = os.getloadavg()
    print(f"torch threads: {os.environ.get('OMP_NUM_THREADS', 'default')}; load average at the end: {load[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "load_average": load, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
