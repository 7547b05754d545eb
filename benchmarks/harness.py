"""What the benchmark scripts share: the skeleton of their ``main`` (``main``), the argument parser (``parser``),
the output folder, thread setting, machine facts, timing, JSON / Markdown output and resumable records. What only
the depth benchmarks share (the model and splits, estimator specs, a measurement cache) is ``depth_harness``.

Every script builds its options with ``parser``, hands its work to ``main`` and is run from the repository root as
``python -m benchmarks.NAME``. Nothing here imports torch at import time: the solver benchmarks run without it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
INSTANCES = REPO / "benchmarks" / "instances"  # the committed QUBO instances (.cboq)


# ------------------------------------------------------------------------------------------------ the skeleton
@dataclass
class Run:
    """What a benchmark's work function gets from ``main``: its name, arguments, output folder (created) and clock."""

    name: str
    args: argparse.Namespace
    out: Path
    clock: Stopwatch

    def header(self, *, torch_info: bool = True, **fields: Any) -> dict[str, Any]:
        """The first fields of every result: the benchmark's name, the command and the machine."""
        return {"benchmark": self.name, "command": command_line(), "machine": machine(torch_info=torch_info), **fields}

    def previous(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The result an earlier run with the same ``settings`` left in ``OUT/name.json`` ({} when none or others):
        a rerun resumes from its rows."""
        path = self.out / f"{self.name}.json"
        earlier = json.loads(path.read_text()) if path.exists() else {}
        return earlier if earlier.get("settings") == settings else {}

    def save(self, result: Any) -> Path:
        """Write ``OUT/name.json`` now (what an interrupted run keeps; ``--report`` reads it)."""
        return write_json(self.out / f"{self.name}.json", result)


def main(
    name: str,
    parse: argparse.ArgumentParser | Callable[[list[str] | None], argparse.Namespace],
    run: Callable[[Run], Any],
    markdown: Callable[[dict], str] | None = None,
    plot: Callable[[dict, Path], None] | None = None,
    *,
    argv: list[str] | None = None,
    torch: bool = True,
    show: bool = False,
) -> Any:
    """The ``main`` of a benchmark script: parse, ``--report`` alone, stopwatch, threads, folder, run, outputs.

    Args:
        name: the outputs' stem (``OUT/name.json``, ``.md``, ``.png``).
        parse: the script's parser, or a function of ``argv`` that returns its arguments.
        run: the work; gets a ``Run`` and returns the result (a dict; anything else is returned as it is, with no
            outputs written: an exit code, a list of written files).
        markdown: the report of a result; with it ``main`` writes the JSON and Markdown (and the plot unless
            ``--no-plot``), after adding the wall and CPU times when ``run`` did not.
        plot: ``plot(result, path)``, a PNG.
        torch: set torch's threads (``--threads``) and seed before ``run`` (False: the solver benchmarks, no torch).
        show: print the Markdown once written.

    Example:
        >>> def run(r: Run) -> dict:
        ...     return r.header(rows=[...])
        >>> main("speed", parser(__doc__, out="speed"), run, markdown)
    """
    args = parse.parse_args(argv) if isinstance(parse, argparse.ArgumentParser) else parse(argv)
    out = Path(getattr(args, "out", None) or OUT / name)
    draw = None if getattr(args, "no_plot", False) else plot
    if getattr(args, "report", False) and markdown is not None:  # without ``markdown``, ``run`` reports itself
        return report_only(out, name, markdown, draw)
    clock = Stopwatch()
    if torch:
        setup_torch(getattr(args, "threads", None))
    out.mkdir(parents=True, exist_ok=True)
    result = run(Run(name, args, out, clock))
    if markdown is None or not isinstance(result, dict):
        return result
    if result.get("wall_time_s") is None:  # None: the mark of a run that has not finished
        result["wall_time_s"] = round(clock(), 1)
    result.setdefault("cpu_time_s", round(clock.cpu(), 1))
    text = markdown(result)
    write_outputs(out, name, result, text)
    if show:
        print(text, flush=True)
    if draw is not None:
        draw(result, out / f"{name}.png")
    print(f"wrote {out / name}.json, .md{'' if draw is None else ', .png'} in {clock():.0f} s", flush=True)
    return result


# ------------------------------------------------------------------------------------------------ arguments
def parser(
    doc: str | None,
    *,
    out: str | Path | None = None,
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
        out: adds ``--out``, defaulting to ``benchmarks/out/<out>`` (``""``: ``benchmarks/out``; a ``Path``: that
            folder, for the scripts that write their summaries straight into ``benchmarks/results``).
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
        folder = out if isinstance(out, Path) else OUT / out
        shown = os.path.relpath(folder, REPO)
        p.add_argument("--out", default=str(folder), help=f"{out_help} (default {shown})")
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=quick)
    return p


def parse_with_defaults(
    p: argparse.ArgumentParser, argv: list[str] | None, full: dict[str, Any], quick: dict[str, Any]
) -> argparse.Namespace:
    """Parse ``argv``; every option left unset (None) takes its value from ``quick`` under ``--quick``, else ``full``."""
    args = p.parse_args(argv)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


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


def model_of(result: dict[str, Any]) -> str:
    """The model a result names; the default model for results written before they named one."""
    from cbo.model.loading import DEFAULT_MODEL

    return result.get("model", DEFAULT_MODEL)


def model_tag(model: str) -> str:
    """What marks another model's rows, keys and pools: "" for the default model, else the model's name."""
    from cbo.model.loading import DEFAULT_MODEL

    return "" if model == DEFAULT_MODEL else model


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


def split_list(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


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


def report_head(title: str, result: dict, machine: str | None = None) -> list[str]:
    """The first lines of a benchmark's Markdown: the title, the command, the machine (``machine_line`` of the
    result's unless given) and the timing line, then a blank line."""
    machine = machine or machine_line(result["machine"])
    return [f"# {title}", "", f"Command: `{result['command']}`  ", f"Machine: {machine}  ", timing_line(result), ""]


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
