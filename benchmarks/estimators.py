"""Energy fidelity of the Hessian estimators: does a lower energy mean a better pruned model?

For each estimator spec, loss and M, the QUBO's energy is compared with the *measured* KL to the unpruned model
(and the measured increase of next-token NLL) on the validation split, over

* ``--random`` uniformly random removal sets of size M (the same sets for every estimator), and
* the ``--low`` lowest-energy sets of that estimator's QUBO (``cbo.solve(..., k=low)``).

Reported per (estimator, loss, M): Spearman and Kendall correlation of energy vs measured KL over all those
sets, over the random ones and over the low-energy ones; where in the energy ranking the best measured
low-energy set sits (the "excited state" effect); the measured KL of the ground state, of the best of the
low-energy sets and of the best random set. And the cost of each estimator (passes, wall time).

Estimators come from the registry (``cbo.hessian.names()``) or ``--estimators``, so new variants are measured
without code changes. Specs: ``name[:key=value...]`` with ``windows`` (calibration windows), ``loss`` (overrides
``--losses`` for that spec), ``batch_size``, ``label``; other keys are estimator options.

    .venv/bin/python -m benchmarks.estimators                   # default run (see BENCHMARKS.md for its time)
    .venv/bin/python -m benchmarks.estimators --quick           # the test suite's run
    .venv/bin/python -m benchmarks.estimators --estimators fisher,pairwise:windows=8:couplings=raw --losses kl
    .venv/bin/python -m benchmarks.estimators --estimators paper --losses ce --calibration-sizes 32,256,2048

``--calibration-sizes`` gives the ``paper`` estimator one row per size: its QUBOs come from the nested run of
``benchmarks/paper_sizes.py`` (a shuffled pool of calibration windows, the first n of them), read from
``--paper-out`` when that run already wrote them. Spearman's ρ over all sets carries a bootstrap interval over the
measured sets (``--bootstrap`` resamples).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import depth_harness as D
from benchmarks import harness as C

# calibration windows of the costly built-in estimators when the spec does not say (exact: N double-backward
# passes per batch; pairwise: 1 + N + N(N-1)/2 forward passes per batch)
DEFAULT_WINDOWS = {"exact": 4, "pairwise": 8}
DEFAULTS = dict(
    remove="4,8,15",
    calibration=32,
    validation=32,
    seq_len=128,
    estimators="registry",
    losses="kl,ce",
    random=200,
    low=50,
    measure_windows=4,
)
QUICK = DEFAULTS | dict(  # the test suite's run: the same, smaller
    remove="2,4", calibration=2, validation=2, seq_len=64, estimators="fisher", random=6, low=4, measure_windows=1
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = C.parser(__doc__, out="estimators", quick="tiny settings for the test suite", model=True)
    D.add_split_args(p, DEFAULTS)  # a spec without windows= uses DEFAULT_WINDOWS of the costly estimators
    p.add_argument("--measure-windows", type=int, help="validation windows each set is measured on (default 4)")
    p.add_argument("--estimators", help="comma-separated specs, or 'registry' for every registered estimator")
    p.add_argument("--estimator", action="append", default=[], help="one more spec (repeatable)")
    p.add_argument("--losses", help="comma-separated losses for specs without loss= (default kl,ce)")
    p.add_argument("--random", type=int, help="random removal sets per M (default 200)")
    p.add_argument("--low", type=int, help="lowest-energy sets per estimator, loss and M (default 50)")
    p.add_argument("--solver", default="auto", help="solver for the low-energy sets (default: auto)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--calibration-sizes", help="comma-separated calibration sizes of the paper estimator's rows")
    p.add_argument("--paper-out", default=None, help="folder of the nested paper QUBOs (benchmarks/paper_sizes.py)")
    p.add_argument("--paper-pool", type=int, default=2048, help="windows in the paper estimator's shuffled pool")
    p.add_argument("--paper-wait", action="store_true", help="wait for a running paper_sizes.py to write each size")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of the sets for ρ's interval")
    C.add_report_arg(p, "estimators")
    return C.parse_with_defaults(p, argv, DEFAULTS, QUICK)


def specs_from(args: argparse.Namespace) -> list[D.EstimatorSpec]:
    from cbo.hessian import get
    from cbo.hessian import names as registered

    texts = C.split_list(args.estimators)
    if texts == ["registry"]:
        texts = registered()
    texts += list(args.estimator)
    specs = []
    for text in texts:
        explicit_loss = ":loss=" in text
        for loss in [None] if explicit_loss else C.split_list(args.losses):
            spec = D.EstimatorSpec.parse(text, loss=loss or "kl")
            if spec.windows is None and spec.name in DEFAULT_WINDOWS:
                spec.windows = min(DEFAULT_WINDOWS[spec.name], args.calibration)
            if spec.loss not in get(spec.name).losses:
                continue
            if spec.name == "paper" and args.calibration_sizes:
                for size in C.split_list(args.calibration_sizes):
                    specs.append(dataclasses.replace(spec, windows=int(size), label=f"paper:n={int(size)}"))
                continue
            specs.append(spec)
    return specs


def paper_estimate(spec: D.EstimatorSpec, model: Any, tok: Any, args: argparse.Namespace, progress: bool) -> Any:
    """The paper estimator's QUBO on the first ``spec.windows`` windows of the shuffled calibration pool."""
    from benchmarks import paper_sizes

    pool, info = paper_sizes.calibration_pool(tok, args.seq_len, args.paper_pool, args.seed)
    out = Path(args.paper_out) if args.paper_out else paper_sizes.OUT
    if args.paper_wait:
        paper_sizes.wait_for(out, [int(spec.windows)])
    qubos = paper_sizes.paper_qubos(
        model,
        tok,
        pool,
        [int(spec.windows)],
        out,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=progress,
        pool_info=info,
    )
    return qubos[int(spec.windows)]


def spearman_interval(energies: list[float], kls: list[float], resamples: int, seed: int) -> list[float]:
    """95 % bootstrap interval of Spearman's ρ over the measured sets (resampled with replacement)."""
    from cbo.stats import spearman

    e, k = np.asarray(energies, float), np.asarray(kls, float)
    ok = np.isfinite(e) & np.isfinite(k)
    e, k = e[ok], k[ok]
    if len(e) < 3 or resamples < 1:
        return [math.nan, math.nan]
    rng = np.random.default_rng([seed, len(e), 23])
    values = []
    for _ in range(resamples):
        idx = rng.integers(0, len(e), len(e))
        if np.ptp(e[idx]) > 0 and np.ptp(k[idx]) > 0:
            values.append(spearman(e[idx], k[idx]))
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if values else [math.nan] * 2


def random_sets(n: int, M: int, count: int, seed: int) -> list[tuple[int, ...]]:
    """``count`` distinct uniformly random M-subsets of range(n) (fewer when fewer exist)."""
    rng = np.random.default_rng([seed, M])
    total = math.comb(n, M)
    out: dict[tuple[int, ...], None] = {}
    while len(out) < min(count, total):
        out[tuple(sorted(int(i) for i in rng.choice(n, M, replace=False)))] = None
    return list(out)


def fidelity(energies: list[float], kls: list[float]) -> dict[str, float]:
    from cbo.stats import kendall, spearman

    e, k = np.asarray(energies, float), np.asarray(kls, float)
    ok = np.isfinite(e) & np.isfinite(k)
    if ok.sum() < 3 or np.ptp(e[ok]) == 0 or np.ptp(k[ok]) == 0:
        return {"spearman": math.nan, "kendall": math.nan, "n": int(ok.sum())}
    return {"spearman": spearman(e[ok], k[ok]), "kendall": kendall(e[ok], k[ok]), "n": int(ok.sum())}


def main(argv: list[str] | None = None) -> dict:
    return C.main("estimators", parse_args, run, markdown, plot, argv=argv)


def run(job: C.Run) -> dict:
    args, out = job.args, job.out
    specs = specs_from(args)
    Ms = [int(m) for m in C.split_list(args.remove)]
    progress = not args.no_progress

    from cbo.solvers import solve

    model, tok, splits = D.load(args, n_calibration=args.calibration, n_validation=args.validation, n_test=0)
    measurer = D.MetricsCache(model, splits, out / "cache" / "measurements.json", batch_size=args.batch_size)
    n = len(measurer.blocks("layer"))
    mw = args.measure_windows
    original = measurer.original("validation", mw)
    print(f"{len(specs)} estimator runs, M = {Ms}, {args.random} random + {args.low} low-energy sets each", flush=True)

    def measured(removed) -> dict:
        m = measurer.measure("validation", "layer", list(removed), mw)
        return {"kl": C.as_float(m["kl"]), "dnll": C.as_float(m["nll"]) - original["nll"]}

    result: dict[str, Any] = {
        **job.header(),
        "settings": dict(vars(args)),
        "data": splits.info,
        "n_blocks": n,
        "original_validation": original,
        "costs": [],
        "fidelity": [],
        "sets": {},
    }
    # random sets first: shared by every estimator
    randoms = {}
    for M in Ms:
        randoms[M] = random_sets(n, M, args.random, args.seed)
        t0 = time.perf_counter()
        result["sets"][str(M)] = {"random": [[list(s), measured(s)] for s in randoms[M]]}
        print(f"M={M}: {len(randoms[M])} random sets measured in {time.perf_counter() - t0:.0f} s", flush=True)
        job.save(result)

    for spec in specs:
        print(f"{spec.tag(with_loss=False)} ({spec.loss}): Hessian", flush=True)
        if spec.name == "paper" and args.calibration_sizes:
            t0 = time.perf_counter()
            qubo = paper_estimate(spec, model, tok, args, progress)
            wall = time.perf_counter() - t0
        else:
            qubo, wall = D.estimate(spec, model, tok, splits.calibration, args, progress)
        meta = qubo.metadata
        result["costs"].append(
            {
                "estimator": spec.tag(with_loss=False),
                "loss": spec.loss,
                "windows": meta.get("n_sequences"),
                "tokens": meta.get("n_tokens"),
                "forward": meta.get("forward_passes"),
                "backward": meta.get("backward_passes"),
                "wall_s": meta.get("wall_time_s"),
                "cached": wall < 0.5 * float(meta.get("wall_time_s") or 0.0),
            }
        )
        solver = args.solver
        for M in Ms:
            t0 = time.perf_counter()
            states = solve(qubo, M, solver, k=args.low, seed=args.seed)
            low = [tuple(s.removed) for s in states]
            low_m = [measured(s) for s in low]
            rand = randoms[M]
            rand_m = [measured(s) for s in rand]
            e_low = [float(s.energy) for s in states]
            e_rand = [float(qubo.energy(_onehot(n, s))) for s in rand]
            all_sets = {s: (e, m) for s, e, m in zip(rand + low, e_rand + e_low, rand_m + low_m)}
            e_all = [v[0] for v in all_sets.values()]
            k_all = [v[1]["kl"] for v in all_sets.values()]
            d_all = [v[1]["dnll"] for v in all_sets.values()]
            low_kl = [m["kl"] for m in low_m]
            best_low = int(np.nanargmin(low_kl))
            order = sorted(all_sets, key=lambda s: all_sets[s][0])
            best_all = min(all_sets, key=lambda s: all_sets[s][1]["kl"])
            row = {
                "estimator": spec.tag(with_loss=False),
                "loss": spec.loss,
                "remove": M,
                "n_sets": len(all_sets),
                "all": fidelity(e_all, k_all),
                "all_spearman_95": spearman_interval(e_all, k_all, args.bootstrap, args.seed + M),
                "all_dnll": fidelity(e_all, d_all),
                "random": fidelity(e_rand, [m["kl"] for m in rand_m]),
                "low": fidelity(e_low, low_kl),
                "best_low_rank": best_low,
                "best_overall_energy_rank": order.index(best_all),
                "best_overall_is_random_only": best_all not in set(low),
                "ground_kl": low_kl[0],
                "best_low_kl": low_kl[best_low],
                "best_random_kl": float(np.nanmin([m["kl"] for m in rand_m])),
                "ground_energy": e_low[0],
                "ground": list(low[0]),
                "best_low": list(low[best_low]),
                "solver": states.solver,
                "exact": states.exact,
                "seconds": round(time.perf_counter() - t0, 2),
            }
            result["fidelity"].append(row)
            result["sets"][str(M)].setdefault("low", {})[f"{spec.tag(with_loss=False)}|{spec.loss}"] = [
                [list(s), e, m] for s, e, m in zip(low, e_low, low_m)
            ]
            result["sets"][str(M)].setdefault("random_energy", {})[f"{spec.tag(with_loss=False)}|{spec.loss}"] = e_rand
            print(
                f"  M={M:>2} {spec.tag(with_loss=False):<28} {spec.loss}: spearman all {C.fmt(row['all']['spearman'], 3)}  random "
                f"{C.fmt(row['random']['spearman'], 3)}  low {C.fmt(row['low']['spearman'], 3)}  best low-energy set "
                f"at rank {best_low} (KL {C.fmt(row['best_low_kl'])} vs ground {C.fmt(row['ground_kl'])})",
                flush=True,
            )
            job.save(result)

    result["new_measurements"] = measurer.new_measurements
    return result


def _onehot(n: int, removed) -> np.ndarray:
    x = np.zeros(n, dtype=np.int8)
    x[list(removed)] = 1
    return x


def markdown(result: dict) -> str:
    s = result["settings"]
    m = result["machine"]
    lines = [
        "# Estimator fidelity: energy vs measured KL",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch threads {m['torch_threads']}, load average at start "
        f"{m['load_average_at_start']}  ",
        f"{C.timing_line(result)}  ",
        f"Sets per M: {s['random']} random + the {s['low']} lowest-energy of each estimator; each measured on "
        f"{s['measure_windows']} validation windows x {s['seq_len']} tokens "
        f"({', '.join(result['data']['documents']['validation'])}).",
        "",
        "ρ = Spearman (with its 95 % bootstrap interval over the sets), τ = Kendall between energy and measured KL "
        "(higher = the energy orders sets like the model does). `best@` = energy rank (0 = ground) of the best measured set among the low-energy ones. KL columns: "
        "measured KL of the ground state, of the best low-energy set, and of the best random set.",
        "",
    ]
    header = [
        "estimator",
        "loss",
        "M",
        "ρ all",
        "τ all",
        "ρ random",
        "ρ low",
        "ρ all vs ΔNLL",
        "best@",
        "KL ground",
        "KL best low",
        "KL best random",
    ]
    rows = []
    for r in result["fidelity"]:
        rows.append(
            [
                r["estimator"],
                r["loss"],
                str(r["remove"]),
                C.fmt(r["all"]["spearman"], 3) + interval(r.get("all_spearman_95")),
                C.fmt(r["all"]["kendall"], 3),
                C.fmt(r["random"]["spearman"], 3),
                C.fmt(r["low"]["spearman"], 3),
                C.fmt(r["all_dnll"]["spearman"], 3),
                str(r["best_low_rank"]),
                C.fmt(r["ground_kl"]),
                C.fmt(r["best_low_kl"]),
                C.fmt(r["best_random_kl"]),
            ]
        )
    lines += [C.md_table(header, rows), "", "## Cost of each estimator", ""]
    header = ["estimator", "loss", "calibration windows", "forward", "backward", "wall s (when computed)"]
    rows = [
        [c["estimator"], c["loss"], str(c["windows"]), str(c["forward"]), str(c["backward"]), C.fmt(c["wall_s"])]
        for c in result["costs"]
    ]
    lines += [C.md_table(header, rows), ""]
    lines += [
        f"Passes are batches of {s['batch_size']} windows of {s['seq_len']} tokens.",
        "",
    ]
    return "\n".join(lines)


def interval(bounds: list[float] | None) -> str:
    """`` [lo, hi]`` for a table cell, or nothing when no interval was computed."""
    if not bounds or not all(math.isfinite(float(b)) for b in bounds):
        return ""
    return f" [{float(bounds[0]):.2f}, {float(bounds[1]):.2f}]"


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    keys = [(r["estimator"], r["loss"]) for r in result["fidelity"]]
    keys = list(dict.fromkeys(keys))
    Ms = sorted({r["remove"] for r in result["fidelity"]})
    if not keys or not Ms:
        return
    fig, axes = plt.subplots(len(keys), len(Ms), figsize=(3.2 * len(Ms), 2.6 * len(keys)), squeeze=False)
    for i, (est, loss) in enumerate(keys):
        tag = f"{est}|{loss}"
        for j, M in enumerate(Ms):
            ax = axes[i][j]
            sets = result["sets"][str(M)]
            e_rand = sets.get("random_energy", {}).get(tag, [])
            k_rand = [m["kl"] for _, m in sets["random"]]
            low = sets.get("low", {}).get(tag, [])
            ax.scatter(e_rand, k_rand, s=6, alpha=0.5, label="random")
            ax.scatter([e for _, e, _ in low], [m["kl"] for _, _, m in low], s=8, color="C3", label="low-energy")
            ax.set_yscale("log")
            ax.set_title(f"{est} / {loss}, M={M}", fontsize=8)
            ax.tick_params(labelsize=6)
            if j == 0:
                ax.set_ylabel("measured KL", fontsize=7)
            if i == len(keys) - 1:
                ax.set_xlabel("energy", fontsize=7)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
