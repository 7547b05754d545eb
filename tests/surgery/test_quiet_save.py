"""`-q` means no weight-writing bars: save_pruned(progress=False) and `cbo prune -q --out` print no "Writing model
shards" (issue 38: -q still printed them)."""

from __future__ import annotations

from tiny_models import build_tiny_model, save_word_model
from tiny_texts import word_texts
from typer.testing import CliRunner

from cbo.surgery.io import save_pruned


def test_save_pruned_without_progress_prints_no_bar(tmp_path, capfd):
    model = build_tiny_model("llama", n_layers=2)
    save_pruned(model, tmp_path / "loud")
    assert "Writing model shards" in capfd.readouterr().err  # the bar this option turns off
    save_pruned(model, tmp_path / "quiet", progress=False)
    assert "Writing model shards" not in capfd.readouterr().err


def test_cbo_prune_quiet_writes_no_bars(tmp_path, capfd):
    from cbo.cli import app, register_commands

    save_word_model(tmp_path / "model", n_layers=4)
    text = word_texts(tmp_path / "text", 400)
    register_commands()
    capfd.readouterr()  # the test's own saving above
    args = ["prune", str(tmp_path / "model"), "--remove", "1", "--top", "2", "--validate", "2", "--text", str(text)]
    args += ["--n-calibration", "2", "--n-validation", "2", "--seq-len", "16", "--no-refine", "--no-select"]
    res = CliRunner().invoke(app, [*args, "--no-cache", "-q", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    captured = capfd.readouterr()
    assert "Writing model shards" not in captured.err + captured.out + res.output
    assert (tmp_path / "out" / "config.json").is_file()
