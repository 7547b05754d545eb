"""benchmarks/search.py: its helpers, and its --quick mode on the default model (runs, obeys its own rules)."""

from __future__ import annotations

import json

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


def test_evopress_at_refines_cost_is_its_incumbent_within_that_fpe():
    S = bench_module("search")
    evo = [{"fpe": f, "removed": [k], "search_loss": 1.0 / (k + 1)} for k, f in enumerate([10.0, 50.0, 90.0, 130.0])]
    results = {"refine": {"fpe": 100.0, "steps": []}, "evopress": {"fpe": 130.0, "steps": evo}}
    equal = S.at_equal_cost(results)
    assert equal["removed"] == [2] and equal["fpe"] == 90.0 and len(equal["steps"]) == 3
    assert S.at_equal_cost({"refine": {"fpe": 5.0}, "evopress": {"steps": evo}}) is None
    assert S.at_equal_cost({"evopress": {"steps": evo}}) is None


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
        cost = refine["info"]["cost"]  # the budget counts the rounds; the prior and the validation are paid apart
        # the last round is cut at the average cost of a set: it may end a few FPE over, never by a round
        assert cost["rounds"] <= 1.02 * refine["info"]["budget"] + 1e-6
        assert cost["rounds"] >= 0.9 * refine["info"]["budget"] or refine["info"]["stopped"] == "exhausted"
        assert refine["fpe"] == pytest.approx(sum(cost.values()))
        assert refine["removed"] in refine["validation"]["removed"]  # chosen among the validated sets
        assert set(entry["ratios"]) >= {m for m in evals if m != "refine"}
    assert (out / "search-layer-3-s0.png").exists()
    assert "refine / method" in (out / "search.md").read_text()
