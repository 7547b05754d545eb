"""Energy fidelity and outcome of the depth estimators against every depth baseline (the research driver of the
"Energy fidelity and the default estimator" section of BENCHMARKS.md).

For each M and each estimator variant: the QUBO from the calibration split, its ``--top-k`` lowest-energy states
(exact enumeration), each measured on the validation split (KL to the original), the state with the lowest
validation KL chosen (the pipeline's rule), and the ground state and the chosen state measured on the test split.
The baselines (block influence, angular distance, SLEB, Taylor+, PPL) choose from the same calibration windows and
are measured on the same test windows. Fidelity: Spearman and Kendall correlation between energy and validation KL
over ``--random`` random sets of size M plus every variant's top-K states. The test split is only ever measured,
never used to choose.

Losses of removal sets are measured with ``cbo.measure.measurer`` (streams shared through a prefix tree, values
equal to those of the surgically pruned model) and kept in a cache on disk, so every set is measured once per
split whatever asks for it, and an interrupted run resumes. SLEB and PPL are computed from the same measurements
(calibration cross-entropy of the pruned model, as ``cbo.baselines`` defines them; ``--check`` compares with
``cbo.baselines`` on the first steps).

    .venv/bin/python -m benchmarks.fidelity                       # the full comparison (hours on 2 busy cores)
    .venv/bin/python -m benchmarks.fidelity --quick               # a few minutes: 2+2 windows, M = 4
    .venv/bin/python -m benchmarks.fidelity --variants fisher,hybrid --remove 8
    .venv/bin/python -m benchmarks.fidelity --variants singles --calibration-sizes 32,256,2048   # + paper-n32, ...

``--calibration-sizes`` adds the ``paper`` estimator (the CBO paper's recipe) at each size as variant
``paper-n{size}``: its QUBO from the first n windows of a shuffled pool of calibration windows, read from the
nested run of ``benchmarks/paper_sizes.py`` (``--paper-out``) or computed by it. Every variant also gets the
paper's own protocol as a row: the ground state and the next 2 excited states validated, the best kept
("best of top-3"). Test perplexities carry the paired bootstrap interval over test windows of their ratio to
``--reference`` (a row name).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness as C

# name -> (estimator, options, whether the options take the target M as ``remove``)
VARIANTS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "fisher": ("fisher", {}, False),
    "fisher-4draws": ("fisher", {"samples": 4}, False),
    "singles": ("hybrid", {"couplings": "none"}, False),
    # the measured pair table, built here from the shared measurements with the formula of ``pairwise``
    "pairwise-positive": ("pairwise", {"couplings": "positive"}, False),
    "pairwise-raw": ("pairwise", {"couplings": "raw"}, False),
    "hybrid": ("hybrid", {"couplings": "positive"}, False),
    "hybrid-raw": ("hybrid", {"couplings": "raw"}, False),
    "fit": ("fit", {"n_sets": 60}, True),
    "trust": ("trust", {}, True),
}
DEFAULT_VARIANTS = "fisher,singles,hybrid,pairwise-positive,fit,trust"
QUICK_VARIANTS = "fisher,singles,hybrid"
BASELINES = ("block_influence", "angular", "sleb", "taylor", "ppl")
PAPER_PREFIX = "paper-n"  # variant paper-n{size}: the paper estimator on the first {size} pool windows


def variant_entry(name: str) -> tuple[str, dict[str, Any], bool]:
    """(estimator, options, per-M) of a variant name: a VARIANTS key or ``paper-n{size}``."""
    if name.startswith(PAPER_PREFIX) and name[len(PAPER_PREFIX) :].isdigit():
        return ("paper", {}, False)
    return VARIANTS[name]


def paired_ratio_interval(nll_a: Any, nll_b: Any, resamples: int, seed: int) -> list[float]:
    """95 % paired bootstrap interval over test windows of the perplexity ratio exp(mean nll_a − mean nll_b)."""
    a, b = np.asarray(nll_a, float), np.asarray(nll_b, float)
    if len(a) != len(b) or len(a) < 2 or resamples < 1:
        return [math.nan, math.nan]
    rng = np.random.default_rng([seed, len(a), 29])
    idx = rng.integers(0, len(a), size=(resamples, len(a)))
    diffs = (a[idx] - b[idx]).mean(axis=1)
    return [float(np.exp(np.percentile(diffs, 2.5))), float(np.exp(np.percentile(diffs, 97.5)))]


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


# ------------------------------------------------------------------------------------------------ measurements
class Meter:
    """Mean KL to the original and perplexity of removal sets on one split (measured once, cached on disk), through
    ``cbo.measure.measurer.Measurer``; ``retain`` keeps the split's original pass between calls (small splits)."""

    def __init__(
        self, name: str, model: Any, blocks: list, windows: Any, cache: Any, batch_size: int, retain: bool = False
    ) -> None:
        from cbo.measure.measurer import Measurer

        self.name, self.windows, self.batch_size = name, windows, batch_size
        self.engine = Measurer(model, blocks, windows, batch_size=batch_size, cache=cache, retain=retain)
        self.values: dict[tuple[int, ...], dict[str, float]] = {}
        self.seconds = 0.0

    @property
    def work(self) -> dict[str, Any]:
        w = self.engine.work
        return {
            "layer_calls": w.layer_calls,
            "tail_calls": w.head_runs,
            "original_calls": w.original_passes,
            "measured": w.sets,
            "forward_equivalents": round(w.fpe, 2),
        }

    def __call__(self, sets: list) -> list[dict[str, float]]:
        keys = self.engine.check_sets(sets)
        todo = [k for k in dict.fromkeys(keys) if k not in self.values]
        if todo:
            t = time.perf_counter()
            before = self.engine.work.sets
            m = self.engine.losses(todo)
            self.seconds += time.perf_counter() - t
            if self.engine.work.sets > before:
                log(
                    f"  [{self.name}] measured {self.engine.work.sets - before} set-batches in {time.perf_counter() - t:.0f}s"
                )
            base_nll = float(m.base_ce.mean())
            for k, key in enumerate(todo):
                nll = float(m.ce[k].mean())
                self.values[key] = {
                    "nll_windows": [float(v) for v in m.ce[k]],
                    "kl": float(m.kl[k].mean()),
                    "nll": nll,
                    "ppl": math.exp(nll) if nll < 700 else math.inf,
                    "d_nll": nll - base_nll,
                }
            self.base = {"nll": base_nll, "ppl": math.exp(base_nll)}
        return [self.values[k] for k in keys]


# ------------------------------------------------------------------------------------------------ baselines
def sleb_order(meter: Meter, n: int, steps: int, keep: tuple[int, ...] = ()) -> tuple[list[int], list[float]]:
    """SLEB's greedy removal order on the calibration cross-entropy (as ``cbo.baselines`` defines it)."""
    removed: list[int] = []
    losses: list[float] = []
    for _ in range(steps):
        cands = [i for i in range(n) if i not in removed and i not in keep]
        vals = meter([removed + [i] for i in cands])
        nll = [v["nll"] for v in vals]
        best = int(np.argmin(nll))  # first minimum, as the baseline's strict "<" keeps the first
        removed.append(cands[best])
        losses.append(nll[best])
    return removed, losses


def baseline_sets(args: argparse.Namespace, model: Any, splits: Any, cal: Meter, n: int) -> dict[str, dict]:
    from cbo.baselines import rank_blocks

    out: dict[str, dict] = {}
    max_m = max(args.remove)
    for method in [b for b in args.baselines.split(",") if b]:
        t = time.perf_counter()
        if method == "ppl":
            vals = cal([[i] for i in range(n)])
            scores = np.array([v["nll"] for v in vals])
            order = [int(i) for i in np.argsort(scores, kind="stable")]
            sets = {m: sorted(order[:m]) for m in args.remove}
            info = {"scores_nll": scores.tolist(), "set_evaluations_per_batch": n}
        elif method == "sleb":
            order, losses = sleb_order(cal, n, max_m)
            sets = {m: sorted(order[:m]) for m in args.remove}
            info = {"order": order, "order_nll": losses, "set_evaluations_per_batch": sum(n - k for k in range(max_m))}
        else:
            r = rank_blocks(method, model, splits, batch_size=args.batch_size)
            sets = {m: r.select(m) for m in args.remove}
            info = {"passes": r.passes}
        out[method] = {"sets": {str(m): s for m, s in sets.items()}, "info": info, "seconds": time.perf_counter() - t}
        log(f"baseline {method}: {out[method]['sets']} ({out[method]['seconds']:.0f}s)")
    return out


# ------------------------------------------------------------------------------------------------ variants
def pair_table_qubo(cal: Meter, n: int, couplings: str) -> Any:
    """The ``pairwise`` estimator's QUBO (``H_ii = 2 D({i})``, ``H_ij = b_ij``) from the shared measurements."""
    from cbo.qubo.block_qubo import BlockQUBO

    t = time.perf_counter()
    before = cal.work
    pairs = [[i, j] for i in range(n) for j in range(i + 1, n)]
    single = np.array([v["kl"] for v in cal([[i] for i in range(n)])])
    pair = np.zeros((n, n))
    for (i, j), v in zip(pairs, cal(pairs)):
        pair[i, j] = pair[j, i] = v["kl"]
    b = pair - single[:, None] - single[None, :]
    np.fill_diagonal(b, 0.0)
    if couplings == "positive":
        b = np.maximum(b, 0.0)
    H = b.copy()
    np.fill_diagonal(H, 2.0 * single)
    work = {k: cal.work[k] - before[k] for k in before}
    meta = {
        "estimator": "pairwise",
        "set_evaluations": (n + len(pairs)) * math.ceil(cal.windows.shape[0] / cal.batch_size),
        "forward_passes": 1 + n + len(pairs),
        "layer_calls": work["layer_calls"],
        "wall_time_s": round(time.perf_counter() - t, 2),
        "measured": {"single": single.tolist(), "pair": pair.tolist()},
    }
    return BlockQUBO(H, np.zeros(n), metadata=meta)


def variant_qubo(
    args: argparse.Namespace, name: str, model: Any, tok: Any, splits: Any, m: int | None, cal: Meter
) -> Any:
    from cbo.hessian import estimate_hessian

    estimator, options, per_m = variant_entry(name)
    options = dict(options)
    windows = splits.calibration
    if estimator == "paper":
        from benchmarks import paper_sizes

        size = int(name[len(PAPER_PREFIX) :])
        pool, info = paper_sizes.calibration_pool(tok, args.seq_len, args.paper_pool, args.seed)
        out = Path(args.paper_out) if args.paper_out else paper_sizes.OUT
        if args.paper_wait:
            paper_sizes.wait_for(out, [size])
        return paper_sizes.paper_qubos(
            model,
            tok,
            pool,
            [size],
            out,
            batch_size=args.batch_size,
            seed=args.seed,
            progress=not args.no_progress,
            pool_info=info,
        )[size]
    if estimator == "pairwise":
        return pair_table_qubo(cal, len(cal.blocks), options["couplings"])
    if per_m:
        options["remove"] = m
    if estimator in ("hybrid", "fit", "trust"):
        options["measure_cache"] = str(args.out / "measured")
    return estimate_hessian(
        model,
        tok,
        windows,
        estimator=estimator,
        loss="kl",
        batch_size=args.batch_size,
        seed=args.seed,
        cache_dir=args.out / "qubos",
        progress=not args.no_progress,
        **options,
    )


def spearman_kendall(x: list[float], y: list[float]) -> dict[str, float]:
    from cbo.stats import kendall, spearman

    if len(x) < 3:
        return {"spearman": math.nan, "kendall": math.nan, "n": len(x)}
    return {"spearman": spearman(x, y), "kendall": kendall(x, y), "n": len(x)}


def random_sets(n: int, m: int, count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng([seed, m, 9])
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    while len(out) < count:
        s = tuple(sorted(int(i) for i in rng.choice(n, size=m, replace=False)))
        if s not in seen:
            seen.add(s)
            out.append(list(s))
    return out


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = C.parser(__doc__, out="fidelity", out_help="results and caches", quick="minutes", seed=0, progress=True)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--remove", default="8,15", help="comma-separated M values")
    p.add_argument("--calibration", type=int, default=32, help="calibration windows")
    p.add_argument("--validation", type=int, default=32, help="validation windows")
    p.add_argument("--test", type=int, default=64, help="test windows")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per calibration / validation window")
    p.add_argument("--test-seq-len", type=int, default=256, help="tokens per test window")
    p.add_argument("--top-k", type=int, default=20, help="low-energy states validated per variant and M")
    p.add_argument("--random", type=int, default=40, help="random sets per M for the fidelity correlations")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, from {sorted(VARIANTS)}")
    p.add_argument("--baselines", default=",".join(BASELINES))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--stage", default="all", help="prefetch (calibration singles + SLEB), baselines, variants, all, report"
    )
    p.add_argument("--calibration-sizes", default="", help="sizes of the paper estimator's variants paper-n{size}")
    p.add_argument("--paper-out", default=None, help="folder of the nested paper QUBOs (benchmarks/paper_sizes.py)")
    p.add_argument("--paper-pool", type=int, default=2048, help="windows in the paper estimator's shuffled pool")
    p.add_argument("--paper-wait", action="store_true", help="wait for a running paper_sizes.py to write each size")
    p.add_argument("--reference", default="singles (best of top-10)", help="row the test PPL ratios compare with")
    p.add_argument("--bootstrap", type=int, default=2000, help="paired bootstrap resamples of the test windows")
    args = p.parse_args(argv)
    if args.quick:
        args.calibration, args.validation, args.test = 2, 2, 2
        args.seq_len, args.test_seq_len, args.top_k, args.random = 64, 64, 5, 6
        args.remove = "4"
        if args.variants == DEFAULT_VARIANTS:  # the measured pair table alone would take minutes
            args.variants = QUICK_VARIANTS
    args.remove = [int(m) for m in str(args.remove).split(",") if m]
    args.variants = [v for v in args.variants.split(",") if v]
    args.variants += [f"{PAPER_PREFIX}{int(n)}" for n in args.calibration_sizes.split(",") if n]
    bad = [v for v in args.variants if v not in VARIANTS and not v.startswith(PAPER_PREFIX)]
    if bad:
        p.error(f"unknown variants {bad}; known: {sorted(VARIANTS)}")
    args.out = Path(args.out)
    return args


def main(argv: list[str] | None = None) -> dict:
    # its own outputs: results.json (results-quick.json) and .md, written as the stages go
    return C.main("fidelity", parse_args, run, argv=argv)


def run(job: C.Run) -> dict:
    args = job.args
    import torch

    from cbo.data.windows import make_splits
    from cbo.measure.measurer import MeasureCache
    from cbo.model.blocks import find_blocks
    from cbo.model.loading import load_model
    from cbo.solvers import solve

    result_path = args.out / ("results-quick.json" if args.quick else "results.json")
    result: dict[str, Any] = json.loads(result_path.read_text()) if result_path.exists() else {}
    if args.stage == "report":
        text = markdown(result)
        result_path.with_suffix(".md").write_text(text)
        print(text)
        return result

    def save() -> None:
        result_path.write_text(json.dumps(result, indent=1, default=float))

    t0 = time.perf_counter()
    model, tok = load_model(args.model)
    blocks = find_blocks(model, "layer")
    n = len(blocks)
    # windows are drawn for the largest setting and sliced, so that smaller settings use a subset of the same
    # windows (and share measurements)
    splits = make_splits(
        tok,
        seq_len=args.seq_len,
        n_calibration=max(32, args.calibration),
        n_validation=max(32, args.validation),
        n_test=0,
        seed=args.seed,
    )
    splits.calibration = splits.calibration[: args.calibration]
    splits.validation = splits.validation[: args.validation]
    test = make_splits(
        tok, seq_len=args.test_seq_len, n_calibration=0, n_validation=0, n_test=max(64, args.test), seed=args.seed
    ).test[: args.test]
    cache = MeasureCache(args.out / "measured", model, blocks)
    cal = Meter("calibration", model, blocks, splits.calibration, cache, args.batch_size, retain=True)
    val = Meter("validation", model, blocks, splits.validation, cache, args.batch_size)
    tst = Meter("test", model, blocks, test, cache, args.batch_size)
    result["setup"] = {
        "model": args.model,
        "n_blocks": n,
        "calibration": list(splits.calibration.shape),
        "validation": list(splits.validation.shape),
        "test": list(test.shape),
        "documents": {**splits.info["documents"], "test": ["persuasion"]},
        "remove": args.remove,
        "top_k": args.top_k,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "torch_threads": torch.get_num_threads(),
    }

    if args.stage == "prefetch":
        cal([[i] for i in range(n)])
        sleb_order(cal, n, max(args.remove))
        log("prefetch done")
        return result

    # ---------------------------------------------------------------- baselines
    if args.stage in ("all", "baselines"):
        result["baselines"] = baseline_sets(args, model, splits, cal, n)
        save()

    # ---------------------------------------------------------------- variants: QUBOs and top-K
    if args.stage in ("all", "variants"):
        variants = result.setdefault("variants", {})
        for name in args.variants:
            per_m = variant_entry(name)[2]
            qubos: dict[int, Any] = {}
            for m in args.remove if per_m else [None]:
                t = time.perf_counter()
                q = variant_qubo(args, name, model, tok, splits, m, cal)
                wall = time.perf_counter() - t
                for mm in [m] if per_m else args.remove:
                    qubos[mm] = (q, wall)
            entry = variants.setdefault(name, {})
            for m in args.remove:
                q, wall = qubos[m]
                states = solve(q, m, "enumerate", k=args.top_k)
                meta = q.metadata
                entry[str(m)] = {
                    "states": [list(map(int, s.removed)) for s in states],
                    "energies": [float(s.energy) for s in states],
                    "cost": {
                        "forward_passes": meta.get("forward_passes"),
                        "backward_passes": meta.get("backward_passes"),
                        "set_evaluations": meta.get("set_evaluations"),
                        "layer_calls": meta.get("layer_calls"),
                        "forward_equivalents": meta.get("fpe"),
                        "wall_time_s": meta.get("wall_time_s"),
                        "wall_time_this_run_s": round(wall, 2),
                    },
                    "qubo": {"H": q.H.tolist(), "g": q.g.tolist()},
                }
                log(f"variant {name} M={m}: ground {entry[str(m)]['states'][0]}  E0={entry[str(m)]['energies'][0]:.4g}")
            save()

    # ---------------------------------------------------------------- validation, choice, fidelity, test
    if args.stage == "validate":  # measure what is known so far on the validation split (cached for "all")
        for m in args.remove:
            pool = random_sets(n, m, args.random, args.seed)
            for v in args.variants:
                pool += result.get("variants", {}).get(v, {}).get(str(m), {}).get("states", [])
            val(pool)
        log("validation measurements done")
        return result

    if args.stage == "all":
        table: dict[str, dict] = {}
        fidelity: dict[str, dict] = {}
        for m in args.remove:
            rand = random_sets(n, m, args.random, args.seed)
            variant_states = {v: result["variants"][v][str(m)]["states"] for v in args.variants}
            pool = rand + [s for states in variant_states.values() for s in states]
            vals = val(pool)
            vkl = {tuple(s): v["kl"] for s, v in zip(pool, vals)}
            rows: dict[str, dict] = {}
            for method in args.baselines.split(","):
                rows[method] = {"set": result["baselines"][method]["sets"][str(m)]}
            for v, states in variant_states.items():
                kls = [vkl[tuple(s)] for s in states]
                best = int(np.argmin(kls))
                rows[f"{v} (ground)"] = {"set": states[0], "val_kl": kls[0]}
                rows[f"{v} (best of top-{len(states)})"] = {"set": states[best], "rank": best, "val_kl": kls[best]}
                # the paper's protocol: the ground state and 2 excited states, the best on validation kept
                best3 = int(np.argmin(kls[:3]))
                rows[f"{v} (best of top-3)"] = {"set": states[best3], "rank": best3, "val_kl": kls[best3]}
                qh = result["variants"][v][str(m)]["qubo"]
                from cbo.qubo.block_qubo import BlockQUBO

                q = BlockQUBO(np.array(qh["H"]), np.array(qh["g"]))
                X = np.zeros((len(pool), n))
                for k, s in enumerate(pool):
                    X[k, s] = 1
                e = np.atleast_1d(q.energy(X)).tolist()
                y = [vkl[tuple(s)] for s in pool]
                fidelity.setdefault(v, {})[str(m)] = {
                    "all": spearman_kendall(e, y),
                    "random": spearman_kendall(e[: len(rand)], y[: len(rand)]),
                    "top_k": spearman_kendall(e[len(rand) :][: len(states)], kls),
                }
            sets = [r["set"] for r in rows.values()]
            for r, v in zip(rows.values(), val(sets)):
                r["val_kl"] = v["kl"]
                r["val_ppl"] = v["ppl"]
            test_values = tst(sets)
            for r, v in zip(rows.values(), test_values):
                r["test_kl"] = v["kl"]
                r["test_ppl"] = v["ppl"]
            ref = dict(zip(rows, test_values)).get(args.reference)
            if ref is not None:
                for r, v in zip(rows.values(), test_values):
                    r["test_ppl_ratio"] = math.exp(v["nll"] - ref["nll"])
                    r["test_ppl_ratio_95"] = paired_ratio_interval(
                        v["nll_windows"], ref["nll_windows"], args.bootstrap, args.seed + m
                    )
                    r["ratio_reference"] = args.reference
            table[str(m)] = rows
            result["table"] = table
            result["fidelity"] = fidelity
            result["unpruned"] = {"test_ppl": tst.base["ppl"], "val_ppl": val.base["ppl"]}
            save()
            for name, r in rows.items():
                log(f"M={m} {name:40s} test PPL {r['test_ppl']:9.2f}  KL {r['test_kl']:.3f}  val KL {r['val_kl']:.3f}")
    result["wall_time_s"] = time.perf_counter() - t0
    result["measurement_work"] = {"calibration": cal.work, "validation": val.work, "test": tst.work}
    save()
    return result


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "–"
    v = float(v)
    if not math.isfinite(v):
        return "inf"
    return f"{v:.3g}" if abs(v) >= 1e4 else f"{v:.{digits}f}"


def markdown(result: dict) -> str:
    """The tables of the BENCHMARKS.md section from a results file."""
    lines: list[str] = []
    setup = result.get("setup", {})
    unpruned = result.get("unpruned", {})
    lines.append(
        f"Setup: {setup.get('model')} ({setup.get('n_blocks')} blocks); calibration {setup.get('calibration')} "
        f"windows×tokens, validation {setup.get('validation')}, test {setup.get('test')}; top-{setup.get('top_k')} "
        f"validated. Unpruned test PPL {_fmt(unpruned.get('test_ppl'), 2)}."
    )
    for m, rows in result.get("table", {}).items():
        ratio_ref = next((r.get("ratio_reference") for r in rows.values() if r.get("ratio_reference")), None)
        head = "| method | removed | val KL | test KL | test PPL |" + (
            f" PPL ÷ {ratio_ref} [95 %] |" if ratio_ref else ""
        )
        lines += ["", f"**M = {m}**", "", head, "|---|---|---|---|---|" + ("---|" if ratio_ref else "")]
        best = min(r["test_ppl"] for name, r in rows.items() if "(" not in name)
        for name, r in rows.items():
            label = name + (f" [rank {r['rank']}]" if "rank" in r else "")
            ppl = _fmt(r["test_ppl"])
            if "(" in name and r["test_ppl"] < best:
                ppl = f"**{ppl}**"
            cell = ""
            if ratio_ref:
                lo, hi = r.get("test_ppl_ratio_95", [math.nan, math.nan])
                cell = f" {_fmt(r.get('test_ppl_ratio'), 3)} [{_fmt(lo, 3)}, {_fmt(hi, 3)}] |"
            lines.append(
                f"| {label} | {r['set']} | {_fmt(r.get('val_kl'), 3)} | {_fmt(r.get('test_kl'), 3)} | {ppl} |{cell}"
            )
    fid = result.get("fidelity", {})
    if fid:
        ms = sorted({m for v in fid.values() for m in v}, key=int)
        head = " | ".join(f"M={m} all / random / top-K" for m in ms)
        lines += ["", f"| variant | {head} |", "|---|" + "---|" * len(ms)]
        for v, per in fid.items():
            cells = []
            for m in ms:
                f = per.get(m)
                cells.append(
                    "–" if f is None else " / ".join(_fmt(f[k]["spearman"], 2) for k in ("all", "random", "top_k"))
                )
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
    cost = result.get("variants", {})
    if cost:
        lines += [
            "",
            "| variant | M | forward passes | backward passes | set evaluations | forward equivalents | wall s |",
            "|---|---|---|---|---|---|---|",
        ]
        for v, per in cost.items():
            for m, e in per.items():
                c = e["cost"]
                lines.append(
                    f"| {v} | {m} | {c.get('forward_passes')} | {c.get('backward_passes')} | "
                    f"{c.get('set_evaluations')} | {c.get('forward_equivalents')} | {c.get('wall_time_s')} |"
                )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(sys.argv[1:])
