"""The suite benchmarks' tables from fabricated scores: the grid's paired difference default - method equals a
direct computation over the items, the lead over block influence is tabulated per point, and the reference table
states subsets and projects (labelled) the full suite's time from the measured rate; the scorer table totals its
tasks; the reference saves item scores where the grid reads them."""

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


def test_the_leads_growth_is_a_difference_of_paired_differences_over_the_same_items():
    """Point B's lead over block influence minus point A's, computed by hand item by item; the table shows it, and
    without LAMBADA among the tasks there is no LAMBADA column."""
    G = bench_module("suite_grid")
    rng = np.random.default_rng(1)
    small = {"refined": _scores(rng, 0.6), "block_influence": _scores(rng, 0.6)}
    large = {"refined": _scores(rng, 0.5), "block_influence": _scores(rng, 0.3)}
    units = ["arc_easy", "piqa"]
    growth = G.lead_growth({"m15-s0": (15, large), "m8-s0": (8, small), "sub8-s0": (8, {})}, units)
    assert list(growth) == ["m15-s0 − m8-s0"]

    def lead(point, t):
        return [point["refined"]["items"][t][i]["acc"] - point["block_influence"]["items"][t][i]["acc"] for i in
                point["refined"]["items"][t]]  # fmt: skip

    direct = np.mean([np.mean(np.subtract(lead(large, t), lead(small, t))) for t in units])
    value, low, high = growth["m15-s0 − m8-s0"]
    assert value == pytest.approx(direct) and low < value < high
    assert G.lead_growth({"m8-s0": (8, small)}, units) == {}
    table = G.compare(large, units)
    assert table["refined"]["lambada_ppl"] is None
    result = {"command": "x", "limit": None, "seed": 0, "tasks": "arc_easy,piqa", "units": ",".join(units)}
    result["points"] = {"m15-s0": {"sets": {}, "table": table}}
    result["growth"] = growth
    text = G.markdown(result)
    assert "LAMBADA" not in text and "every item" in text
    assert f"| m15-s0 − m8-s0 | {value:+.4f} [{low:+.4f}, {high:+.4f}] |" in text


def test_pooled_over_seeds_is_the_mean_of_the_seeds_paired_differences():
    """default - method pooled over a point's seeds equals the mean over seeds of the per-item differences (task
    means averaged), computed by hand; a point with one seed, one seed twice, or a method missing at a seed, is not
    pooled."""
    G = bench_module("suite_grid")
    rng = np.random.default_rng(2)
    units = ["arc_easy", "piqa"]
    seeds = {f"sub8-s{s}": {"refined": _scores(rng, 0.4), "evopress": _scores(rng, 0.6)} for s in range(3)}
    seeds["sub8-s2"]["sleb"] = _scores(rng, 0.5)
    groups = {
        "sublayer M = 8": list(enumerate(seeds.values())),
        "layer M = 8": [(0, seeds["sub8-s0"])],
        "layer M = 12": [(0, seeds["sub8-s0"]), (0, seeds["sub8-s1"])],  # one seed twice: no pool
    }
    pooled = G.pooled_seeds(groups, units)
    assert list(pooled) == ["sublayer M = 8"] and list(pooled["sublayer M = 8"]) == ["evopress"]

    def diff(point, t):
        return np.mean([point["refined"]["items"][t][i]["acc"] - point["evopress"]["items"][t][i]["acc"]
                        for i in point["refined"]["items"][t]])  # fmt: skip

    direct = np.mean([np.mean([diff(point, t) for t in units]) for point in seeds.values()])
    n, value, low, high = pooled["sublayer M = 8"]["evopress"]
    assert n == 3 and value == pytest.approx(direct) and low < value < high
    result = {"command": "x", "limit": None, "seed": 0, "tasks": "arc_easy,piqa", "units": ",".join(units)}
    result["points"], result["pooled"] = {}, pooled
    assert f"| sublayer M = 8 | evopress | 3 | {value:+.4f} [{low:+.4f}, {high:+.4f}] |" in G.markdown(result)


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


def test_scorer_table_totals_the_tasks_and_counts_items_scored_differently():
    S = bench_module("suite_scorer")
    a = {"0": {"acc": 1.0, "acc_norm": 0.0}, "1": {"acc": 0.0, "acc_norm": 1.0}}
    assert S.differing(a, a) == 0
    assert S.differing(a, {"0": {"acc": 1.0, "acc_norm": 1.0}, "1": a["1"]}) == 1
    rows = {
        "arc_easy": {"items": 100, "whole_s": 30.0, "shared_s": 10.0, "speedup": 3.0, "differing_items": 0},
        "boolq": {"items": 100, "whole_s": 10.0, "shared_s": 10.0, "speedup": 1.0, "differing_items": 1},
    }
    machine = {"cpu": "c", "cores": 2, "load_average_at_start": [0.5, 0.5, 0.5]}
    result = {"command": "x", "machine": machine, "model": "m", "limit": 100, "tasks": rows}
    text = S.markdown(result)
    assert "| arc_easy | 100 | 30 | 10 | 3.00× | 0 |" in text
    assert "| all | 200 | 40 | 20 | 2.00× | 1 |" in text  # 40 s against 20 s


def test_reference_saves_item_scores_where_the_grid_reads_its_unpruned_set(tmp_path):
    """Each model's unpruned set has its own cache entry; the default model's keys have no prefix, so the caches
    written before other models entered the grid stay valid."""
    import json
    from argparse import Namespace

    R, G = bench_module("suite_reference"), bench_module("suite_grid")
    args = Namespace(scores=str(tmp_path), limit=None, seed=0)
    R.save_items(args, "smollm2-135m", {"arc_easy": {"acc": 0.5}}, {"arc_easy": {0: {"acc": 1.0}, 1: {"acc": 0.0}}})
    R.save_items(args, "smollm2-135m", {"piqa": {"acc": 1.0}}, {"piqa": {0: {"acc": 1.0}}})
    R.save_items(args, "gemma3-270m", {"piqa": {"acc": 0.0}}, {"piqa": {0: {"acc": 0.0}}})
    assert json.loads((tmp_path / "gemma3-270m-layer-none-all.json").read_text())["results"] == {"piqa": {"acc": 0.0}}
    assert G._key("smollm2-135m", "layer", [], None, 0) == "layer-none-all"
    saved = (tmp_path / f"{G._key('smollm2-135m', 'layer', [], None, 0)}.json").read_text()

    assert json.loads(saved) == {
        "results": {"arc_easy": {"acc": 0.5}, "piqa": {"acc": 1.0}},
        "items": {"arc_easy": {"0": {"acc": 1.0}, "1": {"acc": 0.0}}, "piqa": {"0": {"acc": 1.0}}},
    }


def test_cached_only_tabulates_complete_sets_and_scores_nothing(tmp_path):
    """--cached-only: a set with every task cached comes back as cached; a set missing a task is left out, and no
    model is touched (None stands for the model: scoring would fail)."""
    import json
    from argparse import Namespace

    G = bench_module("suite_grid")
    args = Namespace(cache=tmp_path, limit=None, seed=0, tasks="arc_easy,piqa", cached_only=True)
    job = Namespace(args=args, out=tmp_path)
    full = {"results": {"arc_easy": {"acc": 0.5}, "piqa": {"acc": 0.6}}, "items": {"arc_easy": {}, "piqa": {}}}
    (tmp_path / "layer-1-2-all.json").write_text(json.dumps(full))
    part = {"results": {"arc_easy": {"acc": 0.5}}, "items": {"arc_easy": {}}}
    (tmp_path / "layer-3-4-all.json").write_text(json.dumps(part))
    assert G.score_set(job, "smollm2-135m", "layer", [1, 2], None, None) == full
    assert G.score_set(job, "smollm2-135m", "layer", [3, 4], None, None) == {"results": {}, "items": {}}
    # the same set of another model is another entry: Gemma's blocks 1 and 2 are not SmolLM2's
    assert G.score_set(job, "gemma3-270m", "layer", [1, 2], None, None) == {"results": {}, "items": {}}


def test_reference_states_each_tasks_full_size_when_the_task_folder_is_stale(tmp_path, monkeypatch):
    """The projection needs each task's size: a task folder not yet written (or stale) is written when the plan is
    made (``cbo.downstream.subsets.known_counts``), so the table never says "of 0" (the full HellaSwag run once
    did, its folder rewritten only inside the evaluation)."""
    import json

    from cbo.downstream import suite_data

    if suite_data.package_root() is None:
        pytest.skip(f"the suite's data package is not installed ({suite_data.INSTALL_COMMAND})")
    import cbo.downstream.harness as H
    import cbo.model.loading as L

    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))  # an empty home: no task folder yet
    monkeypatch.setattr(L, "load_model", lambda name, quiet=True: (object(), None))
    monkeypatch.setattr(H, "evaluate_tasks", lambda *a, **k: {"arc_easy": {"acc": 0.5, "acc_stderr": 0.1, "n": 3.0}})
    R = bench_module("suite_reference")
    R.main(["--tasks", "arc_easy", "--limit", "3", "--no-progress", "--out", str(tmp_path / "out")])
    row = json.loads((tmp_path / "out" / "suite_reference.json").read_text())["models"]["smollm2-135m"]["tasks"]
    assert row["arc_easy"]["items"] == 3 and row["arc_easy"]["items_full"] == 2376


def test_a_point_names_the_model_it_pruned(tmp_path):
    """The grid prunes each point's own model: the one its final_choice file names, the default model for a file
    written before files named one."""
    import json

    G = bench_module("suite_grid")
    row = {"remove": 4, "granularity": "layer", "seed": 0, "sets": {"refined": [1, 2, 3, 4]}}
    (tmp_path / "old.json").write_text(json.dumps({"rows": [row]}))
    (tmp_path / "gemma.json").write_text(json.dumps({"model": "gemma3-270m", "rows": [row]}))
    assert G.point_row(tmp_path / "old.json")["model"] == "smollm2-135m"
    assert G.point_row(tmp_path / "gemma.json") == {**row, "model": "gemma3-270m"}
    # seeds pool within one model: Gemma's 4 layers never join SmolLM2's
    assert G.pool_of(G.point_row(tmp_path / "old.json")) == "layer M = 4"
    assert G.pool_of(G.point_row(tmp_path / "gemma.json")) == "gemma3-270m, layer M = 4"
