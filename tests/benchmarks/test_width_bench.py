"""benchmarks/width.py --quick on the default model: it runs, and its rows are consistent."""

from __future__ import annotations

import json
import math

import pytest
from bench_scripts import run_script


@pytest.mark.model
def test_width_bench_quick(installed, tmp_path):
    out = tmp_path / "width.json"
    proc = run_script("width", "--quick", "--threads", "1", "--json", str(out), timeout=900)
    rows = json.loads(out.read_text())["rows"]
    methods = [r["method"] for r in rows]
    assert methods[0] == "original" and rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert {"magnitude", "afr", "ntk", "amp (uniform)", "amp (global)", "mop (amp, kl)"} <= set(methods)
    for r in rows[1:]:
        assert abs(r["removed"] - r["ratio"]) < 0.03  # within a few percent of the target
        assert math.isfinite(r["ppl"]) and r["kl"] > 0 and r["prefill_tok_s"] > 0
    assert "| method |" in proc.stdout
