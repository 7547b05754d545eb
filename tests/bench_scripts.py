"""Running the benchmark scripts from the tests: as a subprocess (``python -m benchmarks.NAME``, what a user runs
from the repository root), or imported (``benchmarks.NAME``, its helpers are tested directly)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    """Run ``python -m benchmarks.<name> args`` from the repository root; fail the test with its output tail."""
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def bench_module(name: str) -> ModuleType:
    """The module ``benchmarks.<name>`` (the repository root is on the tests' path, see pyproject.toml)."""
    return importlib.import_module(f"benchmarks.{name}")
