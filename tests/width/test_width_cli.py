"""`cbo compress`, `cbo widths` and `cbo width-scores` on a tiny model folder with a word-level tokenizer."""

from __future__ import annotations

import json

import pytest
from tiny_models import save_word_model
from tiny_texts import word_texts
from typer.testing import CliRunner

from cbo.cli import app, register_commands


@pytest.fixture
def folder(tmp_path):
    save_word_model(tmp_path / "tiny-model", n_layers=6)
    return tmp_path / "tiny-model", word_texts(tmp_path / "text", 400)


SMALL = ["--seq-len", "16", "--n-calibration", "4", "--n-validation", "2", "--n-test", "2", "--no-speed"]


def test_compress_oneshot_and_mop(folder, tmp_path):
    register_commands()
    model, text = folder
    runner = CliRunner()
    out = tmp_path / "pruned"
    args = ["compress", str(model), "--ratio", "0.2", "--width", "ntk", "--text", str(text), "--out", str(out)]
    res = runner.invoke(app, [*args, "--json", str(tmp_path / "r.json"), *SMALL])
    assert res.exit_code == 0, res.output
    assert "perplexity" in res.output and "KL to original" in res.output
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["width"] == "ntk" and 0.1 < report["ratio"] < 0.3
    assert json.loads((tmp_path / "r.json").read_text())["params_after"] == report["params_after"]
    res = runner.invoke(app, ["widths", str(out)])
    assert res.exit_code == 0, res.output and "MLP width" in res.output

    args = ["compress", str(model), "-r", "0.3", "-s", "mop", "--criterion", "cosine", "-d", "antepenultimate"]
    res = runner.invoke(app, [*args, "--text", str(text), "--option", "head_norm=l1", *SMALL])
    assert res.exit_code == 0, res.output
    assert "MoP path:" in res.output


def test_compress_errors_and_score_list(folder):
    register_commands()
    model, text = folder
    runner = CliRunner()
    res = runner.invoke(app, ["compress", str(model), "--ratio", "1.5", "--text", str(text), *SMALL])
    assert res.exit_code == 2 and "ratio must be a finite number in (0, 1)" in res.output
    res = runner.invoke(app, ["compress", str(model), "--width", "wanda", "--text", str(text), *SMALL])
    assert res.exit_code == 2 and "unknown width score 'wanda'" in res.output
    res = runner.invoke(app, ["width-scores"])
    assert res.exit_code == 0 and all(n in res.output for n in ("afr", "amp", "magnitude", "ntk", "taylor"))


def test_prune_width_route(folder, tmp_path):
    """`cbo prune --width NAME --ratio R` prunes heads/neurons one-shot and saves a reloadable model."""
    from cbo.model.structures import layer_widths
    from cbo.surgery.io import load_pruned

    register_commands()
    model, text = folder
    runner = CliRunner()
    out = tmp_path / "w"
    small = ["--text", str(text), "--seq-len", "16", "--n-calibration", "4", "--n-validation", "2", "-q"]
    res = runner.invoke(app, ["prune", str(model), "--width", "magnitude", "--ratio", "0.2", "--out", str(out), *small])
    assert res.exit_code == 0, res.output
    assert "perplexity" in res.output and "KL to original" in res.output
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["width"] == "magnitude" and 0.1 < report["ratio"] < 0.3
    pruned = load_pruned(out)
    widths = layer_widths(pruned)
    assert len(widths) == 6  # width only: every layer kept
    assert sum(p.numel() for p in pruned.parameters()) == report["params_after"] < report["params_before"]
    res = runner.invoke(app, ["prune", str(model), "--width", "ntk", *small])
    assert res.exit_code == 2 and "--width needs --ratio" in res.output
    res = runner.invoke(app, ["prune", str(model), "--width", "ntk", "--ratio", "0.2", "--remove", "2", *small])
    assert res.exit_code == 2 and "cbo compress --depth cbo" in " ".join(res.output.split())
