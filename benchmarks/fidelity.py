"""Energy fidelity and outcome of the depth estimators against every depth baseline (the research driver of the
"Energy fidelity and the default estimator" section of BENCHMARKS.md).

For each M and each estimator variant: the QUBO from the calibration split, its ``--top-k`` lowest-energy states
(exact enumeration), each measured on the validation split (KL to the original), the state with the lowest
validation KL chosen (the pipeline's rule), and the ground state and the chosen state measured on the test split.
The baselines (block influence, angular distance, SLEB, Taylor+, PPL) choose from the same calibration windows and
are measured on the same test windows. Fidelity: Spearman and Kendall correlation between energy and validation KL
over ``--random`` random sets of size M plus every variant's top-K states. The test split is only ever measured,
never used to choose.

Losses of removal sets are measured with ``cbo.hessian.measure`` (streams shared through a prefix tree, values
equal to those of the surgically pruned model) and kept in a cache on disk, so every set is measured once per
split whatever asks for it, and an interrupted run resumes. SLEB and PPL are computed from the same measurements
(calibration cross-entropy of the pruned model, as ``cbo.baselines`` defines them; ``--check`` compares with
``cbo.baselines`` on the first steps).

    .venv/bin/python benchmarks/fidelity.py                       # the full comparison (hours on 2 busy cores)
    .venv/bin/python benchmarks/fidelity.py --quick               # a few minutes: 2+2 windows, M = 4
    .venv/bin/python benchmarks/fidelity.py --variants fisher,hybrid --remove 8
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

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out" / "fidelity"

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


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


# ------------------------------------------------------------------------------------------------ measurements
class Meter:
    """Mean KL to the original and perplexity of removal sets on one split (measured once, cached on disk), through
    ``cbo.hessian.measure.Measurer``; ``retain`` keeps the split's original pass between calls (small splits)."""

    def __init__(
        self, name: str, model: Any, blocks: list, windows: Any, cache: Any, batch_size: int, retain: bool = False
    ) -> None:
        from cbo.hessian.measure import Measurer

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
            "forward_equivalents": round(w.forward_equivalents, 2),
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
    for method in BASELINES:
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
    from cbo.qubo import BlockQUBO

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

    estimator, options, per_m = VARIANTS[name]
    options = dict(options)
    windows = splits.calibration
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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", default=str(OUT), help="output folder (results, measurement cache, QUBO cache)")
    p.add_argument("--quick", action="store_true", help="tiny settings (a few minutes)")
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
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--stage", default="all", help="prefetch (calibration singles + SLEB), baselines, variants, all, report"
    )
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.calibration, args.validation, args.test = 2, 2, 2
        args.seq_len, args.test_seq_len, args.top_k, args.random = 64, 64, 5, 6
        args.remove = "4"
        if args.variants == DEFAULT_VARIANTS:  # the measured pair table alone would take minutes
            args.variants = QUICK_VARIANTS
    args.remove = [int(m) for m in str(args.remove).split(",") if m]
    args.variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown variants {bad}; known: {sorted(VARIANTS)}")
    args.out = Path(args.out)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import torch

    from cbo.blocks import find_blocks
    from cbo.data import make_splits
    from cbo.hessian.measure import MeasureCache
    from cbo.models import load_model
    from cbo.solvers import solve

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
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
            per_m = VARIANTS[name][2]
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
                        "forward_equivalents": meta.get("forward_equivalents"),
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
                qh = result["variants"][v][str(m)]["qubo"]
                from cbo.qubo import BlockQUBO

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
            for r, v in zip(rows.values(), tst(sets)):
                r["test_kl"] = v["kl"]
                r["test_ppl"] = v["ppl"]
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
        lines += ["", f"**M = {m}**", "", "| method | removed | val KL | test KL | test PPL |", "|---|---|---|---|---|"]
        best = min(r["test_ppl"] for name, r in rows.items() if "(" not in name)
        for name, r in rows.items():
            label = name + (f" [rank {r['rank']}]" if "rank" in r else "")
            ppl = _fmt(r["test_ppl"])
            if "(" in name and r["test_ppl"] < best:
                ppl = f"**{ppl}**"
            lines.append(f"| {label} | {r['set']} | {_fmt(r.get('val_kl'), 3)} | {_fmt(r.get('test_kl'), 3)} | {ppl} |")
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
