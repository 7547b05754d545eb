"""Search that pays: refine, EvoPress, SLEB, BlockPruner, singles + validation and random search, by cost.

For each grid point (granularity, M, calibration seed) and each method, the search runs on the calibration split
(Emma; a pool of ``--calibration`` windows, the seed picks which), chooses with calibration and validation
(Mansfield Park) only, and is charged its forward-pass equivalents (FPE: one full forward pass of the model over
one window; see ``cbo.measure.executors``). Reported, without charge to the method:

* the anytime curve: after each step (generation, round, greedy step, batch) the method's incumbent, its KL to
  the original on the whole calibration pool, and — for up to ``--curve-points`` incumbents per method — its
  test perplexity (Persuasion, the same ``--test`` windows for every seed);
* the final choice's test PPL, with a paired bootstrap 95 % interval of its PPL ratio against the best baseline
  (resampling test windows).

Every method is checkpointed (a rerun resumes where it stopped and loses no finished step) and every evaluation
is cached under ``--out``, so a grid can be staged over several sessions: ``--points`` and ``--methods`` choose
what runs now; ``--report`` rewrites the tables and plots from what is there.

    .venv/bin/python -m benchmarks.search --points layer-15-s0                  # one grid point
    .venv/bin/python -m benchmarks.search                                       # the whole grid
    .venv/bin/python -m benchmarks.search --quick                               # minutes; what the test suite runs
    .venv/bin/python -m benchmarks.search --report                              # tables and plots only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from benchmarks import depth_harness as D
from benchmarks import harness as C
from benchmarks.search_report import EQUAL, METHODS, in_progress, markdown, plot_point

BASELINES = ("evopress", "sleb", "blockpruner", "singles", "random")
POINTS = ("layer-8-s0", "layer-12-s0", "layer-15-s0", "layer-15-s1", "layer-15-s2", "sublayer-8-s0")
DEFAULTS = {
    "points": ",".join(POINTS),
    "methods": ",".join(METHODS),
    "calibration": 32,
    "validation": 32,
    "test": 64,
    "seq_len": 128,
    "offspring": 32,
    "generations": None,
    "stage_windows": "1,16",
    "sleb_windows": 8,
    "blockpruner_windows": 8,
    "refine_fraction": 0.25,
    "validate": 10,
    "curve_points": 8,
    "bootstrap": 2000,
}
QUICK = {  # every method at both points in a few CPU minutes (what tests/benchmarks/test_search_bench.py runs)
    "points": "layer-3-s0,sublayer-2-s0",
    "methods": ",".join(METHODS),
    "calibration": 2,  # refine and random measure on 2 high-fidelity windows in quick mode: the whole pool
    "validation": 2,
    "test": 16,  # 256 test tokens: enough that no pruned set's test PPL comes out below the original's by chance
    "seq_len": 16,
    "offspring": 4,
    "generations": 2,
    "stage_windows": "1,1",
    "sleb_windows": 1,
    "blockpruner_windows": 1,
    "refine_fraction": 0.5,
    "validate": 3,
    "curve_points": 2,
    "bootstrap": 200,
    # refine's (and random search's) budget: the sublayer prior (60 units on 2 windows, ~75 FPE) and the validation
    # reserve (8 FPE) leave two rounds (~18 FPE each) at sublayer and four at layer granularity
    "refine_budget": 130,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = C.parser(
        __doc__,
        out="search",
        out_help="output folder (checkpoints, caches, results)",
        quick="tiny settings for the test suite",
        model=True,
    )
    p.add_argument("--points", help=f"grid points GRAN-M-sSEED, comma-separated (default {DEFAULTS['points']})")
    p.add_argument("--methods", help=f"methods to run (default {DEFAULTS['methods']})")
    p.add_argument("--calibration", type=int, help="calibration pool windows (default 32)")
    p.add_argument("--validation", type=int, help="validation windows (default 32)")
    p.add_argument("--test", type=int, help="test windows (default 64)")
    p.add_argument("--offspring", type=int, help="EvoPress λ (default 32, the published setting; 16 is its fast one)")
    p.add_argument("--generations", type=int, help="EvoPress generations (default: int(k(n-k)/1.5), published)")
    p.add_argument(
        "--evopress-budget",
        type=float,
        default=None,
        help="stop EvoPress once it has spent this many FPE (a capped run; its checkpoint resumes without it)",
    )
    p.add_argument("--stage-windows", help="EvoPress windows of selection stage 1 and 2 (default 1,16)")
    p.add_argument("--sleb-windows", type=int, help="calibration windows SLEB measures with (default 8)")
    p.add_argument(
        "--blockpruner-windows", type=int, help="calibration windows BlockPruner measures (default 8, as SLEB)"
    )
    p.add_argument(
        "--refine-fraction",
        type=float,
        help="refine's budget as a fraction of EvoPress's FPE at the same point (default 0.25)",
    )
    p.add_argument("--refine-budget", type=float, default=None, help="refine's budget in FPE (overrides the fraction)")
    p.add_argument("--validate", type=int, help="states validated by singles and refine (default 10)")
    p.add_argument(
        "--refine-local", type=float, default=0.5, help="refine's trust-region share of a batch (default 0.5)"
    )
    p.add_argument("--refine-thompson", type=float, default=0.25, help="refine's posterior-draw share (default 0.25)")
    p.add_argument(
        "--refine-options", type=json.loads, default={}, help="more refine options as JSON, e.g. '{\"batch\": 24}'"
    )
    p.add_argument("--curve-points", type=int, help="incumbents per method whose test PPL is measured (default 8)")
    p.add_argument("--bootstrap", type=int, help="bootstrap resamples of the test windows (default 2000)")
    p.add_argument("--no-plot", action="store_true")
    C.add_report_arg(p, "search")
    args = p.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


# ------------------------------------------------------------------------------------------------ grid points
def parse_point(name: str) -> dict[str, Any]:
    try:
        gran, m, s = name.split("-")
        if gran not in ("layer", "sublayer") or not s.startswith("s"):
            raise ValueError
        return {"name": name, "granularity": gran, "remove": int(m), "seed": int(s[1:])}
    except ValueError:
        raise SystemExit(f"grid point {name!r} is not GRAN-M-sSEED (e.g. layer-15-s0, sublayer-8-s0)") from None


class Point:
    """One grid point: its splits, blocks, evaluation caches and result files."""

    def __init__(self, spec: dict[str, Any], model: Any, tok: Any, args: argparse.Namespace, out: Path) -> None:
        from cbo.data.windows import data_hash, make_splits
        from cbo.model.blocks import find_blocks
        from cbo.model.fingerprint import model_fingerprint

        self.spec, self.model, self.args = spec, model, args
        self.name = spec["name"]
        self.granularity, self.remove, self.seed = spec["granularity"], spec["remove"], spec["seed"]
        seq = args.seq_len
        chosen = make_splits(
            tok, seq_len=seq, n_calibration=args.calibration, n_validation=args.validation, n_test=0, seed=self.seed
        )
        test = make_splits(tok, seq_len=seq, n_calibration=0, n_validation=0, n_test=args.test, seed=0)
        self.calibration, self.validation, self.test = chosen.calibration, chosen.validation, test.test
        self.blocks = find_blocks(model, self.granularity)
        self.kinds = [b.kind for b in self.blocks]
        self.dir = out / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        ident = [model_fingerprint(model), self.granularity, data_hash(self.calibration), data_hash(self.validation)]
        self.key = hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:12]
        self.test_key = hashlib.sha256(json.dumps([ident[0], self.granularity, data_hash(self.test)]).encode())
        self.test_key = self.test_key.hexdigest()[:12]
        self._evals: dict[str, Any] = {}

    @property
    def counts(self) -> int | dict[str, int]:
        """Removed units: M layers, or M attention and M MLP halves (M layers' parameters) at sublayer level."""
        return self.remove

    @property
    def total_removed(self) -> int:
        return self.remove * (1 if self.granularity == "layer" else 2)

    def checkpoint(self, method: str) -> Path:
        return self.dir / f"{method}-{self.key}.ckpt.json"

    def result_path(self, method: str) -> Path:
        return self.dir / f"{method}.json"

    def executor(self, split: str, keep: int = 32) -> Any:
        from cbo.measure.executors import InProcessExecutor

        windows = {"calibration": self.calibration, "validation": self.validation, "test": self.test}[split]
        return InProcessExecutor(self.model, self.blocks, windows, keep_windows=keep)

    def evaluation(self, split: str) -> Any:
        """Uncharged measurements on a whole split (the anytime curve's KL, test PPL), cached on disk."""
        from cbo.measure.executors import Measurements

        if split not in self._evals:
            m = Measurements(self.executor(split, keep=16))
            path = self._eval_path(split)
            if path.exists():
                try:
                    m.restore(json.loads(path.read_text()))
                    m.fpe = 0.0
                except (ValueError, KeyError):
                    pass
            self._evals[split] = m
        return self._evals[split]

    def _eval_path(self, split: str) -> Path:
        key = self.test_key if split == "test" else self.key
        return self.dir.parent / "cache" / f"eval-{self.granularity}-{split}-{key}.json"

    def evaluate(self, split: str, sets: list[list[int]], loss: str = "kl") -> Any:
        m = self.evaluation(split)
        before = m.pairs
        values = m(sets, list(range(m.n_windows)), loss=loss)
        if m.pairs != before:
            path = self._eval_path(split)
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():  # another process may have cached sets meanwhile: keep theirs too
                try:
                    merge_values(m, json.loads(path.read_text()))
                except (ValueError, KeyError):
                    pass
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(m.state()))
            tmp.replace(path)
        return values

    def close(self) -> None:
        for m in self._evals.values():
            m.executor.close()
        self._evals.clear()


def merge_values(m: Any, state: dict[str, Any]) -> None:
    """Add the (set, window) values of a saved ``Measurements`` state that ``m`` does not hold (uncharged)."""
    for key, rows in state["values"]:
        have = m.values.setdefault(tuple(key), {})
        for w, a, b in rows:
            have.setdefault(int(w), (float(a), float(b)))


def log_progress(point: str, method: str):
    t0 = time.perf_counter()

    def report(info: dict[str, Any]) -> None:
        bits = " ".join(f"{k}={C.fmt(v) if not isinstance(v, list) else v}" for k, v in info.items())
        print(f"[{point} {method} {time.perf_counter() - t0:7.0f}s] {bits}", flush=True)

    return report


# ------------------------------------------------------------------------------------------------ methods
def evopress_settings(point: Point, args: argparse.Namespace) -> dict[str, Any]:
    stage1, stage2 = (int(x) for x in C.split_list(args.stage_windows))
    return {
        "offspring": int(args.offspring),
        "generations": args.generations,
        "initial": 64,
        "initial_windows": stage1,
        "stages": ((2, stage1), (1, stage2)),
        "seed": point.seed,
    }


def run_evopress(point: Point, args: argparse.Namespace) -> dict[str, Any]:
    from cbo.baselines.evopress import evopress
    from cbo.measure.executors import Measurements

    m = Measurements(point.executor("calibration"))
    settings = evopress_settings(point, args)
    r = evopress(
        m,
        point.kinds,
        point.counts,
        budget=args.evopress_budget,
        checkpoint=point.checkpoint("evopress"),
        progress=log_progress(point.name, "evopress"),
        **settings,
    )
    m.executor.close()
    steps = [{"fpe": h["fpe"], "removed": h["removed"], "search_loss": h["fitness"]} for h in r.history]
    return {
        "removed": r.removed,
        "fpe": r.fpe,
        "steps": steps,
        "info": {
            "generations": r.generations,
            "stopped": r.stopped,
            "budget": args.evopress_budget,
            **settings,
        },
    }


def evopress_fpe(point: Point, args: argparse.Namespace) -> tuple[float, str]:
    """EvoPress's FPE at this point: its result, else projected from its checkpoint, else from its settings."""
    path = point.result_path("evopress")
    if path.exists():
        return float(json.loads(path.read_text())["fpe"]), "measured"
    from cbo.baselines.evopress import check_counts, default_generations

    settings = evopress_settings(point, args)
    counts = check_counts(point.kinds, point.counts)
    kind = max((c, k) for k, c in counts.items())[1]
    gens = settings["generations"] or default_generations(point.kinds.count(kind), counts[kind])
    ckpt = point.checkpoint("evopress")
    if ckpt.exists():
        hist = json.loads(ckpt.read_text())["state"]["history"]
        if len(hist) >= 3:
            per_gen = (hist[-1]["fpe"] - hist[0]["fpe"]) / (len(hist) - 1)
            return hist[0]["fpe"] + per_gen * gens, f"projected from {len(hist) - 1} generations"
    per_pair = 0.55 if point.granularity == "layer" else 1.0
    stage1, stage2 = settings["initial_windows"], settings["stages"][-1][1]
    pairs = settings["initial"] * stage1 + gens * (settings["offspring"] * stage1 + 3 * stage2)
    return pairs * per_pair, "nominal"


def refine_budget(point: Point, args: argparse.Namespace) -> tuple[float, str]:
    """The budget of refine and random search; fixed at its first use so that their checkpoints stay valid while
    EvoPress's projection moves (a finished EvoPress run is reported beside it: the ratio is in the table)."""
    if args.refine_budget:
        return float(args.refine_budget), "given"
    path = point.dir / f"budget-{point.key}.json"
    if path.exists():
        saved = json.loads(path.read_text())
        return float(saved["budget"]), saved["rule"]
    fpe, how = evopress_fpe(point, args)
    budget, rule = float(args.refine_fraction) * fpe, f"{args.refine_fraction:g} x EvoPress ({how}: {fpe:.0f})"
    C.write_json(path, {"budget": budget, "rule": rule})
    return budget, rule


def caps_of(point: Point) -> dict[str, int]:
    return {} if point.granularity == "layer" else {"attention": point.remove, "mlp": point.remove}


def run_refine(point: Point, args: argparse.Namespace) -> dict[str, Any]:
    from cbo.search.refine import refine

    budget, how = refine_budget(point, args)
    hi = min(16, args.calibration) if not args.quick else 2
    options = {
        "high_windows": hi,
        "low_windows": 1,
        "validate": args.validate,
        "local": args.refine_local,
        "thompson": args.refine_thompson,
        "solver": "auto" if point.granularity == "layer" else "swap-tabu",
        **args.refine_options,
    }
    r = refine(
        point.model,
        point.blocks,
        point.calibration,
        point.validation,
        remove=point.total_removed,
        budget=budget,
        caps=caps_of(point),
        seed=point.seed,
        checkpoint=point.checkpoint("refine"),
        progress=log_progress(point.name, "refine"),
        **options,
    )
    path = point.dir / "refine-qubo.cboq"
    r.qubo.save(path)
    steps = [{"fpe": x["fpe"], "removed": x["best_removed"], "search_loss": x["best"]} for x in r.rounds]
    steps.append({"fpe": r.fpe, "removed": r.chosen, "search_loss": None})
    return {
        "removed": r.chosen,
        "fpe": r.fpe,
        "steps": steps,
        "info": {"budget": budget, "budget_rule": how, "cost": r.cost, "stopped": r.stopped, "qubo": str(path)},
        "rounds": r.rounds,
        "validation": r.validation,
    }


def run_singles(point: Point, args: argparse.Namespace) -> dict[str, Any]:
    """The default: measured singles on the whole calibration pool, its top-K validated."""
    import numpy as np

    from cbo.measure.executors import Measurements, SearchCheckpoint
    from cbo.qubo.block_qubo import BlockQUBO
    from cbo.solvers import solve

    m = Measurements(point.executor("calibration"))
    ckpt = SearchCheckpoint(point.checkpoint("singles"), {"method": "singles", "windows": m.n_windows})
    saved = ckpt.load()
    if saved is not None:
        m.restore(saved["measure"])
    singles = [(i,) for i in range(len(point.blocks))]
    for start in range(0, m.n_windows, 4):  # four windows at a time, checkpointed
        m(singles, list(range(start, min(start + 4, m.n_windows))))
        ckpt.save({"measure": m.state()})
    D = m(singles, list(range(m.n_windows))).mean(axis=1)
    m.executor.close()
    q = BlockQUBO(np.diag(2 * D), kinds=point.kinds, sizes=[b.n_params for b in point.blocks], caps=caps_of(point))
    solver = "auto" if point.granularity == "layer" else "swap-tabu"
    states = solve(q, point.total_removed, solver=solver, k=args.validate, seed=0)
    top = [states.removed(k) for k in range(len(states))]
    v = Measurements(point.executor("validation"))
    val = v(top, list(range(v.n_windows))).mean(axis=1)
    v.executor.close()
    chosen = top[int(np.argmin(val))]
    steps = [
        {"fpe": m.fpe, "removed": top[0], "search_loss": None},
        {"fpe": m.fpe + v.fpe, "removed": chosen, "search_loss": None},
    ]
    info = {"singles": D.tolist(), "validated": top, "validation_kl": val.tolist(), "singles_fpe": m.fpe}
    return {"removed": chosen, "fpe": m.fpe + v.fpe, "steps": steps, "info": info}


def run_random(point: Point, args: argparse.Namespace) -> dict[str, Any]:
    """Random sets with the target counts, 16 per batch on the high-fidelity windows, until refine's budget is spent."""
    import numpy as np

    from cbo.baselines.evopress import check_counts
    from cbo.measure.executors import Measurements

    budget, how = refine_budget(point, args)
    rng = np.random.default_rng(1000 + point.seed)
    m = Measurements(point.executor("calibration"))
    counts = check_counts(point.kinds, point.counts)
    units = {kind: [i for i, k in enumerate(point.kinds) if k == kind] for kind in counts}
    space = math.prod(math.comb(len(units[k]), c) for k, c in counts.items())
    hi = list(range(min(16, args.calibration) if not args.quick else 2))
    best, best_set, steps, seen = math.inf, None, [], set()
    from cbo.measure.executors import SearchCheckpoint

    ckpt = SearchCheckpoint(point.checkpoint("random"), {"method": "random", "budget": budget, "windows": hi})
    saved = ckpt.load()
    if saved is not None:
        rng.bit_generator.state = saved["rng"]
        m.restore(saved["measure"])
        steps, seen = saved["steps"], {tuple(x) for x in saved["seen"]}
        best, best_set = (steps[-1]["search_loss"], steps[-1]["removed"]) if steps else (math.inf, None)
    while m.fpe < budget and len(seen) < space:
        batch: list[tuple[int, ...]] = []
        while len(batch) < 16 and len(seen) < space:
            s = tuple(sorted(int(i) for kind, c in counts.items() for i in rng.choice(units[kind], c, replace=False)))
            if s not in seen:
                seen.add(s)
                batch.append(s)
        values = m(batch, hi).mean(axis=1)
        k = int(np.argmin(values))
        if values[k] < best:
            best, best_set = float(values[k]), list(batch[k])
            steps.append({"fpe": m.fpe, "removed": best_set, "search_loss": best})
        state = {"rng": rng.bit_generator.state, "measure": m.state(), "steps": steps, "seen": [list(x) for x in seen]}
        ckpt.save(state)
    m.executor.close()
    steps.append({"fpe": m.fpe, "removed": best_set, "search_loss": best})
    return {"removed": best_set, "fpe": m.fpe, "steps": steps, "info": {"budget": budget, "budget_rule": how}}


def sleb_ranking(point: Point, args: argparse.Namespace) -> Any:
    """SLEB (``cbo.baselines.rank_blocks``) run once per calibration seed to the grid's largest M, cached."""
    from cbo.baselines import Ranking, rank_blocks
    from cbo.data.windows import data_hash

    windows = point.calibration[: args.sleb_windows]
    steps = 15 if not args.quick else point.remove
    key = hashlib.sha256(json.dumps([point.key, data_hash(windows), steps]).encode()).hexdigest()[:12]
    path = point.dir.parent / "cache" / f"sleb-{key}.json"
    if path.exists():
        return Ranking.from_json(json.loads(path.read_text())), len(windows)
    r = rank_blocks("sleb", point.model, windows, max_remove=max(steps, point.remove), progress=False)
    C.write_json(path, r.to_json())
    return r, len(windows)


def run_sleb(point: Point, args: argparse.Namespace) -> dict[str, Any]:
    if point.granularity != "layer":
        raise SystemExit("sleb runs at layer granularity only")
    r, w = sleb_ranking(point, args)
    n = len(point.blocks)
    # full forward passes over the windows: the reference pass, then n - k candidates at greedy step k
    fpe = w * (1 + sum(n - k for k in range(point.remove)))
    removed = sorted(r.order[: point.remove])
    steps = [{"fpe": fpe, "removed": removed, "search_loss": r.order_losses[point.remove - 1]}]
    return {"removed": removed, "fpe": fpe, "steps": steps, "info": {"windows": w, "loss": r.info.get("loss")}}


def run_blockpruner(point: Point, args: argparse.Namespace) -> dict[str, Any]:
    from cbo.baselines.blockpruner import blockpruner
    from cbo.measure.executors import Measurements

    if point.granularity != "sublayer":
        raise SystemExit("blockpruner runs at sublayer granularity only")
    m = Measurements(point.executor("calibration"))
    layer_params = sum(b.n_params for b in point.blocks) / (len(point.blocks) / 2)
    r = blockpruner(
        m,
        [b.n_params for b in point.blocks],
        target_params=int(point.remove * layer_params),
        windows=list(range(min(args.blockpruner_windows, m.n_windows))),
        checkpoint=point.checkpoint("blockpruner"),
        progress=log_progress(point.name, "blockpruner"),
    )
    m.executor.close()
    steps = [{"fpe": r.fpe, "removed": r.removed, "search_loss": math.log(r.perplexity[-1])}]
    return {"removed": r.removed, "fpe": r.fpe, "steps": steps, "info": {"order": r.order, "ppl": r.perplexity}}


RUNNERS = {
    "refine": run_refine,
    "evopress": run_evopress,
    "sleb": run_sleb,
    "blockpruner": run_blockpruner,
    "singles": run_singles,
    "random": run_random,
}
APPLIES = {"sleb": ("layer",), "blockpruner": ("sublayer",)}


def run_method(point: Point, method: str, args: argparse.Namespace) -> dict[str, Any]:
    path = point.result_path(method)
    if path.exists():
        try:
            return json.loads(path.read_text())
        except ValueError:
            pass
    clock = C.Stopwatch()
    print(f"== {point.name}: {method}", flush=True)
    result = RUNNERS[method](point, args)
    result.update({"method": method, "point": point.name, "wall_time_s": clock(), "cpu_time_s": clock.cpu()})
    C.write_json(path, result)
    return result


# ------------------------------------------------------------------------------------------------ evaluation
def curve_indices(steps: list[dict[str, Any]], count: int) -> list[int]:
    """Up to ``count`` steps, spread evenly in log FPE, always the last."""
    import numpy as np

    idx = [k for k, st in enumerate(steps) if st.get("removed")]
    if len(idx) <= count:
        return idx
    fpe = np.log([max(steps[k]["fpe"], 1e-9) for k in idx])
    targets = np.linspace(fpe[0], fpe[-1], count)
    chosen = {idx[int(np.argmin(np.abs(fpe - t)))] for t in targets} | {idx[-1]}
    return sorted(chosen)


def at_equal_cost(results: dict[str, Any]) -> dict[str, Any] | None:
    """EvoPress's incumbent after its last generation within refine's FPE: the anytime comparison at equal cost."""
    if "refine" not in results or "evopress" not in results:
        return None
    spent = results["refine"]["fpe"]
    steps = [st for st in results["evopress"]["steps"] if st["fpe"] <= spent]
    if not steps:
        return None
    last = steps[-1]
    return {"removed": last["removed"], "fpe": last["fpe"], "steps": steps}


def evaluate_point(point: Point, results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Calibration KL of every incumbent, test PPL of the curve's incumbents, per-window test NLL of the finals."""
    out: dict[str, Any] = {}
    results = dict(results)
    equal = at_equal_cost(results)
    if equal is not None:
        results[EQUAL] = equal
    for method, r in results.items():
        steps = r["steps"]
        sets = [st["removed"] for st in steps if st.get("removed")]
        distinct = [list(s) for s in dict.fromkeys(tuple(s) for s in sets)]
        kl = dict(zip(map(tuple, distinct), point.evaluate("calibration", distinct).mean(axis=1)))
        picks = curve_indices(steps, int(args.curve_points))
        test_sets = [steps[k]["removed"] for k in picks]
        ce = point.evaluate("test", test_sets, loss="ce")
        curve = []
        best_kl = math.inf
        for k, st in enumerate(steps):
            if not st.get("removed"):
                continue
            best_kl = float(kl[tuple(st["removed"])])
            row = {"fpe": st["fpe"], "calibration_kl": best_kl}
            if k in picks:
                row["test_ppl"] = math.exp(float(ce[picks.index(k)].mean()))
            curve.append(row)
        final_ce = point.evaluate("test", [r["removed"]], loss="ce")[0]
        out[method] = {
            "removed": r["removed"],
            "fpe": r["fpe"],
            "calibration_kl": float(point.evaluate("calibration", [r["removed"]]).mean()),
            "test_ppl": math.exp(float(final_ce.mean())),
            "test_nll": final_ce.tolist(),
            "curve": curve,
        }
    return out


def compare(evals: dict[str, Any], resamples: int) -> dict[str, Any]:
    """refine's test PPL ratio against each baseline and against the best baseline (by test PPL), with intervals."""
    from cbo.stats import paired_ppl_ratio

    if "refine" not in evals:
        return {}
    ref = evals["refine"]["test_nll"]
    out = {}
    for method, e in evals.items():
        if method != "refine":
            out[method] = paired_ppl_ratio(ref, e["test_nll"], resamples)
    base = [m for m in evals if m not in ("refine", EQUAL)]
    if base:
        best = min(base, key=lambda m: evals[m]["test_ppl"])
        out["best_baseline"] = best
    return out


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    if args.report:
        results = {"benchmark": "search", "command": C.command_line(), "points": {}}
        for path in sorted(out.glob("*/point.json")):
            results["points"][path.parent.name] = json.loads(path.read_text())
        results["in_progress"] = in_progress(out)
        C.write_json(out / "search.json", results)
        (out / "search.md").write_text(markdown(results))
        print(f"wrote {out / 'search.md'} from {len(results['points'])} grid points", flush=True)
        return results
    C.setup_torch(args.threads)
    from cbo.model.loading import load_model

    model, tok = load_model(args.model, device=D.device_of(args))
    points = [parse_point(p) for p in C.split_list(args.points)]
    methods = C.split_list(args.methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; valid: {list(METHODS)}")
    results: dict[str, Any] = {"benchmark": "search", "command": C.command_line(), "machine": C.machine(), "points": {}}
    for spec in points:
        point = Point(spec, model, tok, args, out)
        runs: dict[str, Any] = {}
        for method in METHODS:
            if method in methods and point.granularity in APPLIES.get(method, ("layer", "sublayer")):
                runs[method] = run_method(point, method, args)
        # every method already finished at this point enters the tables, also those run in an earlier session
        for method in METHODS:
            if method not in runs and point.result_path(method).exists():
                runs[method] = json.loads(point.result_path(method).read_text())
        evals = evaluate_point(point, runs, args)
        entry = {"spec": spec, "evaluations": evals, "ratios": compare(evals, int(args.bootstrap))}
        entry["original_test_ppl"] = math.exp(float(point.evaluate("test", [[]], loss="ce")[0].mean()))
        entry["runs"] = {m: {k: v for k, v in r.items() if k != "rounds"} for m, r in runs.items()}
        C.write_json(point.dir / "point.json", entry)
        if not args.no_plot:
            plot_point(entry, out / f"search-{point.name}.png")
        point.close()
    for path in sorted(out.glob("*/point.json")):
        results["points"][path.parent.name] = json.loads(path.read_text())
    C.write_json(out / "search.json", results)
    (out / "search.md").write_text(markdown(results))
    print(f"wrote {out / 'search.md'}", flush=True)
    return results


if __name__ == "__main__":
    main()
