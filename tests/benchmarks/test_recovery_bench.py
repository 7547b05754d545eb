"""benchmarks/recovery.py and benchmarks/mop_recovery.py: their bookkeeping by hand, and --quick on the default
model (they run, write their outputs, and the rows obey what they claim)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from bench_scripts import bench_module, run_script


def rows_of(before, after):
    return [
        {"rank": r, "before": {"test_ppl": b}, "after": {"test_ppl": a, "validation_ppl": a + 1}}
        for r, b, a in zip([3, 0, 7, 1], before, after)
    ]


def test_rank_agreement_before_vs_after():
    R = bench_module("recovery")
    same = R.correlations(rows_of([10, 20, 30, 40], [5, 6, 7, 8]))
    assert same["spearman_test_ppl"] == pytest.approx(1.0) and same["kendall_test_ppl"] == pytest.approx(1.0)
    assert same["same_best_on_test"] and same["best_after_test"] == 3 and same["pipeline_choice_is_best_after"]
    flipped = R.correlations(rows_of([10, 20, 30, 40], [8, 7, 6, 5]))
    assert flipped["spearman_test_ppl"] == pytest.approx(-1.0) and not flipped["same_best_on_test"]
    assert flipped["best_before_test"] == 3 and flipped["best_after_test"] == 1
    assert flipped["validation_choice_after_healing"] == 1  # lowest validation PPL after healing
    assert flipped["spearman_pipeline_order_vs_after"] == pytest.approx(-1.0)


def test_mop_budget_counts_every_candidate_and_the_final_steps():
    M = bench_module("mop_recovery")
    step = lambda depth, width, final=False: SimpleNamespace(depth_layer=depth, width_params=width, final=final)  # noqa: E731
    result = SimpleNamespace(path=[step(5, 100), step(None, 100), step(4, 0), step(None, 50, final=True)])
    # candidates built: 2 + 1 + 1 + 1 (the final width-only step) = 5
    assert M.mop_budget(result, recovery_steps=3, final_steps=7) == 5 * 3 + 7


@pytest.mark.model
def test_recovery_bench_quick(installed, tmp_path):
    out = tmp_path / "rq"
    args = ["--quick", "--threads", "1", "--no-progress", "--out", str(out), "--checkpoints", str(tmp_path / "c")]
    run_script("recovery", *args, "--hessian-cache", str(tmp_path / "h"))
    data = json.loads((out / "recovery.json").read_text())
    block = data["per_m"]["4"]
    assert len(block["rows"]) == 2 and block["correlations"]["n"] == 2
    kls = [v["kl"] for v in block["pipeline"]]
    assert kls == sorted(kls)  # the validated states in the pipeline's order (validation KL)
    for r in block["rows"]:
        assert len(r["removed"]) == 4
        for when in ("before", "after"):
            assert math.isfinite(r[when]["test_ppl"]) and r[when]["test_kl"] > 0
    assert (out / "recovery.md").read_text().startswith("# Recovery after depth pruning")
    run_script("recovery", *args, "--report")  # the Markdown again from the JSON alone


@pytest.mark.model
@pytest.mark.slow
def test_mop_recovery_bench_quick(installed, tmp_path):
    out = tmp_path / "mq"
    run_script("mop_recovery", "--quick", "--threads", "1", "--proposers", "antepenultimate", "--out", str(out))
    rows = json.loads((out / "mop_recovery.json").read_text())["rows"]
    by = {r["method"]: r for r in rows}
    mop = by["MoP (antepenultimate depth, AMP width, KL) + recovery"]
    assert mop["recovery_steps"] >= 2  # at least one candidate plus the final step
    assert by["one-shot taylor + recovery"]["recovery_steps"] == mop["recovery_steps"]
    assert by["one-shot amp"]["recovery_steps"] == 0
    for r in rows:
        assert abs(r["removed"] - 0.1) < 0.03 and math.isfinite(r["ppl"])
