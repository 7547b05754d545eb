"""benchmarks/search.py: its helpers, and its --quick mode on the default model (runs, obeys its own rules)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from bench_scripts import bench_module, run_script


def test_grid_points_parse_and_bad_ones_are_refused():
    S = bench_module("search")
    assert S.parse_point("layer-15-s2") == {"name": "layer-15-s2", "granularity": "layer", "remove": 15, "seed": 2}
    assert S.parse_point("sublayer-8-s0")["granularity"] == "sublayer"
    for bad in ("layer-15", "block-8-s0", "layer-x-s0", "layer-8-0"):
        with pytest.raises(SystemExit, match="GRAN-M-sSEED"):
            S.parse_point(bad)


def test_paired_bootstrap_ratio():
    S = bench_module("search")
    rng = np.random.default_rng(0)
    a = rng.normal(4.0, 0.5, 64)
    assert S.paired_ratio(a, a, 500) == (1.0, 1.0, 1.0)
    ratio, lo, hi = S.paired_ratio(a - 0.1, a, 500)  # every window 0.1 nats better: exactly exp(-0.1)
    assert ratio == pytest.approx(math.exp(-0.1)) and lo == pytest.approx(ratio) and hi == pytest.approx(ratio)
    b = a + rng.normal(0.0, 0.3, 64)
    ratio, lo, hi = S.paired_ratio(a, b, 2000)
    assert lo < ratio < hi and lo < 1.0 < hi * 1.2


def test_curve_points_spread_in_log_fpe_and_keep_the_last():
    S = bench_module("search")
    steps = [{"fpe": float(f), "removed": [k]} for k, f in enumerate(np.geomspace(1, 1000, 40))]
    picks = S.curve_indices(steps, 5)
    assert picks[-1] == 39 and picks[0] == 0 and 3 <= len(picks) <= 5
    assert S.curve_indices(steps[:3], 5) == [0, 1, 2]


@pytest.mark.model
@pytest.mark.slow
def test_quick_run_writes_its_outputs_and_obeys_its_rules(installed, tmp_path):
    out = tmp_path / "search"
    run_script("search", "--quick", "--out", str(out), "--no-progress", "--threads", "1", timeout=3600)
    result = json.loads((out / "search.json").read_text())
    assert set(result["points"]) == {"layer-3-s0", "sublayer-2-s0"}
    for entry in result["points"].values():
        spec, evals = entry["spec"], entry["evaluations"]
        expected = {"refine", "evopress", "singles", "random"} | ({"sleb"} if spec["granularity"] == "layer" else set())
        assert expected <= set(evals)
        for e in evals.values():
            n_removed = len(e["removed"])
            if spec["granularity"] == "layer":
                assert n_removed == spec["remove"]
            assert e["test_ppl"] > entry["original_test_ppl"] * 0.99
        refine = entry["runs"]["refine"]
        assert refine["fpe"] <= refine["info"]["budget"] + 1e-6
        assert refine["removed"] in refine["validation"]["removed"]  # chosen among the validated sets
        assert set(entry["ratios"]) >= {m for m in evals if m != "refine"}
    assert (out / "search-layer-3-s0.png").exists()
    assert "refine / method" in (out / "search.md").read_text()
