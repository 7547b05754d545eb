"""Depth-pruning quality on the default model and text: CBO against the depth baselines, on held-out text.

For each M (blocks removed) and each method, the removal set is chosen from the *calibration* split (Emma)
and measured on the *test* split (Persuasion): perplexity, KL to the unpruned model and next-token agreement.
CBO rows:

* ``cbo[EST] ground``: the ground state of the estimator's QUBO;
* ``cbo[EST] best-of-K``: the lowest *validation*-split KL (Mansfield Park) among the K lowest-energy states,
  the rule ``prune_depth`` uses; the test split is never used for a choice.

Sublayer rows (``granularity="sublayer"``) remove 2M attention/MLP halves with at most M of them attention,
so that they remove at least the parameters of M decoder layers (an MLP half holds 3x the parameters of an
attention half in SmolLM2); without that cap a sublayer method removes mostly cheap attention halves and the
comparison with layer removal is unfair. The parameter count of every row is reported.

Expensive results are cached: Hessians in the estimator cache (``CBO_HOME/cache/hessian``, shared with
``prune_depth``), baseline rankings, the solvers' ranked states (an inexact solve depends on the machine's speed)
and every measured (split, removal set) in ``OUT/cache``; a rerun only computes what is new and chooses as the
first run did.

    .venv/bin/python -m benchmarks.depth_quality                       # full run (see BENCHMARKS.md for its time)
    .venv/bin/python -m benchmarks.depth_quality --quick               # minutes; what the test suite runs
    .venv/bin/python -m benchmarks.depth_quality --estimators fisher,pairwise:windows=8:couplings=raw
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

DEFAULTS = {
    "remove": "4,8,12,15",
    "calibration": 32,
    "validation": 32,
    "test": 64,
    "seq_len": 128,
    "estimators": "singles,fisher",
    "sublayer_estimators": "fisher",
    "baselines": "block_influence,angular,sleb,taylor,ppl",
    "sublayer_baselines": "block_influence",
    "top_k": 10,
    "validate": 10,
    "sleb_windows": 8,
}
CHEAP = ("block_influence", "angular", "taylor")  # one pass (or one backward) over the calibration windows
QUICK = {
    "remove": "2,4",
    "calibration": 2,
    "validation": 2,
    "test": 2,
    "seq_len": 64,
    "estimators": "singles,fisher",
    "sublayer_estimators": "fisher",
    "baselines": "block_influence,angular,sleb,taylor,ppl",
    "sublayer_baselines": "block_influence",
    "top_k": 4,
    "validate": 4,
    "sleb_windows": 1,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = C.parser(__doc__, out="depth_quality", quick="tiny settings for the test suite (a few minutes)", model=True)
    D.add_split_args(p, DEFAULTS)
    p.add_argument(
        "--estimators",
        help="comma-separated estimator specs name[:key=value...] for layer CBO; keys windows/loss/batch_size/label "
        "set the run, others are estimator options (default: singles,fisher); 'registry' = every "
        "registered estimator",
    )
    p.add_argument("--estimator", action="append", default=[], help="one more layer estimator spec (repeatable)")
    p.add_argument("--sublayer-estimators", help="estimator specs for sublayer CBO ('' for none; default fisher)")
    p.add_argument("--baselines", help="comma-separated baselines (default: all of cbo.baselines)")
    p.add_argument("--sublayer-baselines", help="baselines also run at sublayer granularity (default block_influence)")
    p.add_argument("--top-k", type=int, help="low-energy states ranked per M (default 10)")
    p.add_argument("--validate", type=int, help="of those, how many are measured on the validation split (default 10)")
    p.add_argument("--sleb-windows", type=int, help="calibration windows SLEB measures with (default 8)")
    p.add_argument("--solver", default="auto", help="solver name (default: auto, exact where it can prove it)")
    p.add_argument("--no-plot", action="store_true")
    C.add_report_arg(p, "depth_quality")
    return C.parse_with_defaults(p, argv, DEFAULTS, QUICK)


# ------------------------------------------------------------------------------------------------ rankings
def ranking_for(method, model, windows, granularity, max_remove, caps, cache_dir: Path, fingerprint, progress):
    """A baseline ranking, from ``cache_dir`` when this exact run was done before."""
    from cbo.baselines import Ranking, rank_blocks
    from cbo.data.windows import data_hash

    key = hashlib.sha256(
        json.dumps([method, granularity, fingerprint, data_hash(windows), max_remove, caps]).encode()
    ).hexdigest()[:24]
    path = cache_dir / f"ranking-{method}-{granularity}-{key}.json"
    if path.exists():
        try:
            return Ranking.from_json(json.loads(path.read_text())), True
        except (ValueError, KeyError):
            path.unlink()
    ranking = rank_blocks(
        method, model, windows, granularity=granularity, max_remove=max_remove, caps=caps, progress=progress
    )
    C.write_json(path, ranking.to_json())
    return ranking, False


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> dict:
    return C.main("depth_quality", parse_args, run, markdown, plot, argv=argv)


def run(job: C.Run) -> dict:
    args, out = job.args, job.out
    progress = not args.no_progress
    Ms = [int(m) for m in C.split_list(args.remove)]

    from cbo.hessian import names as estimator_names
    from cbo.model.fingerprint import model_fingerprint

    layer_specs_text = C.split_list(args.estimators)
    if layer_specs_text == ["registry"]:
        layer_specs_text = estimator_names()
    layer_specs = [D.EstimatorSpec.parse(t) for t in layer_specs_text + list(args.estimator)]
    sub_specs = [D.EstimatorSpec.parse(t, granularity="sublayer") for t in C.split_list(args.sublayer_estimators)]

    model, tok, splits = D.load(args, n_calibration=args.calibration, n_validation=args.validation, n_test=args.test)
    measurer = D.MetricsCache(model, splits, out / "cache" / "measurements.json", batch_size=args.batch_size)
    fingerprint = measurer.fingerprint
    n_layers = len(measurer.blocks("layer"))
    print(f"model {args.model}: {n_layers} layers; splits {splits.info['windows']} x {args.seq_len} tokens", flush=True)

    result: dict[str, Any] = {
        **job.header(),
        "settings": {k: v for k, v in vars(args).items()},
        "data": splits.info,
        "model_fingerprint": model_fingerprint(model),
        "n_layers": n_layers,
        "original": {"test": measurer.original("test"), "validation": None},
        "rows": [],
        "setup": [],
        "cbo_validation": [],
    }
    rows = result["rows"]

    def add_row(method, label, granularity, M, removed, select_s, **extra):
        t0 = time.perf_counter()
        blocks = measurer.blocks(granularity)
        m = measurer.measure("test", granularity, removed)
        row = {
            "method": method,
            "label": label,
            "granularity": granularity,
            "remove": M,
            "removed": [int(i) for i in removed],
            "removed_names": [blocks[i].name for i in removed],
            "n_removed_params": int(sum(blocks[i].n_params for i in removed)),
            "test": m,
            "select_s": round(select_s, 3),
            "measure_s": round(time.perf_counter() - t0, 3),
            **extra,
        }
        rows.append(row)
        print(
            f"  M={M:>2} {label:<40} test PPL {C.fmt(m['ppl']):>8}  KL {C.fmt(m['kl']):>7}  "
            f"agree {C.fmt(m['agreement']):>6}  removed {row['removed']}",
            flush=True,
        )
        job.save(result)

    # ---------------------------------------------------------------- jobs
    rank_cache = out / "cache"
    calibration = splits.calibration

    def run_baseline(method: str, granularity: str) -> None:
        windows = calibration[: args.sleb_windows] if method == "sleb" else calibration
        factor = 1 if granularity == "layer" else 2
        caps = None if granularity == "layer" else {"attention": max(Ms)}
        label = method if granularity == "layer" else f"{method} (sublayer)"
        print(f"{label}: ranking on {windows.shape[0]} calibration windows", flush=True)
        t0 = time.perf_counter()
        if granularity == "sublayer" and method == "sleb":
            # SLEB's greedy caps hold at every step: one run per M with the cap of that M
            rankings = {
                M: ranking_for(
                    method, model, windows, granularity, factor * M, {"attention": M}, rank_cache, fingerprint, progress
                )
                for M in Ms
            }
        else:
            r, cached = ranking_for(
                method, model, windows, granularity, factor * max(Ms), caps, rank_cache, fingerprint, progress
            )
            rankings = {M: (r, cached) for M in Ms}
        wall = time.perf_counter() - t0
        first = next(iter(rankings.values()))[0]
        result["setup"].append(
            {
                "method": label,
                "granularity": granularity,
                "windows": int(windows.shape[0]),
                "passes": first.passes,
                "wall_s": round(sum({id(r): r.wall_time for r, _ in rankings.values()}.values()), 2),
                "cached": all(c for _, c in rankings.values()),
                "this_run_s": round(wall, 2),
            }
        )
        for M in Ms:
            ranking = rankings[M][0]
            cap = None if granularity == "layer" else {"attention": M}
            t1 = time.perf_counter()
            removed = ranking.select(factor * M, caps=cap)
            add_row(method, label, granularity, M, removed, ranking.wall_time + time.perf_counter() - t1)

    def run_cbo(spec: D.EstimatorSpec) -> None:
        granularity = spec.granularity
        factor = 1 if granularity == "layer" else 2
        tag = spec.tag() + (" sublayer" if granularity == "sublayer" else "")
        print(f"cbo[{tag}]: Hessian", flush=True)
        qubo, wall = D.estimate(spec, model, tok, calibration, args, progress)
        meta = qubo.metadata
        result["setup"].append(
            {
                "method": f"cbo[{tag}]",
                "granularity": granularity,
                "windows": int(meta.get("n_sequences", 0)),
                "passes": {"forward": meta.get("forward_passes"), "backward": meta.get("backward_passes")},
                "wall_s": meta.get("wall_time_s"),
                "cached": wall < 0.5 * float(meta.get("wall_time_s") or 0.0),
                "this_run_s": round(wall, 2),
                "spec": spec.to_json(),
            }
        )
        solver = args.solver
        for M in Ms:
            K = factor * M
            q = qubo if granularity == "layer" else qubo.with_constraints(caps={"attention": M})
            t0 = time.perf_counter()
            try:
                states = D.cached_solve(q, K, solver, k=args.top_k, seed=args.seed, cache_dir=rank_cache)
            except Exception as exc:  # keep a long run going; the row records the fallback
                print(f"  solver {solver!r} failed ({exc!r}); falling back to swap-tabu", flush=True)
                result.setdefault("solver_fallbacks", []).append({"estimator": tag, "remove": M, "error": repr(exc)})
                states = D.cached_solve(q, K, "swap-tabu", k=args.top_k, seed=args.seed, cache_dir=rank_cache)
            solve_s = time.perf_counter() - t0
            hessian_s = float(meta.get("wall_time_s") or wall)
            ground = list(states[0].removed)
            add_row(
                "cbo",
                f"cbo[{tag}] ground",
                granularity,
                M,
                ground,
                hessian_s + solve_s,
                estimator=spec.to_json(),
                rank=0,
                energy=states[0].energy,
                solver=states.solver,
                exact=states.exact,
            )
            if args.validate <= 0:
                continue
            t0 = time.perf_counter()
            validated = []
            for s in list(states)[: args.validate]:
                v = measurer.measure("validation", granularity, list(s.removed))
                validated.append({"rank": s.rank, "removed": list(s.removed), "energy": s.energy, "validation": v})
            best = min(validated, key=lambda v: (C.as_float(v["validation"]["kl"]), v["rank"]))
            val_s = time.perf_counter() - t0
            result["cbo_validation"].append(
                {"estimator": tag, "remove": M, "states": validated, "chosen": best["rank"]}
            )
            add_row(
                "cbo",
                f"cbo[{tag}] best-of-{len(validated)}",
                granularity,
                M,
                best["removed"],
                hessian_s + solve_s + val_s,
                estimator=spec.to_json(),
                rank=best["rank"],
                energy=best["energy"],
                validation=best["validation"],
                solver=states.solver,
                exact=states.exact,
            )

    # cheap methods first, so that an interrupted run already holds the comparison that matters most
    cheap = [m for m in C.split_list(args.baselines) if m in CHEAP]
    costly = [m for m in C.split_list(args.baselines) if m not in CHEAP]
    for method in cheap:
        run_baseline(method, "layer")
    for spec in layer_specs:
        run_cbo(spec)
    for method in costly:
        run_baseline(method, "layer")
    for method in C.split_list(args.sublayer_baselines):
        run_baseline(method, "sublayer")
    for spec in sub_specs:
        run_cbo(spec)

    result["original"]["validation"] = measurer.original("validation") if args.validate > 0 else None
    result["new_measurements"] = measurer.new_measurements
    return result


# ------------------------------------------------------------------------------------------------ reports
def _labels(result: dict) -> list[str]:
    """Row labels in display order: layer baselines, sublayer baselines, layer CBO, sublayer CBO."""
    seen: list[str] = []
    for r in result["rows"]:
        if r["label"] not in seen:
            seen.append(r["label"])
    order = {}
    for r in result["rows"]:
        order.setdefault(r["label"], (r["method"] == "cbo", r["granularity"] == "sublayer"))
    return sorted(seen, key=lambda label: (order[label], _baseline_rank(result, label), seen.index(label)))


def _baseline_rank(result: dict, label: str) -> int:
    names = C.split_list(result["settings"].get("baselines"))
    base = label.replace(" (sublayer)", "")
    return names.index(base) if base in names else len(names)


def markdown(result: dict) -> str:
    Ms = sorted({r["remove"] for r in result["rows"]})
    by = {(r["label"], r["remove"]): r for r in result["rows"]}
    orig = result["original"]["test"]
    n = result["n_layers"]
    s = result["settings"]
    lines = [
        "# Depth quality",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, torch threads "
        f"{result['machine']['torch_threads']}, load average at start {result['machine']['load_average_at_start']}  ",
        f"{C.timing_line(result)}  ",
        f"Data: calibration {s['calibration']}, validation {s['validation']}, test {s['test']} windows x "
        f"{s['seq_len']} tokens (test: {', '.join(result['data']['documents']['test'])}); unpruned test PPL "
        f"{C.fmt(orig['ppl'])}, {orig['n_params'] / 1e6:.1f}M parameters, {n} layers.",
        "",
        "## Test-split perplexity (lower is better)",
        "",
    ]
    header = ["method"] + [f"M={m}" for m in Ms]
    table = []
    for label in _labels(result):
        row = [label]
        for m in Ms:
            r = by.get((label, m))
            row.append("–" if r is None else C.fmt(r["test"]["ppl"]))
        table.append(row)
    lines += [C.md_table(header, table), ""]
    best_baseline = {}
    for m in Ms:
        cands = [r for r in result["rows"] if r["remove"] == m and r["method"] != "cbo" and r["granularity"] == "layer"]
        if cands:
            best_baseline[m] = min(cands, key=lambda r: C.as_float(r["test"]["ppl"]))
    if best_baseline:
        lines += [
            "Best layer baseline per M: "
            + ", ".join(f"M={m}: {r['label']} ({C.fmt(r['test']['ppl'])})" for m, r in best_baseline.items()),
            "",
        ]
    for m in Ms:
        lines += [f"## M = {m} ({m} of {n} layers, or {2 * m} sublayers with at most {m} attention halves)", ""]
        header = [
            "method",
            "test PPL",
            "test KL",
            "agreement",
            "params removed",
            "rank",
            "val KL",
            "select s",
            "removed",
        ]
        table = []
        for label in _labels(result):
            r = by.get((label, m))
            if r is None:
                continue
            val = r.get("validation") or {}
            table.append(
                [
                    label,
                    C.fmt(r["test"]["ppl"]),
                    C.fmt(r["test"]["kl"]),
                    C.fmt(r["test"]["agreement"], 3),
                    f"{r['n_removed_params'] / 1e6:.1f}M",
                    "–" if r.get("rank") is None else str(r["rank"]),
                    C.fmt(val.get("kl")),
                    C.fmt(r["select_s"], 3),
                    ",".join(x.replace("layers.", "") for x in r["removed_names"]),
                ]
            )
        lines += [C.md_table(header, table), ""]
    lines += ["## Cost of each method (once for all M)", ""]
    header = ["method", "calibration windows", "forward", "backward", "wall s (when computed)", "cached"]
    table = [
        [
            x["method"],
            str(x["windows"]),
            str((x.get("passes") or {}).get("forward")),
            str((x.get("passes") or {}).get("backward")),
            C.fmt(x["wall_s"]),
            "yes" if x["cached"] else "no",
        ]
        for x in result["setup"]
    ]
    lines += [C.md_table(header, table), ""]
    lines += [
        "Passes are batches of "
        f"{s['batch_size']} windows. `select s` = the method's one-off cost (Hessian or ranking) + solving + "
        "validating the top-K for that M. `rank` = energy rank of the chosen state; `val KL` = its KL on the "
        "validation split (the choice rule).",
        "",
    ]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = plt.get_cmap("tab20").colors
    for k, label in enumerate(_labels(result)):
        pts = sorted((r["remove"], C.as_float(r["test"]["ppl"])) for r in result["rows"] if r["label"] == label)
        pts = [(m, p) for m, p in pts if math.isfinite(p)]
        if not pts:
            continue
        style = "-o" if label.startswith("cbo") else "--s"
        ax.plot([m for m, _ in pts], [p for _, p in pts], style, label=label, markersize=4, color=colors[k % 20])
    ax.axhline(C.as_float(result["original"]["test"]["ppl"]), color="gray", lw=0.8, ls=":", label="unpruned")
    ax.set_yscale("log")
    ax.set_xticks(sorted({r["remove"] for r in result["rows"]}))
    ax.set_xlabel("M (layers removed; sublayer rows: 2M halves, ≤ M attention)")
    ax.set_ylabel("test perplexity (log scale)")
    ax.set_title(f"{result['settings']['model']}: held-out perplexity after removing M of {result['n_layers']} layers")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
