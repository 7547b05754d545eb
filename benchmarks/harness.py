"""What the benchmark scripts share: the argument parser (``parser``), the output folder, thread setting, machine
facts, timing, JSON / Markdown output, and for the depth benchmarks the model and splits, estimator specs and a
measurement cache that makes reruns cheap.

Every script builds its options with ``parser`` and is run from the repository root as
``python -m benchmarks.NAME``. Nothing here imports torch at import time: the solver benchmarks run without it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
INSTANCES = REPO / "benchmarks" / "instances"  # the committed QUBO instances (.cboq)


# ------------------------------------------------------------------------------------------------ arguments
def parser(
    doc: str | None,
    *,
    out: str | None = None,
    out_help: str = "output folder",
    quick: str | None = None,
    model: bool = False,
    threads: bool = True,
    seed: int | None = None,
    progress: bool = False,
) -> argparse.ArgumentParser:
    """The argument parser of a benchmark script, with the options every script spells the same way.

    Args:
        doc: the script's docstring (its first line is the summary; the rest is shown by ``--help`` as written).
        out: adds ``--out``, defaulting to ``benchmarks/out/<out>`` (``""``: ``benchmarks/out``).
        quick: adds ``--quick`` with this help text (the small settings the test suite runs).
        model: adds the model options (``--model --seq-len --batch-size --threads --seed --device
            --hessian-cache --no-progress``, see ``add_model_args``); ``threads``, ``seed`` and ``progress`` are
            then implied.
        threads: adds ``--threads`` (torch CPU threads; default: torch's choice).
        seed: adds ``--seed`` with this default.
        progress: adds ``--no-progress``.

    Example:
        >>> p = parser(__doc__, out="speed", quick="short runs", model=True)
        >>> p.add_argument("--remove", type=int, default=8)
    """
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if model:
        add_model_args(p, seed=0 if seed is None else seed)
    else:
        if threads:
            p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
        if seed is not None:
            p.add_argument("--seed", type=int, default=seed, help=f"seed (default {seed})")
        if progress:
            p.add_argument("--no-progress", action="store_true", help="no progress bars")
    if out is not None:
        shown = "benchmarks/out" + (f"/{out}" if out else "")
        p.add_argument("--out", default=str(OUT / out), help=f"{out_help} (default {shown})")
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=quick)
    return p


def out_dir(args: argparse.Namespace) -> Path:
    """The run's output folder (``args.out``), created."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


# ------------------------------------------------------------------------------------------------ machine
def setup_torch(threads: int | None) -> None:
    """Set torch's CPU threads (None: torch's default) and seed everything."""
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    torch.manual_seed(0)


def machine(*, torch_info: bool = True) -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, load average, Python; torch's threads, version and GPU when
    ``torch_info`` (the solver benchmarks pass False: they never import torch)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    if not torch_info:
        return info
    import torch

    info.update(
        torch_threads=torch.get_num_threads(),
        torch=torch.__version__,
        gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    )
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def machine_line(info: dict[str, Any] | None = None) -> str:
    """One line for a report: ``CPU, N cores, load average L at start``."""
    info = info or machine(torch_info=False)
    return f"{info['cpu']}, {info['cores']} cores, load average {info['load_average_at_start'][0]:.2f} at start"


def add_model_args(p: argparse.ArgumentParser, *, seed: int = 0) -> None:
    """The model options of the depth benchmarks (``parser(..., model=True)`` adds them)."""
    p.add_argument("--model", default="smollm2-135m", help="model name or folder (default: the default model)")
    p.add_argument(
        "--seq-len", type=int, default=None, help="tokens per window (default 128; --quick: each script's own, smaller)"
    )
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=seed, help="seed of the data windows, label sampling and random sets")
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
    from cbo.model.loading import cbo_home

    return cbo_home() / "cache" / "hessian"


def load(args: argparse.Namespace, *, n_calibration: int, n_validation: int, n_test: int) -> tuple[Any, Any, Any]:
    """(model, tokenizer, TokenSplits) on the default text (Austen: calibration Emma, validation Mansfield Park,
    test Persuasion)."""
    from cbo.data.windows import make_splits
    from cbo.model.loading import load_model

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


def cached_solve(qubo: Any, remove: int, solver: str, *, k: int, seed: int, cache_dir: Path) -> Any:
    """``cbo.solve(qubo, remove, solver, k=k, seed=seed)``, from ``cache_dir`` when this exact solve was done before.

    A solve that is not proven exact (``auto`` on a large space under its time budget) depends on how fast the
    machine was, so a rerun of a benchmark would otherwise validate other states; the cache keeps a rerun's
    choices, and its measurements, those of the first run. The key is the QUBO's data and constraints, M, the
    solver, k and the seed.
    """
    import numpy as np

    from cbo.errors import CorruptFileError
    from cbo.qubo.states import RankedStates
    from cbo.solvers import solve

    digest = hashlib.sha256()
    for arr in (qubo.H, qubo.g):
        digest.update(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
    digest.update(json.dumps([qubo.constraints.to_json(), int(remove), solver, int(k), int(seed)]).encode())
    path = Path(cache_dir) / f"states-{digest.hexdigest()[:32]}.json"
    if path.exists():
        try:
            return RankedStates.load(path)
        except (CorruptFileError, KeyError, ValueError):
            pass  # a damaged cache entry: solve again and replace it
    states = solve(qubo, remove, solver, k=k, seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    states.save(path)
    return states


# ------------------------------------------------------------------------------------------------ measuring
class Measurer:
    """Test/validation metrics of removal sets, cached on disk so a rerun measures only what is new.

    The cache is keyed by the model's fingerprint, the split's data hash, the granularity and the removed set.
    Sets are measured by ``cbo.measure.measurer.Measurer`` (the original pass of a split's windows once, every set
    from its recorded streams, no model copies); its values equal those of the surgically pruned model.
    """

    def __init__(self, model: Any, splits: Any, cache_file: Path, *, batch_size: int = 8) -> None:
        from cbo.model.fingerprint import model_fingerprint

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
        from cbo.model.blocks import find_blocks

        if granularity not in self._blocks:
            self._blocks[granularity] = find_blocks(self.model, granularity)
        return self._blocks[granularity]

    def _data(self, split: str, windows: int | None) -> Any:
        return self.splits[split] if windows is None else self.splits[split][:windows]

    def measurer(self, split: str, granularity: str, windows: int | None = None) -> Any:
        """The ``cbo`` measurer of one split (its first ``windows`` windows) at one granularity."""
        from cbo.measure.measurer import Measurer as Engine

        key = (split, granularity, windows)
        if key not in self._measurers:
            data = self._data(split, windows)
            self._measurers[key] = Engine(self.model, self.blocks(granularity), data, batch_size=self.batch_size)
        return self._measurers[key]

    def _key(self, split: str, granularity: str, removed: Any, windows: int | None) -> str:
        from cbo.data.windows import data_hash

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
    """Write ``data`` as indented JSON (numpy values and paths converted); the folder is created."""
    path = Path(path)
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
    """The command that is running, as a user would type it from the repository root."""
    module = getattr(sys.modules.get("__main__"), "__spec__", None)
    if module is not None and module.name.startswith("benchmarks."):
        head = ["-m", module.name]
    else:
        head = [os.path.relpath(sys.argv[0], REPO) if os.path.isabs(sys.argv[0]) else sys.argv[0]]
    return " ".join([".venv/bin/python", *head, *map(shlex.quote, sys.argv[1:])])


def write_outputs(out: Path, name: str, result: Any, markdown: str) -> tuple[Path, Path]:
    """Write ``out/name.json`` and ``out/name.md`` (the folder is created); returns both paths."""
    out = Path(out)
    json_path = write_json(out / f"{name}.json", result)
    md_path = out / f"{name}.md"
    md_path.write_text(markdown if markdown.endswith("\n") else markdown + "\n")
    return json_path, md_path


RESULT = "RESULT "


def print_result(data: Any) -> None:
    """Hand a measurement made in a child process (``run_in_process``) back to its parent: one JSON line."""
    print(RESULT + json.dumps(data, default=_json_default), flush=True)


def run_in_process(name: str, *args: str) -> Any:
    """Run ``python -m benchmarks.<name> args`` from the repository root in a new process and return what it
    handed back with ``print_result``: for measurements that need a process of their own (peak memory, a fresh
    import). Exits with the child's output tail when it fails."""
    import subprocess

    cmd = [sys.executable, "-m", f"benchmarks.{name}", *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(cmd[1:])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT) :])


class RecordLog:
    """An append-only JSONL file of finished runs, keyed by some of their fields: a rerun skips what is recorded,
    so an interrupted benchmark loses nothing (each line is flushed to disk as it is written).

    Example:
        >>> log = RecordLog(out / "runs.jsonl", ("instance", "M", "solver"))
        >>> rec = log.get(instance="a", M=8, solver="auto") or log.add({"instance": "a", "M": 8, "solver": "auto"})
    """

    def __init__(self, path: Path, key: tuple[str, ...], *, fresh: bool = False) -> None:
        self.path, self.key = Path(path), tuple(key)
        self.done: dict[tuple, dict[str, Any]] = {}
        if fresh and self.path.exists():
            self.path.unlink()
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    self.done[self._key(rec)] = rec

    def _key(self, fields: dict[str, Any]) -> tuple:
        return tuple(fields.get(k) for k in self.key)

    def get(self, **fields: Any) -> dict[str, Any] | None:
        """The recorded run with these key fields, or None."""
        return self.done.get(self._key(fields))

    def add(self, rec: dict[str, Any]) -> dict[str, Any]:
        """Record a finished run (it holds the key fields) and return it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(json.dumps(rec, default=_json_default) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.done[self._key(rec)] = rec
        return rec


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
