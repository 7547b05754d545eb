"""Cost of each Hessian estimator relative to one bare forward+backward pass over the same data.

Every case runs in its own process (so peak memory is the case's own): the model is loaded, a tiny warm-up
pass runs, then the case runs once (its peak memory is recorded), and then the reference and the case
alternate (``--repeats`` of each; the minimum of each is kept), so that both see the same machine load. The
reference is a plain training step over the same windows: ``model(x, labels=x).loss.backward()`` with
weight gradients. Peak memory is the peak resident set size (CPU) or ``torch.cuda.max_memory_allocated``
(GPU) above the loaded model.

``singles`` (the default) measures the N single-block removals per batch through shared prefixes; its passes
column is that work in full-forward equivalents. ``exact`` (N Hessian-vector products per batch) is measured
on 1 window (against a fwd+bwd on that window); ``pairwise`` (1 + N + N(N-1)/2 forward passes) is measured
with a subset of the blocks gated and its full cost predicted from the pass count, which is exact up to
timing noise (every pass is the same forward). These three are timed by their first run alone.

    .venv/bin/python -m benchmarks.hessian                    # default model, 8 x 128 tokens
    .venv/bin/python -m benchmarks.hessian --out benchmarks/out/hessian-two --only fwd+bwd,fisher
    .venv/bin/python -m benchmarks.hessian --quick            # 2 x 32 tokens, one repeat (the test suite's run)
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

from benchmarks import harness as C

CASES = {
    # name: (description, windows used, estimator or None, options)
    "forward": ("one forward pass, no gradients", "full", None, {}),
    "fwd+bwd": ("bare forward + backward with weight gradients (the reference)", "full", None, {}),
    "singles": ("singles, KL, measured removals (the default)", "full", "singles", {"loss": "kl"}),
    "fisher": ("fisher, KL, sampled labels", "full", "fisher", {"loss": "kl"}),
    "fisher-empirical": ("fisher, KL, true next tokens", "full", "fisher", {"loss": "kl", "labels": "empirical"}),
    "fisher-ce": ("fisher, CE, sampled labels + the CE gradient", "full", "fisher", {"loss": "ce"}),
    "fisher-4draws": ("fisher, KL, 4 label draws per batch", "full", "fisher", {"loss": "kl", "samples": 4}),
    "exact@1": ("exact, KL, all N gates, on 1 window", "one", "exact", {"loss": "kl"}),
    "pairwise@subset": ("pairwise, KL, a subset of the blocks gated", "full", "pairwise", {"loss": "kl"}),
}
PAIRWISE_SUBSET = 5
# cases of many passes, timed by their first run alone
EXPENSIVE = ("singles", "exact@1", "pairwise@subset")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_case(name: str, args: argparse.Namespace) -> dict:
    import torch

    from cbo.hessian import estimate_hessian
    from cbo.model.blocks import find_blocks
    from cbo.model.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
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
                reference(x)
            return None
        return estimate_hessian(
            model, tok, x, estimator=estimator, blocks=blocks, batch_size=args.batch_size, progress=False, **opts
        )

    def reference(x):  # one forward + backward of the plain loss over every batch
        for p in model.parameters():
            p.requires_grad_(True)
        for i in range(0, x.shape[0], args.batch_size):
            b = x[i : i + args.batch_size]
            model(input_ids=b, labels=b, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)

    def timed(fn, x):
        t = time.perf_counter()
        result = fn(x)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t, result

    once(windows[:1, :16])  # warm-up on a tiny input
    cuda = str(args.device).startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = _rss_mb()
    # the case runs first so that the peak memory is its own (that run also warms the allocator up); then
    # the reference (a bare fwd+bwd over the same windows, itself warmed up once) and the case alternate, so
    # that both see the same machine load. Expensive cases are timed by their first run.
    t, q = timed(once, data)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda else _peak_rss_mb()) - base
    expensive = name in EXPENSIVE
    times = [t] if expensive else []
    ref_times = [timed(reference, data)[0]]
    for _ in range(1 if expensive else args.repeats):
        if not expensive:
            times.append(timed(once, data)[0])
        ref_times.append(timed(reference, data)[0])
    out = {
        "case": name,
        "time_s": min(times),
        "times_s": times,
        "reference_s": min(ref_times),
        "reference_times_s": ref_times,
        "ratio": min(times) / min(ref_times),
        "peak_mb": peak,
        "tokens": int(data.numel()),
    }
    if q is not None:
        out["forward_passes"] = q.metadata["forward_passes"]
        out["backward_passes"] = q.metadata["backward_passes"]
        if "fpe" in q.metadata:  # measured removals share prefixes: their work in full passes
            out["forward_equivalents"] = q.metadata["fpe"]
    if name == "pairwise@subset":
        n_sub = len(blocks)
        out["passes_measured"] = 1 + n_sub + n_sub * (n_sub - 1) // 2
        out["passes_full"] = 1 + n_blocks + n_blocks * (n_blocks - 1) // 2
    out.update(extra, n_blocks=n_blocks)
    return out


def main(argv: list[str] | None = None) -> dict | None:
    ap = C.parser(__doc__, out="hessian", quick="tiny settings (the test suite's run, about a minute)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=None, help="windows (default 8; quick 2)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per window (default 128; quick 32)")
    ap.add_argument("--batch-size", type=int, default=None, help="windows per pass (default 8; quick 2)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats of cheap cases (default 2; quick 1)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--case", default="", help=argparse.SUPPRESS)
    full = {"n": 8, "seq_len": 128, "batch_size": 8, "repeats": 2}
    quick = {"n": 2, "seq_len": 32, "batch_size": 2, "repeats": 1}
    return C.main(
        "hessian", lambda a: C.parse_with_defaults(ap, a, full, quick), run, markdown, argv=argv, torch=False, show=True
    )


def run(job: C.Run) -> dict | None:
    args = job.args
    if args.case:  # a child process: one case, handed back to the parent
        C.print_result(run_case(args.case, args))
        return None
    names = [c for c in CASES if not args.only or c in args.only.split(",")]
    forwarded = [
        f"--{k.replace('_', '-')}={v}"
        for k, v in vars(args).items()
        if k not in ("case", "only", "out", "quick") and v is not None
    ]
    results = {}
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results[name] = C.run_in_process("hessian", "--case", name, *forwarded)
    result = job.header(
        torch_info=False,
        settings=vars(args),
        load_average_at_end=list(os.getloadavg()),
        wall_time_s=round(job.clock(), 1),
        cpu_time_s=None,  # the cases ran in child processes: this process's CPU time says nothing
        results=results,
    )
    return result


def markdown(result: dict) -> str:
    """The cost table (and the pairwise prediction) of a run."""
    s, results = result["settings"], result["results"]
    header = ["case", "what", "time s", "fwd+bwd s", "÷ fwd+bwd", "predicted full ÷ fwd+bwd", "peak MB", "passes f/b"]
    rows = []
    for name, r in results.items():
        ref = r["reference_s"]
        predicted = ""
        if name == "pairwise@subset":
            full = r["time_s"] * r["passes_full"] / r["passes_measured"]
            r["predicted_full_s"] = full
            r["predicted_full_ratio"] = full / ref
            predicted = f"{full / ref:.0f} ({full / 60:.1f} min)"
        passes = ""
        if "forward_equivalents" in r:  # prefix-shared removals: their work in full forward passes
            passes = f"≈{r['forward_equivalents']:.1f}/{r['backward_passes']}"
        elif "forward_passes" in r:
            passes = f"{r['forward_passes']}/{r['backward_passes']}"
        rows.append(
            [name, CASES[name][0], f"{r['time_s']:.2f}", f"{ref:.2f}", f"{r['ratio']:.2f}", predicted]
            + [f"{r['peak_mb']:.0f}", passes]
        )
    threads = s.get("threads") or os.environ.get("OMP_NUM_THREADS", "default")
    title = f"Hessian estimators on {s['model']}, {s['n']}x{s['seq_len']} tokens, {s['device']}"
    machine = (
        f"{C.machine_line(result['machine'])}; torch threads: {threads}; load average at the end: "
        f"{result['load_average_at_end'][0]:.1f}"
    )
    return "\n".join([*C.report_head(title, result, machine), C.md_table(header, rows)])


if __name__ == "__main__":
    main()
