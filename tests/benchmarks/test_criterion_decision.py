"""The criterion decision from fabricated scores: per point and pooled KL - CE equal a hand computation over the
items (MMLU's selection subjects pooled into one task, item-weighted), the rule keeps CE on a tie, and a set
without cached scores is a clear error."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bench_scripts import bench_module

from cbo.downstream.standard_tasks import expand

TASKS = ["arc_easy_validation", "arc_challenge_validation", "mmlu_selection"]
METRIC = {"arc_easy_validation": "acc", "arc_challenge_validation": "acc_norm", "mmlu_selection": "acc"}
SUBJECTS = expand("mmlu_selection")


def _write_set(cache, blocks, rng, p):
    """A set's cached scores; MMLU's items live under its subjects (1 to 4 items each, so a mean over subjects
    differs from the item-weighted one). Returns ``{task: {item: score}}`` with MMLU's subjects pooled."""
    items = {t: {str(i): {METRIC[t]: float(rng.random() < p)} for i in range(60)} for t in TASKS[:2]}
    for k, subject in enumerate(SUBJECTS):
        items[subject] = {str(i): {"acc": float(rng.random() < p)} for i in range(1 + k % 4)}
    flat = {t: {int(k): v[METRIC[t]] for k, v in items[t].items()} for t in TASKS[:2]}
    flat["mmlu_selection"] = {(s, int(k)): v["acc"] for s in SUBJECTS for k, v in items[s].items()}
    results = {t: {METRIC[t]: float(np.mean(list(flat[t].values())))} for t in TASKS}
    name = f"layer-{'-'.join(map(str, blocks))}-all.json"
    (cache / name).write_text(json.dumps({"results": results, "items": items}))
    return flat


def _choice(path, blocks):
    path.write_text(json.dumps({"rows": [{"sets": {"refined": blocks}}]}))
    return path


def test_per_point_and_pooled_differences_and_the_rule(tmp_path, monkeypatch):
    D = bench_module("criterion_decision")
    monkeypatch.setattr(D, "RESULTS", tmp_path)
    (tmp_path / "final_choice").mkdir()
    cache = tmp_path / "scores"
    cache.mkdir()
    rng = np.random.default_rng(0)
    sets = {"m8-s0": ([1, 2], [1, 3]), "m12-s0": ([4, 5], [4, 6])}  # (CE race, KL race)
    scores, kl_args = {}, []
    from benchmarks.suite_grid import POINTS

    for name, (ce, kl) in sets.items():
        _choice(tmp_path / "final_choice" / POINTS[name], ce)
        kl_file = _choice(tmp_path / f"{name}-kl.json", kl)
        kl_args.append(f"{name}={kl_file}")
        scores[name] = (_write_set(cache, ce, rng, 0.4), _write_set(cache, kl, rng, 0.6))
    out = tmp_path / "out"
    D.main(["--kl", ",".join(kl_args), "--cache", str(cache), "--out", str(out)])
    result = json.loads((out / "criterion_decision.json").read_text())

    def diff(name):
        ce, kl = scores[name]
        return np.mean([np.mean([kl[t][i] - ce[t][i] for i in ce[t]]) for t in TASKS])

    for name in sets:
        ce, kl = scores[name]
        assert result["points"][name]["kl"] == pytest.approx(np.mean([np.mean(list(kl[t].values())) for t in TASKS]))
        value, low, high = result["points"][name]["kl_minus_ce"]
        assert value == pytest.approx(diff(name)) and low <= value <= high
    pooled = result["pooled"]
    assert pooled[0] == pytest.approx(np.mean([diff(n) for n in sets]))
    assert result["decision"] == D.decide(pooled)
    assert D.decide([0.01, -0.003, 0.024]) == "ce" and D.decide([0.03, 0.01, 0.05]) == "kl"
    assert D.decide([-0.03, -0.05, -0.01]) == "ce"
    assert "pooled (mean of the points)" in (out / "criterion_decision.md").read_text()
    path = cache / "layer-4-5-all.json"
    done = json.loads(path.read_text())
    del done["items"][SUBJECTS[3]]  # one MMLU subject not scored: the pooled task is incomplete
    path.write_text(json.dumps(done))
    with pytest.raises(SystemExit, match=r"no scores of \['mmlu_selection'\] for the set \[4, 5\]"):
        D.main(["--kl", ",".join(kl_args), "--cache", str(cache), "--out", str(out)])
    (cache / "layer-4-6-all.json").unlink()
    with pytest.raises(SystemExit, match=r"no scores of .* for the set \[4, 6\]"):
        D.main(["--kl", ",".join(kl_args), "--cache", str(cache), "--out", str(out)])
