"""Shared pieces of the depth benchmarks: machine facts, model and splits, estimator specs, a measurement cache
that makes reruns cheap, and Markdown / JSON output.

Not a public module: the benchmark scripts import it as ``_common`` from their own folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"


# ------------------------------------------------------------------------------------------------ machine
def setup_torch(threads: int | None) -> None:
    """Set torch's CPU threads (None: torch's default) and seed everything."""
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(0)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="model name or folder (default: the default model)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per window (default 128; --quick: 64)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data windows, label sampling and random sets")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument(
        "--hessian-cache",
        default=None,
        help="folder of cached Hessians (default: CBO_HOME/cache/hessian, shared with prune_depth)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def device_of(args: argparse.Namespace) -> str:
    import torch

    if args.device:
        return args.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def hessian_cache(args: argparse.Namespace) -> Path:
    if args.hessian_cache:
        return Path(args.hessian_cache)
    from cbo.models import cbo_home

    return cbo_home() / "cache" / "hessian"


def load(args: argparse.Namespace, *, n_calibration: int, n_validation: int, n_test: int) -> tuple[Any, Any, Any]:
    """(model, tokenizer, TokenSplits) on the default text (Austen: calibration Emma, validation Mansfield Park,
    test Persuasion)."""
    from cbo.data import make_splits
    from cbo.models import load_model

    model, tok = load_model(args.model, device=device_of(args))
    splits = make_splits(
        tok,
        seq_len=args.seq_len,
        n_calibration=n_calibration,
        n_validation=n_validation,
        n_test=n_test,
        seed=args.seed,
        model=model,
    )
    return model, tok, splits


# ------------------------------------------------------------------------------------------------ specs
def parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


RUN_KEYS = ("windows", "loss", "batch_size", "granularity", "label")


@dataclass
class EstimatorSpec:
    """One estimator configuration: ``name[:key=value[:key=value...]]``.

    Keys ``windows`` (calibration windows used, the first n), ``loss``, ``batch_size``, ``granularity`` and
    ``label`` set the run; every other key is an estimator option (``pairwise:couplings=raw``).
    """

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    windows: int | None = None
    loss: str = "kl"
    batch_size: int | None = None
    granularity: str = "layer"
    label: str | None = None

    @classmethod
    def parse(cls, text: str, *, loss: str = "kl", granularity: str = "layer") -> EstimatorSpec:
        parts = [p for p in text.strip().split(":") if p]
        if not parts:
            raise SystemExit(f"empty estimator spec {text!r}")
        spec = cls(parts[0], loss=loss, granularity=granularity)
        for part in parts[1:]:
            if "=" not in part:
                raise SystemExit(f"estimator spec {text!r}: {part!r} is not key=value")
            key, value = part.split("=", 1)
            if key in RUN_KEYS:
                setattr(spec, key, parse_value(value))
            else:
                spec.options[key] = parse_value(value)
        return spec

    def tag(self, with_loss: bool = True) -> str:
        if self.label:
            return str(self.label)
        bits = [self.name] + [f"{k}={v}" for k, v in sorted(self.options.items())]
        if with_loss and self.loss != "kl":
            bits.append(f"loss={self.loss}")
        if self.windows:
            bits.append(f"w={self.windows}")
        return ":".join(bits)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "options": self.options,
            "windows": self.windows,
            "loss": self.loss,
            "batch_size": self.batch_size,
            "granularity": self.granularity,
            "tag": self.tag(),
        }


def split_list(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def estimate(
    spec: EstimatorSpec, model: Any, tok: Any, calibration: Any, args: argparse.Namespace, progress: bool
) -> tuple[Any, float]:
    """The spec's QUBO (from the Hessian cache when present) and the wall time of this call."""
    from cbo.hessian import estimate_hessian

    windows = calibration if not spec.windows else calibration[: int(spec.windows)]
    t0 = time.perf_counter()
    qubo = estimate_hessian(
        model,
        tok,
        windows,
        estimator=spec.name,
        loss=spec.loss,
        granularity=spec.granularity,
        batch_size=int(spec.batch_size or args.batch_size),
        seed=args.seed,
        cache_dir=hessian_cache(args),
        progress=progress,
        **spec.options,
    )
    return qubo, time.perf_counter() - t0


def default_solver(n_blocks: int) -> str:
    """``auto`` when registered; else the exact enumerator for layer-sized problems, tabu swaps beyond."""
    from cbo.solvers import names

    if "auto" in names():
        return "auto"
    return "enumerate" if n_blocks <= 40 else "swap-tabu"


# ------------------------------------------------------------------------------------------------ measuring
class Measurer:
    """Test/validation metrics of removal sets, cached on disk so a rerun measures only what is new.

    The cache is keyed by the model's fingerprint, the split's data hash, the granularity and the removed set.
    Sets are measured by ``cbo.hessian.measure.Measurer`` (the original pass of a split's windows once, every set
    from its recorded streams, no model copies); its values equal those of the surgically pruned model.
    """

    def __init__(self, model: Any, splits: Any, cache_file: Path, *, batch_size: int = 8) -> None:
        from cbo.hessian.fingerprint import model_fingerprint

        self.model = model
        self.splits = splits
        self.batch_size = batch_size
        self.fingerprint = model_fingerprint(model)
        self.cache_file = Path(cache_file)
        self.cache: dict[str, dict] = {}
        if self.cache_file.exists():
            try:
                self.cache = json.loads(self.cache_file.read_text())
            except ValueError:
                self.cache = {}
        self._measurers: dict[tuple[str, str, int | None], Any] = {}
        self._blocks: dict[str, list] = {}
        self.new_measurements = 0
        self.measure_time = 0.0

    def blocks(self, granularity: str) -> list:
        from cbo.blocks import find_blocks

        if granularity not in self._blocks:
            self._blocks[granularity] = find_blocks(self.model, granularity)
        return self._blocks[granularity]

    def _data(self, split: str, windows: int | None) -> Any:
        return self.splits[split] if windows is None else self.splits[split][:windows]

    def measurer(self, split: str, granularity: str, windows: int | None = None) -> Any:
        """The ``cbo`` measurer of one split (its first ``windows`` windows) at one granularity."""
        from cbo.hessian.measure import Measurer as Engine

        key = (split, granularity, windows)
        if key not in self._measurers:
            data = self._data(split, windows)
            self._measurers[key] = Engine(self.model, self.blocks(granularity), data, batch_size=self.batch_size)
        return self._measurers[key]

    def _key(self, split: str, granularity: str, removed: Any, windows: int | None) -> str:
        from cbo.data import data_hash

        data = self._data(split, windows)
        text = json.dumps([self.fingerprint, data_hash(data), granularity, sorted(int(i) for i in removed)])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def original(self, split: str, windows: int | None = None) -> dict:
        """Metrics of the unpruned model (KL 0, agreement 1 by definition)."""
        key = self._key(split, "layer", [], windows)
        if key in self.cache:
            return self.cache[key]
        m = self.measurer(split, "layer", windows).losses([()]).base_metrics()
        m["n_params"] = self.measurer(split, "layer", windows).pruned_parameters(())
        self.cache[key] = m
        self.save()
        return m

    def measure(self, split: str, granularity: str, removed: Any, windows: int | None = None) -> dict:
        """``{"ppl", "nll", "kl", "agreement", "n_tokens", "n_params"}`` of the model without ``removed``."""
        key = self._key(split, granularity, removed, windows)
        if key in self.cache:
            return self.cache[key]
        t0 = time.perf_counter()
        engine = self.measurer(split, granularity, windows)
        m = engine.losses([removed]).metrics(0)
        m["n_params"] = engine.pruned_parameters(removed)
        self.measure_time += time.perf_counter() - t0
        self.new_measurements += 1
        self.cache[key] = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in m.items()}
        self.save()
        return self.cache[key]

    def release(self, split: str) -> None:
        """Free the original passes kept for ``split`` (they are run again when needed)."""
        for key in [k for k in self._measurers if k[0] == split]:
            del self._measurers[key]

    def save(self) -> None:
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_file.with_name(self.cache_file.name + ".tmp")
        tmp.write_text(json.dumps(self.cache))
        tmp.replace(self.cache_file)


def as_float(v: Any) -> float:
    return float(v) if v is not None else math.nan


# ------------------------------------------------------------------------------------------------ output
def fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(v)
    v = float(v)
    if not math.isfinite(v):
        return str(v)
    if abs(v) >= 1e5:
        return f"{v:.3g}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.{digits}g}"


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in row) + " |")
    return "\n".join(lines)


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=_json_default))
    return path


def _json_default(obj: Any) -> Any:
    try:
        import numpy as np

        if isinstance(obj, np.integer):
            return int(obj)
        if isinstance(obj, np.floating):
            return float(obj)
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:
        pass
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


def command_line() -> str:
    import shlex
    import sys

    script = os.path.relpath(sys.argv[0], REPO) if os.path.isabs(sys.argv[0]) else sys.argv[0]
    return " ".join([".venv/bin/python", shlex.quote(script), *map(shlex.quote, sys.argv[1:])])


class Stopwatch:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.c0 = cpu_seconds()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0

    def cpu(self) -> float:
        """CPU seconds of this process since the start (user + system): on a machine shared with other jobs and
        one torch thread, close to what the wall time would be on an idle machine."""
        return cpu_seconds() - self.c0


def cpu_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timing_line(result: dict) -> str:
    """The wall/CPU-time line of a report, with the count of new measurements where the run keeps one."""
    if result.get("wall_time_s") is None:
        return "Wall time: unknown (the run did not finish; these are the rows it completed)"
    cpu = result.get("cpu_time_s")
    extra = f", {cpu:.0f} s of CPU time (user + system, all threads)" if cpu is not None else ""
    new = result.get("new_measurements")
    cached = f" ({new} new measurements; the rest cached)" if new is not None else ""
    return f"Wall time: {result['wall_time_s']:.0f} s{extra}{cached}"


def add_report_arg(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument(
        "--report",
        action="store_true",
        help=f"compute nothing: rewrite the Markdown and plot from OUT/{name}.json (also of an interrupted run)",
    )


def report_only(out: Path, name: str, markdown, plot=None) -> dict:
    """Rewrite ``OUT/name.md`` (and ``.png``) from ``OUT/name.json``; a clear error when there is no JSON."""
    path = Path(out) / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"--report: {path} does not exist; run the benchmark without --report first")
    result = json.loads(path.read_text())
    (Path(out) / f"{name}.md").write_text(markdown(result))
    if plot is not None:
        plot(result, Path(out) / f"{name}.png")
    print(f"wrote {Path(out) / name}.md{'' if plot is None else ', .png'} from {path}", flush=True)
    return result
