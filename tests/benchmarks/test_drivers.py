"""The grid drivers issue the commands they describe (a recording interpreter stands in for Python)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *points: str, **env: str) -> list[list[str]]:
    log = tmp_path / "calls.txt"
    fake = tmp_path / "py"
    fake.write_text(f'#!/usr/bin/env bash\necho "$@" >> {log}\n')
    fake.chmod(0o755)
    subprocess.run(
        ["bash", str(ROOT / "benchmarks/drivers/search_grid_full.sh"), *points],
        env={**os.environ, "PY": str(fake), **env},
        check=True,
        capture_output=True,
    )
    return [line.split() for line in log.read_text().splitlines()]


def _arg(call: list[str], flag: str) -> str:
    return call[call.index(flag) + 1]


def test_full_grid_driver_runs_the_search_then_the_final_choice_per_point(tmp_path):
    calls = _run(tmp_path, "layer-12-s0", "sublayer-8-s1")
    search, choice, sub_search, sub_choice, report = calls
    assert search[:2] == ["-m", "benchmarks.search"] and _arg(search, "--points") == "layer-12-s0"
    assert _arg(search, "--methods") == "evopress,sleb,singles" and _arg(search, "--offspring") == "16"
    assert _arg(sub_search, "--methods") == "evopress,blockpruner"
    assert choice[:2] == ["-m", "benchmarks.final_choice"]
    assert (_arg(choice, "--remove"), _arg(choice, "--seeds"), _arg(choice, "--granularity")) == ("12", "0", "layer")
    assert _arg(choice, "--reference") == "benchmarks/out/search-full/layer-12-s0/point.json"
    assert (_arg(sub_choice, "--remove"), _arg(sub_choice, "--seeds")) == ("8", "1")
    assert _arg(sub_choice, "--granularity") == "sublayer" and _arg(sub_choice, "--refine") == "300"
    assert report[:2] == ["-m", "benchmarks.search"] and "--report" in report


def test_full_grid_driver_steps_and_extra_methods(tmp_path):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    only_choice = _run(tmp_path / "a", "layer-15-s2", STEP="choice")
    assert [c[1] for c in only_choice] == ["benchmarks.final_choice", "benchmarks.search"]  # then the tables
    search = _run(tmp_path / "b", "layer-8-s0", STEP="search", EXTRA="refine,random")[0]
    assert _arg(search, "--methods") == "evopress,sleb,singles,refine,random"
