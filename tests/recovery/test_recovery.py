"""cbo.recovery.healing: the distillation loss by hand, the step schedule, healing that helps, saves, reloads and resumes."""

from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from tiny_models import build_tiny_model

from cbo.errors import CBOError, CorruptFileError, DataError, InvalidOptionError, ModelError
from cbo.evaluate import kl_to_reference, reference_logits
from cbo.recovery.healing import (
    CHECKPOINT_FILE,
    Checkpoint,
    batch_indices,
    heal,
    kd_loss,
    lora_targets,
    lr_factor,
    next_token_loss,
)
from cbo.surgery.depth import remove_blocks
from cbo.surgery.io import load_pruned
from cbo.surgery.width import prune_width
from cbo.width.allocate import allocate
from cbo.width.scores import score_units


def depth_pruned(teacher):
    return remove_blocks(teacher, [1])


def width_pruned(teacher, windows):
    scores = score_units(teacher, windows, "magnitude")
    return prune_width(teacher, allocate(scores, ratio=0.2, round_to=8).plan)


def params_of(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# ------------------------------------------------------------------------------------------ pieces


def test_kd_loss_is_the_kl_of_the_teacher_to_the_student():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    p, q = t.softmax(-1), s.softmax(-1)
    expected = (p * (p.log() - q.log())).sum(-1).mean()  # mean over the 6 positions
    assert kd_loss(s, t).item() == pytest.approx(expected.item(), rel=1e-5)
    assert kd_loss(t, t).item() == pytest.approx(0.0, abs=1e-6)
    p2, q2 = (t / 2).softmax(-1), (s / 2).softmax(-1)
    expected_t2 = 4 * (p2 * (p2.log() - q2.log())).sum(-1).mean()
    assert kd_loss(s, t, temperature=2.0).item() == pytest.approx(expected_t2.item(), rel=1e-5)


def test_next_token_loss_by_hand():
    g = torch.Generator().manual_seed(1)
    logits, batch = torch.randn(2, 4, 7, generator=g), torch.randint(0, 7, (2, 4), generator=g)
    logp = logits.log_softmax(-1)
    expected = -torch.stack([logp[b, i, batch[b, i + 1]] for b in range(2) for i in range(3)]).mean()
    assert next_token_loss(logits, batch).item() == pytest.approx(expected.item(), rel=1e-6)


def test_batches_cover_every_window_once_per_epoch_and_are_seeded():
    epoch = torch.cat([batch_indices(10, 3, step, seed=4) for step in range(3)])  # 3 full batches per epoch
    assert len(set(epoch.tolist())) == 9 and all(0 <= i < 10 for i in epoch.tolist())
    assert torch.equal(batch_indices(10, 3, 5, seed=4), batch_indices(10, 3, 5, seed=4))
    assert not torch.equal(torch.cat([batch_indices(10, 3, s, 4) for s in range(3, 6)]), epoch)  # a new epoch
    assert batch_indices(2, 4, 0, 0).tolist() in ([0, 1], [1, 0])  # fewer windows than a batch: all of them


def test_learning_rate_schedules():
    assert [lr_factor(i, 4, 0, "linear") for i in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert [lr_factor(i, 4, 2, "constant") for i in range(4)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_factor(0, 4, 0, "cosine") == 1.0 and lr_factor(2, 4, 0, "cosine") == pytest.approx(0.5)


def test_lora_targets_are_the_seven_projections(teacher):
    assert lora_targets(teacher) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


# ------------------------------------------------------------------------------------------ healing


@pytest.mark.parametrize("method", ["full", "lora"])
def test_distillation_brings_the_student_closer_to_the_teacher(teacher, windows, method):
    student = depth_pruned(teacher)
    ref = reference_logits(teacher, windows)
    before = kl_to_reference(student, windows, ref)
    lr = 3e-3 if method == "full" else 1e-2
    result = heal(student, teacher, windows, steps=30, method=method, lr=lr, batch_size=4, schedule="constant")
    assert result.steps == 30 and result.resumed_from == 0
    assert sum(result.losses[-5:]) / 5 < 0.7 * result.losses[0]  # the training loss falls
    after = kl_to_reference(result.model, windows, ref)  # measured independently of the training loop
    assert after < 0.7 * before
    assert not result.model.training and all(p.requires_grad for p in result.model.parameters())
    assert result.model.config.cbo_recovery["method"] == method and result.model.config.cbo_recovery["steps"] == 30
    assert type(result.model) is type(teacher)  # LoRA adapters are merged away


def test_lm_loss_without_a_teacher(teacher, windows):
    result = heal(depth_pruned(teacher), None, windows, steps=10, method="full", lr=3e-3, batch_size=4)
    assert result.options.loss == "lm" and result.teacher is None
    assert result.losses[-1] < result.losses[0]


def test_a_healed_width_pruned_model_saves_and_reloads_with_identical_logits(teacher, windows, tmp_path):
    result = heal(width_pruned(teacher, windows), teacher, windows, steps=4, method="lora", lr=1e-2, batch_size=4)
    folder = result.save(tmp_path / "healed")
    again = load_pruned(folder)
    with torch.no_grad():
        assert torch.equal(result.model(input_ids=windows).logits, again(input_ids=windows).logits)
    assert again.config.cbo_recovery == result.record()
    record = json.loads((folder / "heal.json").read_text())
    assert record["losses"] == result.losses and record["method"] == "lora"


@pytest.mark.parametrize("method", ["full", "lora"])
def test_an_interrupted_heal_resumes_to_the_same_weights(teacher, windows, tmp_path, method):
    opts = dict(steps=7, method=method, lr=1e-2, batch_size=3, seed=5)
    whole = heal(depth_pruned(teacher), teacher, windows, **opts)

    def stop_at_four(step, loss):
        if step == 4:
            raise KeyboardInterrupt

    student = depth_pruned(teacher)
    untouched = params_of(student)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        heal(student, teacher, windows, checkpoint_dir=ckpt, checkpoint_every=3, on_step=stop_at_four, **opts)
    state = Checkpoint(ckpt).load()
    assert state["step"] == 4 and len(state["losses"]) == 4  # the step finished before Ctrl-C is kept
    if method == "lora":  # the adapters are removed again: the student is as it was
        assert all(torch.equal(p, untouched[n]) for n, p in student.named_parameters())
        assert type(student) is type(teacher)
    resumed = heal(depth_pruned(teacher), teacher, windows, checkpoint_dir=ckpt, resume=True, **opts)
    assert resumed.resumed_from == 4 and resumed.losses == whole.losses
    a, b = params_of(whole.model), params_of(resumed.model)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_resume_of_a_finished_heal_only_rebuilds_it(teacher, windows, tmp_path):
    opts = dict(steps=3, method="lora", lr=1e-2, batch_size=4, checkpoint_dir=tmp_path / "c")
    first = heal(depth_pruned(teacher), teacher, windows, **opts)
    calls = []
    again = heal(depth_pruned(teacher), teacher, windows, resume=True, on_step=lambda s, v: calls.append(s), **opts)
    assert calls == [] and again.resumed_from == 3 and again.losses == first.losses
    a, b = params_of(first.model), params_of(again.model)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_a_constant_schedule_heal_can_be_extended(teacher, windows, tmp_path):
    opts = dict(method="full", lr=1e-3, batch_size=4, schedule="constant", checkpoint_dir=tmp_path / "c")
    whole = heal(depth_pruned(teacher), teacher, windows, steps=5, method="full", lr=1e-3, batch_size=4,
                 schedule="constant")  # fmt: skip
    heal(depth_pruned(teacher), teacher, windows, steps=2, **opts)
    extended = heal(depth_pruned(teacher), teacher, windows, steps=5, resume=True, **opts)
    assert extended.losses == whole.losses


# ------------------------------------------------------------------------------------------ refused before work


def test_bad_options_are_refused_before_any_step(teacher, windows, tmp_path):
    student = depth_pruned(teacher)
    untouched = params_of(student)
    calls = []
    step = lambda s, v: calls.append(s)  # noqa: E731
    cases = [
        (dict(method="qlora"), InvalidOptionError, "unknown heal method"),
        (dict(loss="mse"), InvalidOptionError, "unknown heal loss"),
        (dict(schedule="step"), InvalidOptionError, "unknown heal schedule"),
        (dict(steps=-1), InvalidOptionError, "steps must be an integer >= 0"),
        (dict(lr=0.0), InvalidOptionError, "lr must be a finite number > 0"),
        (dict(batch_size=0), InvalidOptionError, "batch_size must be an integer >= 1"),
        (dict(warmup=99), InvalidOptionError, "warmup"),
        (dict(resume=True), InvalidOptionError, "resume=True needs the checkpoint_dir"),
        (dict(checkpoint_every=0, checkpoint_dir=tmp_path / "x"), InvalidOptionError, "checkpoint_every"),
        (dict(batch_size=9), DataError, "larger than the 8 training windows"),
    ]
    for extra, error, match in cases:
        opts = dict(steps=3, method="full", on_step=step) | extra
        with pytest.raises(error, match=match):
            heal(student, teacher, windows, **opts)
    with pytest.raises(InvalidOptionError, match="distils from a teacher"):
        heal(student, None, windows, steps=3, loss="kd", on_step=step)
    with pytest.raises(DataError, match="out of range"):
        heal(student, teacher, windows + 1000, steps=3, on_step=step)
    other = build_tiny_model("llama", n_layers=2, vocab_size=200)
    with pytest.raises(ModelError, match="share a vocabulary"):
        heal(student, other, windows, steps=3, on_step=step)
    assert calls == [] and all(torch.equal(p, untouched[n]) for n, p in student.named_parameters())


def test_checkpoints_of_another_heal_are_refused(teacher, windows, tmp_path):
    ckpt = tmp_path / "ckpt"
    heal(depth_pruned(teacher), teacher, windows, steps=2, method="lora", lr=1e-2, batch_size=4, checkpoint_dir=ckpt)
    with pytest.raises(InvalidOptionError, match="already holds a heal checkpoint"):
        heal(depth_pruned(teacher), teacher, windows, steps=2, method="lora", lr=1e-2, batch_size=4,
             checkpoint_dir=ckpt)  # fmt: skip
    with pytest.raises(InvalidOptionError, match="different heal .*lr"):
        heal(depth_pruned(teacher), teacher, windows, steps=2, method="lora", lr=5e-3, batch_size=4,
             checkpoint_dir=ckpt, resume=True)  # fmt: skip
    with pytest.raises(InvalidOptionError, match="different heal .*student"):
        heal(remove_blocks(teacher, [0]), teacher, windows, steps=2, method="lora", lr=1e-2, batch_size=4,
             checkpoint_dir=ckpt, resume=True)  # fmt: skip
    with pytest.raises(InvalidOptionError, match="different heal .*steps: checkpoint 2 vs now 3"):
        heal(
            depth_pruned(teacher),
            teacher,
            windows,
            steps=3,
            method="lora",
            lr=1e-2,
            batch_size=4,
            checkpoint_dir=ckpt,
            resume=True,
        )  # fmt: skip  (a linear schedule depends on the step count)
    constant = dict(method="full", lr=1e-3, batch_size=4, schedule="constant", checkpoint_dir=tmp_path / "constant")
    heal(depth_pruned(teacher), teacher, windows, steps=2, **constant)
    with pytest.raises(InvalidOptionError, match="2 steps done, more than steps=1"):
        heal(depth_pruned(teacher), teacher, windows, steps=1, resume=True, **constant)
    (ckpt / CHECKPOINT_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(CorruptFileError, match="cannot read the heal checkpoint"):
        heal(depth_pruned(teacher), teacher, windows, steps=2, method="lora", lr=1e-2, batch_size=4,
             checkpoint_dir=ckpt, resume=True)  # fmt: skip


def test_lora_without_peft_names_the_extra(teacher, windows, monkeypatch):
    # None in sys.modules makes every import of peft fail, whether or not an earlier test imported it
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(CBOError, match=r"pip install 'cbo\[peft\]'"):
        heal(depth_pruned(teacher), teacher, windows, steps=2, method="lora")


def test_the_student_is_trained_in_place_and_the_teacher_is_not(teacher, windows):
    before_teacher = params_of(teacher)
    student = depth_pruned(teacher)
    copy_before = copy.deepcopy(student)
    result = heal(student, teacher, windows, steps=3, method="full", lr=1e-2, batch_size=4)
    assert result.model is student
    assert any(not torch.equal(p, q) for p, q in zip(student.parameters(), copy_before.parameters()))
    assert all(torch.equal(p, before_teacher[n]) for n, p in teacher.named_parameters())


def test_the_docs_heal_example_runs(teacher, windows, tmp_path, monkeypatch):
    """The manual's healing example (docs/guides/heal.md), run as written on a tiny model (its names bound to tiny
    stand-ins)."""
    from types import SimpleNamespace

    from doc_examples import example

    code = example("heal")
    monkeypatch.chdir(tmp_path)
    pruned = depth_pruned(teacher)
    scope = {"pruned": pruned, "teacher": teacher, "splits": SimpleNamespace(calibration=windows), "tokenizer": None}
    exec(compile(code, "docs/guides/heal.md", "exec"), scope)
    result = scope["result"]
    ref = reference_logits(teacher, windows)
    assert result.steps == 50
    assert kl_to_reference(result.model, windows, ref) < kl_to_reference(depth_pruned(teacher), windows, ref)
    assert (tmp_path / "heal-ckpt" / CHECKPOINT_FILE).is_file()
    reloaded = load_pruned(tmp_path / "healed")
    batch = windows[:2]
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=batch).logits, result.model(input_ids=batch).logits)


def test_heal_is_a_lazy_top_level_export():
    import subprocess
    from pathlib import Path

    import cbo
    import cbo.recovery.healing

    assert cbo.heal is cbo.recovery.healing.heal and "heal" in cbo._LAZY
    # `import cbo` alone imports neither the recovery module nor torch; `cbo.heal` brings them in on first use
    code = (
        "import sys, cbo\n"
        "assert 'cbo.recovery.healing' not in sys.modules and 'torch' not in sys.modules\n"
        "assert cbo.heal.__module__ == 'cbo.recovery.healing' and 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
