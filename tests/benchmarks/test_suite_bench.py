"""The suite benchmarks' tables from fabricated scores: the grid's paired difference default - method equals a
direct computation over the items, the lead over block influence is tabulated per point, and the reference table
states subsets and projects (labelled) the full suite's time from the measured rate."""

from __future__ import annotations

import numpy as np
import pytest
from bench_scripts import bench_module

TASKS = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "boolq", "lambada_openai"]
METRIC = {"arc_challenge": "acc_norm", "hellaswag": "acc_norm"}


def _scores(rng, p):
    items = {t: {str(i): {METRIC.get(t, "acc"): float(rng.random() < p)} for i in range(40)} for t in TASKS}
    results = {
        t: {METRIC.get(t, "acc"): float(np.mean([v[METRIC.get(t, "acc")] for v in items[t].values()])), "n": 40.0}
        for t in TASKS
    }
    results["lambada_openai"]["perplexity"] = 30.0
    return {"results": results, "items": items}


def test_grid_compares_each_method_with_the_default_over_the_same_items():
    G = bench_module("suite_grid")
    rng = np.random.default_rng(0)
    point = {"refined": _scores(rng, 0.6), "block_influence": _scores(rng, 0.4), "unpruned": _scores(rng, 0.7)}
    table = G.compare(point, TASKS)
    direct = np.mean(
        [
            np.mean(
                [
                    point["refined"]["items"][t][i][METRIC.get(t, "acc")]
                    - point["block_influence"]["items"][t][i][METRIC.get(t, "acc")]
                    for i in point["refined"]["items"][t]
                ]
            )
            for t in TASKS
        ]
    )
    diff, low, high = table["block_influence"]["default_minus"]
    assert diff == pytest.approx(direct) and low < diff < high
    assert table["block_influence"]["average"] == pytest.approx(
        np.mean([point["block_influence"]["results"][t][METRIC.get(t, "acc")] for t in TASKS])
    )
    assert "default_minus" not in table["refined"] and table["refined"]["lambada_ppl"] == 30.0
    result = {"command": "x", "limit": 100, "seed": 0, "tasks": "zeroshot", "units": ",".join(TASKS)}
    result["points"] = {"m15-s0": {"sets": {}, "table": table}}
    text = G.markdown(result)
    assert "a seeded subset of 100 items per task (seed 0)" in text
    assert f"| m15-s0 | {diff:+.4f} [{low:+.4f}, {high:+.4f}] |" in text  # the lead over block influence


def test_reference_table_states_the_subset_and_labels_the_projection():
    R = bench_module("suite_reference")
    row = {
        "results": {"arc_easy": {"acc": 0.5, "acc_stderr": 0.05, "n": 100.0}},
        "wall_s": 50.0,
        "items": 100,
        "items_full": 2376,
        "items_per_s": 2.0,
        "peak_rss_mb": 900,
    }
    result = {
        "command": "x",
        "machine": {"cpu": "c", "cores": 2, "load_average_at_start": [0.5, 0.5, 0.5]},
        "limit": 100,
        "seed": 0,
        "models": {"smollm2-135m": {"load_s": 1.0, "tasks": {"arc_easy": row}}},
    }
    text = R.markdown(result)
    assert "a seeded subset of 100 items per task" in text and "| 100 of 2376 |" in text
    assert "| arc_easy | acc | 50.0 ± 5.0 | 54.12 (0-shot acc) |" in text
    assert "projected from the measured items/s (not measured): 0.3 h" in text  # 2376 items at 2 items/s
