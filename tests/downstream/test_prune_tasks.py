"""`cbo prune --tasks`: the original and the pruned model on local lm-eval tasks after pruning; quiet output."""

from __future__ import annotations

import json

import pytest
from tiny_texts import synthetic_novel
from tiny_tokenizers import byte_level_tokenizer

from cbo.downstream.harness import evaluate_tasks
from cbo.downstream.local_tasks import CHOICE, CLOZE, TaskSizes, ensure_local_tasks

pytest.importorskip("lm_eval")


@pytest.fixture
def setup(tiny_model, cbo_home, tmp_path):
    """A tiny Llama folder with a byte-level tokenizer, a text folder, and local tasks made from a synthetic novel."""
    novel = tmp_path / "novel.txt"
    novel.write_text(synthetic_novel(), encoding="utf-8")
    ensure_local_tasks(text=novel, sizes=TaskSizes(cloze=6, choice=6))
    tokenizer = byte_level_tokenizer()
    model = tiny_model("llama", n_layers=3, vocab_size=len(tokenizer), max_position_embeddings=2048)
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = tmp_path / "text"
    text.mkdir()
    for k, chapter in enumerate(synthetic_novel(n_chapters=4).split("\n\n\n")):
        (text / f"doc{k}.txt").write_text(chapter)
    return folder, text, model, tokenizer


def _invoke(args):
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    register_commands()
    return CliRunner().invoke(app, args)


BASE = ["--remove", "1", "--top", "2", "--validate", "2", "--solver", "enumerate", "--seq-len", "16"]
BASE += ["--n-calibration", "2", "--n-validation", "2", "--no-cache"]


def test_prune_reports_tasks_of_the_original_and_the_chosen_model(setup, tmp_path):
    from cbo.surgery.depth import remove_blocks

    folder, text, model, tokenizer = setup
    args = ["prune", str(folder), *BASE, "--text", str(text), "--tasks", f"{CLOZE},{CHOICE}", "--tasks-limit", "3"]
    res = _invoke([*args, "-q", "--json", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    tasks = data["tasks"]
    assert tasks["tasks"] == [CLOZE, CHOICE] and tasks["limit"] == 3
    # independent reference: the same tasks run directly on the original and on the chosen layers removed
    original = evaluate_tasks(model, tokenizer, [CLOZE, CHOICE], limit=3, progress=False)
    pruned = evaluate_tasks(
        remove_blocks(model, data["chosen"]["removed"]), tokenizer, [CLOZE, CHOICE], limit=3, progress=False
    )
    for task in (CLOZE, CHOICE):
        assert tasks["original"][task] == pytest.approx(original[task])
        assert tasks["pruned"][task] == pytest.approx(pruned[task])
    assert json.loads((tmp_path / "out" / "tasks.json").read_text()) == tasks


def test_quiet_prune_with_tasks_prints_no_progress(setup):
    folder, text, _, _ = setup
    res = _invoke(["prune", str(folder), *BASE, "--text", str(text), "--tasks", CLOZE, "--tasks-limit", "2", "-q"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "downstream tasks (lm-eval)" in out and "chosen" in out
    for stray in ("it/s", "%|", "Loading weights", "Running loglikelihood", "loading ", "pruning ", "evaluating "):
        assert stray not in out, stray


def test_quiet_prune_prints_the_report_only(setup):
    folder, text, _, _ = setup
    res = _invoke(["prune", str(folder), *BASE, "--text", str(text), "-q"])
    assert res.exit_code == 0, res.output
    for stray in ("it/s", "%|", "Loading weights", "loading ", "pruning ", "hessian[", "measuring", "race: windows"):
        assert stray not in res.output, stray
    assert "chosen" in res.output and "downstream tasks" not in res.output


def test_unknown_task_fails_before_pruning(setup):
    folder, text, _, _ = setup
    res = _invoke(["prune", str(folder), *BASE, "--text", str(text), "--tasks", "no_such_task_xyz", "-q"])
    assert res.exit_code == 2 and "no_such_task_xyz" in res.output
    assert "chosen" not in res.output
