"""The anytime table from fabricated grid points: each checkpoint holds the last incumbent at or below its cost,
the first method is compared with the others there, the final ratio is the paired one, and points of another spec
or other test windows are refused."""

from __future__ import annotations

import json
import math

import pytest
from bench_scripts import bench_module


def _point(method, curve, nll, spec="sublayer-8-s0", ppl=49.4):
    last = curve[-1]
    evaluation = {"fpe": last[0], "calibration_kl": last[1], "test_ppl": math.exp(sum(nll) / len(nll)), "test_nll": nll}
    evaluation["curve"] = [{"fpe": f, "calibration_kl": k} for f, k in curve]
    return {"spec": {"name": spec}, "original_test_ppl": ppl, "evaluations": {method: evaluation}}


def test_checkpoints_hold_the_last_incumbent_and_the_ratio_is_paired(tmp_path):
    A = bench_module("anytime")
    evo = _point("evopress", [(100, 1.5), (600, 0.95), (1200, 0.9), (3000, 0.85)], [4.0, 4.2, 4.4])
    ours = _point("refine", [(300, 1.0), (700, 0.9), (1400, 0.84)], [3.9, 4.1, 4.5])
    paths = []
    for i, p in enumerate((evo, ours)):
        paths += ["--point", str(tmp_path / f"p{i}.json")]
        (tmp_path / f"p{i}.json").write_text(json.dumps(p))
    A.main([*paths, "--rename", "refine=default", "--out", str(tmp_path / "out")])
    result = json.loads((tmp_path / "out" / "anytime.json").read_text())
    rows = {r["fpe"]: r for r in result["checkpoints"]}
    assert rows[250]["kl"] == {"evopress": 1.5, "default": None} and rows[250]["first_at_or_below"] is None
    assert rows[500]["kl"] == {"evopress": 1.5, "default": 1.0} and rows[500]["first_at_or_below"] is True
    assert rows[1000]["kl"] == {"evopress": 0.95, "default": 0.9} and rows[1000]["first_at_or_below"] is True
    assert rows[3000]["kl"]["evopress"] == 0.85 and rows[3000]["first_at_or_below"] is True  # 0.84 <= 0.85
    ratio, low, high = result["ratios"]["default/evopress"]
    assert ratio == pytest.approx(math.exp((12.5 - 12.6) / 3)) and low <= ratio <= high
    assert "| 1,000 | 0.9500 | 0.9000 | yes |" in (tmp_path / "out" / "anytime.md").read_text()
    with pytest.raises(SystemExit, match="other test windows"):
        A.merge([evo, _point("x", [(1, 1.0)], [1.0], ppl=50.0)], {})
    with pytest.raises(SystemExit, match="different specs"):
        A.merge([evo, _point("x", [(1, 1.0)], [1.0], spec="layer-15-s0")], {})
