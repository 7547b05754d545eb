"""Running the scripts under benchmarks/ from the tests: as a subprocess (what a user runs), or imported."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def run_script(script: str, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    """Run ``benchmarks/<script>`` with ``args`` from the repository root; fail the test with its output tail."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def bench_module(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` (its helpers are tested directly)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)
