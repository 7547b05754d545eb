"""``prune_depth(refine=BUDGET)`` and ``cbo prune --refine BUDGET`` on tiny models."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from tiny_models import random_splits

from cbo.errors import CBOError, InvalidOptionError
from cbo.pipeline import prune_depth

SOLVE = dict(solver="enumerate", progress=False, cache_dir=None)


def _splits(model, tiny_windows, n_cal=6, n_val=6, seq_len=16):
    return random_splits(model, n_cal, n_val, seq_len)


def test_refine_chooses_a_set_at_least_as_good_on_validation(tiny_model, tiny_windows, tmp_path):
    from cbo.measure.measurer import measure_sets
    from cbo.model.blocks import find_blocks

    model = tiny_model("llama", n_layers=6, seed=3)
    splits = _splits(model, tiny_windows, n_cal=4, n_val=4)
    kw = dict(splits=splits, remove=3, top_k=10, validate=10, **SOLVE)
    plain = prune_depth(model, None, refine=None, **kw)  # the validated path
    refined = prune_depth(model, None, refine=2000, **{**kw, "cache_dir": tmp_path})
    assert refined.chosen.kl <= plain.chosen.kl + 1e-9

    # the refined candidates are measured sets, lowest calibration KL first; with this budget the loop measures
    # every one of the C(6, 3) sets, so its best is the brute-force best (an independent measurement)
    blocks = find_blocks(model, "layer")
    every = [list(s) for s in itertools.combinations(range(6), 3)]
    kl = measure_sets(model, blocks, splits.calibration, every)["kl"].mean(axis=1)
    assert refined.states.removed(0) == every[int(np.argmin(kl))]
    assert refined.states.energies[0] == pytest.approx(kl.min(), rel=1e-5)
    n_validated = min(10, len(refined.states))  # C(6, 3) = 20 sets: the loop may exhaust them first
    assert [v.removed for v in refined.validation] == [refined.states.removed(k) for k in range(n_validated)]

    work = refined.work["refine"]
    assert work["budget"] == 2000 and 0 < work["fpe"] <= 2000 + splits.calibration.shape[0]
    assert work["rounds"] >= 1 and work["stopped"] in ("exhausted", "budget")
    assert refined.work["estimate_fpe"] == plain.work["estimate_fpe"]
    # the total in one unit (one forward over one window): the plain run's estimate and validation, plus the rounds
    extra = refined.work["validation"]["fpe"] - plain.work["validation"]["fpe"]  # other candidates validated
    assert refined.work["total_fpe"] == pytest.approx(plain.work["total_fpe"] + work["fpe"] + 4 * extra, abs=0.05)
    assert refined.options["search"]["refine"] == 2000 and plain.options["search"]["refine"] is None
    assert "refine" in refined.timings
    meta = refined.qubo.metadata  # the surrogate says which estimate it refined, with that estimate's options
    assert meta["estimator"] == "refine" and meta["prior_estimator"] == plain.qubo.metadata["estimator"]
    assert meta["prior_options"] == plain.qubo.metadata["options"] and meta["prior_options"]
    again = json.loads(json.dumps(refined.to_json()))  # the report stays JSON
    assert again["work"]["refine"]["rounds"] == work["rounds"]

    # the rounds were checkpointed under the cache: a second run resumes and measures nothing new
    resumed = prune_depth(model, None, refine=2000, **{**kw, "cache_dir": tmp_path})
    assert resumed.chosen_blocks == refined.chosen_blocks
    assert resumed.work["refine"]["fpe"] == pytest.approx(work["fpe"])


def test_bad_refine_budgets_are_refused_before_any_forward_pass(tiny_model, tiny_windows, monkeypatch):
    model = tiny_model("llama", n_layers=4)
    splits = _splits(model, tiny_windows)

    def boom(*args, **kwargs):
        raise AssertionError("a forward pass ran before the refine budget was checked")

    monkeypatch.setattr(model, "forward", boom)
    for bad in (0, -5, True, "300", float("nan"), float("inf")):
        with pytest.raises(InvalidOptionError, match="refine must be a budget"):
            prune_depth(model, None, splits=splits, remove=1, refine=bad, **SOLVE)
    with pytest.raises(InvalidOptionError, match=r"cannot pay one round.*refine >= 50"):
        prune_depth(
            model, None, splits=splits, remove=1, refine=20, **SOLVE
        )  # 24 sets x 1 window + 4 x 5 more + 6 original passes
    with pytest.raises(CBOError, match="method='cbo' only"):
        prune_depth(model, None, splits=splits, remove=1, refine=300, method="sleb", **SOLVE)


def test_cli_prune_refine(tiny_model, tmp_path, monkeypatch):
    from tiny_texts import synthetic_novel
    from tiny_tokenizers import byte_level_tokenizer
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    register_commands()
    folder, text = tmp_path / "tiny-model", tmp_path / "novel.txt"
    tiny_model("llama", n_layers=5, vocab_size=260).save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    text.write_text(synthetic_novel())
    runner = CliRunner()
    small = ["--text", str(text), "--seq-len", "16", "--n-calibration", "4", "--n-validation", "3", "-q"]
    args = ["prune", str(folder), "--remove", "2", "--top", "4", "--validate", "3", "--solver", "enumerate"]

    res = runner.invoke(app, [*args, "--refine", "400", "--json", *small])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["options"]["search"]["refine"] == 400 and report["work"]["refine"]["rounds"] >= 1
    assert len(report["chosen"]["removed"]) == 2

    for bad in ("0", "-3", "10"):
        res = runner.invoke(app, [*args, "--refine", bad, *small])
        assert res.exit_code == 2 and "refine" in res.output, res.output
    res = runner.invoke(app, [*args, "--refine", "many", *small])
    assert res.exit_code == 2  # not a number: refused by the option parser
    res = runner.invoke(app, ["prune", "--help"], terminal_width=200)
    assert "--refine" in res.output and "forward-pass" in " ".join(res.output.split())
