"""The search benchmark's grid points and methods: a grid point (its splits, blocks, evaluation caches and result
files) and one runner per method (EvoPress, refine, singles + validation, random search, SLEB, BlockPruner), each
checkpointed under the point's folder so a rerun resumes where it stopped. ``benchmarks.search`` runs them and
evaluates what they chose."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from benchmarks import harness as C


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
    from cbo.search.budget import LOCAL_SEARCH, space_options
    from cbo.search.refine import refine

    budget, how = refine_budget(point, args)
    hi = min(16, args.calibration) if not args.quick else 2
    space = space_options(len(point.blocks), point.total_removed)  # the pipeline's proposal mix for this space
    options = {
        "high_windows": hi,
        "low_windows": 1,
        "validate": args.validate,
        **{name: getattr(space, name) for name in LOCAL_SEARCH},  # every option the space sets
        "local": space.local if args.refine_local is None else args.refine_local,
        "thompson": space.thompson if args.refine_thompson is None else args.refine_thompson,
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
