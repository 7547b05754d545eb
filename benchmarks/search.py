"""Search that pays: refine, EvoPress, SLEB, BlockPruner, singles + validation and random search, by cost.

For each grid point (granularity, M, calibration seed) and each method, the search runs on the calibration split
(Emma; a pool of ``--calibration`` windows, the seed picks which), chooses with calibration and validation
(Mansfield Park) only, and is charged its forward-pass equivalents (FPE: one full forward pass of the model over
one window; see ``cbo.executors``). Reported, without charge to the method:

* the anytime curve: after each step (generation, round, greedy step, batch) the method's incumbent, its KL to
  the original on the whole calibration pool, and — for up to ``--curve-points`` incumbents per method — its
  test perplexity (Persuasion, the same ``--test`` windows for every seed);
* the final choice's test PPL, with a paired bootstrap 95 % interval of its PPL ratio against the best baseline
  (resampling test windows).

Every method is checkpointed (a rerun resumes where it stopped and loses no finished step) and every evaluation
is cached under ``--out``, so a grid can be staged over several sessions: ``--points`` and ``--methods`` choose
what runs now; ``--report`` rewrites the tables and plots from what is there.

    .venv/bin/python benchmarks/search.py --points layer-15-s0                  # one grid point
    .venv/bin/python benchmarks/search.py                                       # the whole grid
    .venv/bin/python benchmarks/search.py --quick                               # minutes; what the test suite runs
    .venv/bin/python benchmarks/search.py --report                              # tables and plots only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

METHODS = ("refine", "evopress", "sleb", "blockpruner", "singles", "random")
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
    "blockpruner_windows": 16,
    "refine_fraction": 0.25,
    "validate": 10,
    "curve_points": 8,
    "bootstrap": 2000,
}
QUICK = {
    "points": "layer-3-s0,sublayer-2-s0",
    "methods": ",".join(METHODS),
    "calibration": 4,
    "validation": 2,
    "test": 4,
    "seq_len": 32,
    "offspring": 4,
    "generations": 3,
    "stage_windows": "1,2",
    "sleb_windows": 2,
    "blockpruner_windows": 2,
    "refine_fraction": 0.5,
    "validate": 3,
    "curve_points": 3,
    "bootstrap": 200,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(p)
    p.add_argument("--out", default=str(C.OUT / "search"), help="output folder (checkpoints, caches, results)")
    p.add_argument("--quick", action="store_true", help="tiny settings for the test suite")
    p.add_argument("--points", help=f"grid points GRAN-M-sSEED, comma-separated (default {DEFAULTS['points']})")
    p.add_argument("--methods", help=f"methods to run (default {DEFAULTS['methods']})")
    p.add_argument("--calibration", type=int, help="calibration pool windows (default 32)")
    p.add_argument("--validation", type=int, help="validation windows (default 32)")
    p.add_argument("--test", type=int, help="test windows (default 64)")
    p.add_argument("--offspring", type=int, help="EvoPress λ (default 32, the published setting; 16 is its fast one)")
    p.add_argument("--generations", type=int, help="EvoPress generations (default: int(k(n-k)/1.5), published)")
    p.add_argument("--stage-windows", help="EvoPress windows of selection stage 1 and 2 (default 1,16)")
    p.add_argument("--sleb-windows", type=int, help="calibration windows SLEB measures with (default 8)")
    p.add_argument("--blockpruner-windows", type=int, help="calibration windows BlockPruner measures (default 16)")
    p.add_argument(
        "--refine-fraction",
        type=float,
        help="refine's budget as a fraction of EvoPress's FPE at the same point (default 0.25)",
    )
    p.add_argument("--refine-budget", type=float, default=None, help="refine's budget in FPE (overrides the fraction)")
    p.add_argument("--validate", type=int, help="states validated by singles and refine (default 10)")
    p.add_argument("--curve-points", type=int, help="incumbents per method whose test PPL is measured (default 8)")
    p.add_argument("--bootstrap", type=int, help="bootstrap resamples of the test windows (default 2000)")
    p.add_argument("--no-plot", action="store_true")
    C.add_report_arg(p, "search")
    args = p.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.quick and args.model == "smollm2-135m":
        args.model = "smollm2-135m"
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
        from cbo.blocks import find_blocks
        from cbo.data import data_hash, make_splits
        from cbo.hessian.fingerprint import model_fingerprint

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
        from cbo.executors import InProcessExecutor

        windows = {"calibration": self.calibration, "validation": self.validation, "test": self.test}[split]
        return InProcessExecutor(self.model, self.blocks, windows, keep_windows=keep)

    def evaluation(self, split: str) -> Any:
        """Uncharged measurements on a whole split (the anytime curve's KL, test PPL), cached on disk."""
        from cbo.executors import Measurements

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
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(m.state()))
            tmp.replace(path)
        return values

    def close(self) -> None:
        for m in self._evals.values():
            m.executor.close()
        self._evals.clear()


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
    from cbo.evopress import evopress
    from cbo.executors import Measurements

    m = Measurements(point.executor("calibration"))
    settings = evopress_settings(point, args)
    r = evopress(
        m,
        point.kinds,
        point.counts,
        checkpoint=point.checkpoint("evopress"),
        progress=log_progress(point.name, "evopress"),
        **settings,
    )
    m.executor.close()
    steps = [{"fpe": h["fpe"], "removed": h["removed"], "search_loss": h["fitness"]} for h in r.history]
    return {"removed": r.removed, "fpe": r.fpe, "steps": steps, "info": {"generations": r.generations, **settings}}


RUNNERS = {"evopress": run_evopress}


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


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    if args.report:
        return C.report_only(out, "search", markdown, None)
    C.setup_torch(args.threads)
    from cbo.models import load_model

    model, tok = load_model(args.model, device=C.device_of(args))
    points = [parse_point(p) for p in C.split_list(args.points)]
    methods = C.split_list(args.methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; valid: {list(METHODS)}")
    results: dict[str, Any] = {"benchmark": "search", "command": C.command_line(), "machine": C.machine(), "points": {}}
    for spec in points:
        point = Point(spec, model, tok, args, out)
        for method in [m for m in METHODS if m in methods and m in RUNNERS]:
            results["points"].setdefault(point.name, {})[method] = run_method(point, method, args)
        point.close()
    C.write_json(out / "search.json", results)
    return results


def markdown(result: dict) -> str:
    return json.dumps(result)[:1000]


if __name__ == "__main__":
    main()
