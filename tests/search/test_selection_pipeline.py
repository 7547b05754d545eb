"""``prune_depth(select=N)`` and ``cbo prune --select N`` on tiny models; fresh windows (``cbo.data.pool``)."""

from __future__ import annotations

import json

import pytest
import torch

from cbo.data.pool import fresh_windows
from cbo.data.windows import TokenSplits, make_splits
from cbo.errors import DataError, InvalidOptionError
from cbo.pipeline import prune_depth
from cbo.pipeline.reports import DepthReport

SMALL = dict(seq_len=16, n_calibration=4, n_validation=4, solver="enumerate", progress=False)


@pytest.fixture
def tokenizer():
    from tiny_tokenizers import byte_level_tokenizer

    return byte_level_tokenizer()


def test_fresh_windows_are_the_unused_windows_of_the_validation_documents(novel_folder, tokenizer):
    splits = make_splits(tokenizer, novel_folder, seq_len=16, n_calibration=4, n_validation=4, n_test=0, seed=1)
    pool = fresh_windows(tokenizer, novel_folder, splits.info, used=[splits.calibration, splits.validation], seed=1)
    slots = splits.info["tokens_available"]["validation"] // 16
    # every slot but the 4 used ones, less a few that repeat an earlier one word for word (the synthetic text repeats)
    assert pool.shape[1] == 16 and 0.9 * (slots - 4) < pool.shape[0] <= slots - 4
    rows = {tuple(r) for r in pool.tolist()}
    assert len(rows) == pool.shape[0]
    assert not rows & {tuple(r) for r in splits.validation.tolist()}
    used = [splits.calibration, splits.validation]
    again = fresh_windows(tokenizer, novel_folder, splits.info, used=used, seed=1)
    assert torch.equal(pool, again)  # the same seed draws the same windows in the same order
    other = fresh_windows(tokenizer, novel_folder, splits.info, used=used, seed=2)
    assert not torch.equal(pool, other) and {tuple(r) for r in other.tolist()} == rows
    both = fresh_windows(tokenizer, novel_folder, splits.info, splits=("validation", "calibration"), seed=1)
    assert both.shape[0] > pool.shape[0]
    with pytest.raises(DataError, match="not \\['test'\\]"):
        fresh_windows(tokenizer, novel_folder, splits.info, splits=("test",))
    with pytest.raises(DataError, match="precomputed"):
        fresh_windows(tokenizer, novel_folder, {"source": "random"})


def test_prune_depth_races_the_validated_states(tiny_model, novel_folder, tokenizer, tmp_path):
    model = tiny_model("llama", n_layers=6, seed=3, vocab_size=260)
    kw = dict(remove=2, top_k=6, validate=6, cache_dir=tmp_path / "cache", **SMALL)
    report = prune_depth(model, tokenizer, novel_folder, select=40, select_options=dict(first=8), **kw)

    sel = report.selection
    assert sel["stopped"] in ("decided", "budget", "windows") and 0 < sel["windows"] <= 40
    assert sel["criterion"] == "ce" and sel["chosen"] == report.chosen_blocks
    finalists = {tuple(f["removed"]) for f in sel["finalists"]}
    assert finalists == {tuple(v.removed) for v in report.validation}  # all six validated states raced
    for f in sel["finalists"]:
        assert f["low"] <= f["diff"] <= f["high"] and f["ratio_low"] <= f["ratio"] <= f["ratio_high"]
    assert sel["finalists"][0]["status"] == "chosen"
    work = report.work["selection"]
    assert work["fpe"] > sel["windows"]  # the originals of the windows, and the finalists
    assert work["tokens"] == 16 * sel["windows"] and "selection" in report.timings
    assert report.work["total_fpe"] > work["fpe"] + report.work["estimate_fpe"]  # the race charged, per window
    assert report.states.info["selection"] == sel
    assert report.options["search"]["select"] == 40 and report.options["search"]["select_options"]["first"] == 8
    loaded = DepthReport.from_json(json.loads(json.dumps(report.to_json())))
    assert loaded.selection == json.loads(json.dumps(sel))
    assert loaded.states.info["selection"]["stopped"] == sel["stopped"]
    from rich.console import Console

    console = Console(record=True, width=200)
    loaded.print(console)  # the ranked states, then the race (Python users see what the CLI shows)
    shown = console.export_text()
    assert shown.index("validation") < shown.index(f"final selection by perplexity on {sel['windows']} fresh windows")

    # a rerun with the same seed chooses the same set and measures nothing new (the measurement cache)
    again = prune_depth(model, tokenizer, novel_folder, select=40, select_options=dict(first=8), **kw)
    assert again.chosen_blocks == report.chosen_blocks
    assert again.work["selection"]["fpe"] == 0
    assert again.selection["finalists"] == sel["finalists"]

    kl = prune_depth(model, tokenizer, novel_folder, select=40, select_options=dict(first=8, criterion="kl"), **kw)
    assert kl.selection["criterion"] == "kl" and "ratio" not in kl.selection["finalists"][1]


def test_select_is_checked_before_any_work(tiny_model, tiny_windows, tokenizer, novel_folder):
    model = tiny_model("llama", n_layers=4, vocab_size=260)
    for bad in (0, 1, 2.5, "40", True):
        with pytest.raises(InvalidOptionError, match="select"):
            prune_depth(model, tokenizer, novel_folder, remove=1, select=bad, **SMALL)
    with pytest.raises(InvalidOptionError, match="validate >= 2"):
        prune_depth(model, tokenizer, novel_folder, remove=1, select=40, validate=1, **SMALL)
    with pytest.raises(InvalidOptionError, match="method='sleb'"):
        prune_depth(model, tokenizer, novel_folder, remove=1, select=40, method="sleb", **SMALL)
    with pytest.raises(InvalidOptionError, match="criterion"):
        prune_depth(model, tokenizer, novel_folder, remove=1, select=40, select_options={"criterion": "ppl"}, **SMALL)
    splits = TokenSplits(*(tiny_windows(model, n=4, seq_len=16, seed=s) for s in (1, 2, 3)), {"source": "random"})
    with pytest.raises(DataError, match="precomputed"):
        prune_depth(model, tokenizer, remove=1, splits=splits, select=40, cache_dir=None, **SMALL)


def test_cli_prune_select(tiny_model, tmp_path, monkeypatch, novel_folder, tokenizer):
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    register_commands()
    folder = tmp_path / "tiny-model"
    tiny_model("llama", n_layers=5, vocab_size=260).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    runner = CliRunner()
    small = ["--text", str(novel_folder), "--seq-len", "16", "--n-calibration", "4", "--n-validation", "3", "-q"]
    args = ["prune", str(folder), "--remove", "2", "--top", "4", "--validate", "3", "--solver", "enumerate"]

    res = runner.invoke(app, [*args, "--select", "40", "--select-criterion", "kl", "--json", *small])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["selection"]["criterion"] == "kl" and report["options"]["search"]["select"] == 40
    assert report["selection"]["chosen"] == report["chosen"]["removed"]

    res = runner.invoke(app, [*args, "--select", "40", *small], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "final selection by perplexity" in res.output and "interval" in res.output

    for bad in ("0", "1"):
        res = runner.invoke(app, [*args, "--select", bad, *small])
        assert res.exit_code == 2 and "select" in res.output, res.output
    res = runner.invoke(app, [*args, "--select", "40", "--select-criterion", "ppl", *small])
    assert res.exit_code == 2 and "criterion" in res.output
    res = runner.invoke(app, ["prune", "--help"], terminal_width=200)
    assert "--select" in res.output and "--select-criterion" in res.output
