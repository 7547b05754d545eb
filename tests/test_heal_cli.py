"""`cbo heal` on a tiny model folder: heals, saves a folder that reloads with the same logits, refuses bad input
before any work, and resumes an interrupted heal to the weights of an uninterrupted one."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import save_word_model
from tiny_texts import word_texts
from typer.testing import CliRunner

from cbo.cli import app, register_commands
from cbo.cli.heal_cmds import CHECKPOINT_FOLDER
from cbo.surgery.depth import remove_blocks
from cbo.surgery.io import load_pruned, save_pruned


@pytest.fixture
def folders(tmp_path):
    """(teacher folder, pruned folder, text folder): a tiny Llama with a word-level tokenizer, 2 of 6 layers gone."""
    teacher = tmp_path / "teacher"
    model, tok = save_word_model(teacher, n_layers=6)
    pruned = save_pruned(remove_blocks(model, [2, 3]), tmp_path / "pruned", tok)
    text = word_texts(tmp_path / "text", 400)
    register_commands()
    return teacher, pruned, text


def heal_args(folders, out, *extra):
    teacher, pruned, text = folders
    small = ["--text", str(text), "--seq-len", "16", "--n-calibration", "8", "--batch-size", "2"]
    return ["heal", str(pruned), "--teacher", str(teacher), "--out", str(out), *small, *extra]


def logits_of(model, windows):
    with torch.no_grad():
        return model(input_ids=windows).logits


def test_heal_saves_a_model_that_reloads_with_the_same_logits(folders, tmp_path):
    out = tmp_path / "healed"
    res = CliRunner().invoke(app, heal_args(folders, out, "--steps", "4", "--lr", "1e-2", "-q"))
    assert res.exit_code == 0, res.output
    assert "saved the healed model" in res.output
    assert not (out / CHECKPOINT_FOLDER).exists()  # the resumable state goes once the model is saved
    record = json.loads((out / "heal.json").read_text())
    assert record["steps"] == 4 and record["method"] == "lora" and record["loss"] == "kd"
    assert record["teacher"] == str(folders[0]) and len(record["losses"]) == 4

    healed = load_pruned(out)
    pruned = load_pruned(folders[1])
    assert healed.config.num_hidden_layers == 4 and healed.config.cbo_recovery["steps"] == 4
    windows = torch.randint(0, healed.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(logits_of(healed, windows), logits_of(pruned, windows))  # it trained
    # the same heal through the Python API: the saved folder holds exactly the model it trains
    from cbo.data.windows import make_splits
    from cbo.model.loading import load_model
    from cbo.recovery.healing import heal

    student, tok = load_model(folders[1])
    teacher, _ = load_model(folders[0])
    splits = make_splits(tok, folders[2], seq_len=16, n_calibration=8, n_validation=0, n_test=0, model=student)
    direct = heal(student, teacher, splits.calibration, steps=4, lr=1e-2, batch_size=2, method="lora").model
    assert torch.equal(logits_of(direct, windows), logits_of(healed, windows))


def test_bad_input_is_refused_before_any_work(folders, tmp_path):
    runner = CliRunner()
    cases = [
        (["--steps", "-1"], "steps must be an integer >= 0"),
        (["--steps", "2", "--batch-size", "0"], "batch_size must be an integer >= 1"),
        (["--steps", "2", "--schedule", "wobbly"], "unknown heal schedule 'wobbly'"),
        (["--steps", "2", "--lr", "0"], "lr must be a finite number > 0"),
    ]
    for extra, message in cases:
        res = runner.invoke(app, heal_args(folders, tmp_path / "o", *extra))
        assert res.exit_code == 2 and message in res.output, res.output
    res = runner.invoke(app, [*heal_args(folders, tmp_path / "o", "--steps", "2"), "--text", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in res.output
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    res = runner.invoke(app, heal_args(folders, foreign, "--steps", "2"))
    assert res.exit_code == 2 and "did not write" in res.output
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    res = runner.invoke(app, heal_args(folders, a_file, "--steps", "2"))
    assert res.exit_code == 2 and "is a file" in res.output
    teacher, _, text = folders
    res = runner.invoke(
        app, ["heal", str(text), "--teacher", str(teacher), "--steps", "2", "--out", str(tmp_path / "x")]
    )
    assert res.exit_code == 2 and "no config.json" in res.output
    assert not (tmp_path / "o").exists() and not (tmp_path / "x").exists()  # nothing written

    done = tmp_path / "done"
    assert runner.invoke(app, heal_args(folders, done, "--steps", "1", "-q")).exit_code == 0
    res = runner.invoke(app, heal_args(folders, done, "--steps", "1", "-q"))
    assert res.exit_code == 2 and "already holds a healed model" in res.output and "--resume" in res.output


def test_an_interrupted_heal_resumes_to_the_weights_of_an_uninterrupted_one(folders, tmp_path, monkeypatch):
    import cbo.recovery.healing as recovery

    options = ["--steps", "6", "--lr", "1e-2", "--checkpoint-every", "1", "--full", "-q"]
    whole = tmp_path / "whole"
    assert CliRunner().invoke(app, heal_args(folders, whole, *options)).exit_code == 0

    real_heal = recovery.heal

    def interrupted(*args, on_step=None, **kwargs):
        def stop_at_3(step, loss):
            on_step(step, loss)
            if step == 3:
                raise KeyboardInterrupt

        return real_heal(*args, on_step=stop_at_3, **kwargs)

    out = tmp_path / "resumed"
    monkeypatch.setattr(recovery, "heal", interrupted)
    res = CliRunner().invoke(app, heal_args(folders, out, *options))
    assert res.exit_code == 130, res.output
    assert "after step 3 of 6" in res.output and "--resume" in res.output
    assert (out / CHECKPOINT_FOLDER).is_dir() and not (out / "config.json").exists()
    monkeypatch.setattr(recovery, "heal", real_heal)
    res = CliRunner().invoke(app, heal_args(folders, out, *options))  # no --resume: refused
    assert res.exit_code == 2 and "unfinished heal" in res.output
    res = CliRunner().invoke(app, heal_args(folders, out, *options, "--resume"))
    assert res.exit_code == 0, res.output
    assert json.loads((out / "heal.json").read_text())["resumed_from"] == 3
    a, b = load_pruned(whole), load_pruned(out)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


def test_resume_without_a_checkpoint_says_so_and_quiet_is_quiet(folders, tmp_path):
    """`--resume` with no checkpoint in --out says it trains from step 0 (it did so silently), and -q prints neither
    weight-writing bars nor Python warnings (it printed "Writing model shards" and a FutureWarning)."""
    import warnings

    from cbo.recovery.healing import heal

    out = tmp_path / "healed"
    res = CliRunner().invoke(app, heal_args(folders, out, "--steps", "1", "--resume", "-q"))
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "--resume: " in text and "holds no unfinished heal (no checkpoint); training from step 0." in text
    assert "Writing model shards" not in res.output and "Warning" not in res.output and "it/s" not in res.output
    res = CliRunner().invoke(app, heal_args(folders, out, "--steps", "1", "--resume", "-q"))  # a healed model
    assert res.exit_code == 0 and "holds a healed model but no unfinished heal" in " ".join(res.output.split())
    teacher, pruned, text_folder = folders
    model = load_pruned(pruned)
    windows = torch.randint(0, model.config.vocab_size, (2, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        heal(model, None, windows, steps=1, method="full", batch_size=2, checkpoint_dir=tmp_path / "c", resume=True)
    assert any("holds no heal checkpoint; training from step 0" in str(w.message) for w in caught)
