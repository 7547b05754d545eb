"""Heal checkpoints are data: a crafted pickle in a checkpoint folder is refused and never runs (issue 38, case 1);
the state codec round-trips what a heal stores."""

from __future__ import annotations

import io

import pytest
import torch
from typer.testing import CliRunner

from cbo.errors import CorruptFileError
from cbo.recovery.healing import CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, heal
from cbo.recovery.state_codec import StateFormatError, decode_state, encode_state
from cbo.surgery.depth import remove_blocks


class Payload:
    """Unpickling this creates the file ``marker`` (what a crafted checkpoint would do with any code)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def crafted(marker) -> bytes:
    buf = io.BytesIO()
    torch.save({"version": 1, "step": 0, "payload": Payload(marker)}, buf)
    return buf.getvalue()


@pytest.mark.parametrize("name", [CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE])
def test_a_crafted_pickle_checkpoint_is_refused_and_never_runs(teacher, windows, tmp_path, name):
    marker = tmp_path / "payload-ran"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / name).write_bytes(crafted(marker))
    student = remove_blocks(teacher, [1])
    with pytest.raises(CorruptFileError, match=name.replace(".", r"\.")):
        heal(student, teacher, windows, steps=2, method="full", batch_size=4, checkpoint_dir=folder, resume=True)
    assert not marker.exists()


def test_cbo_heal_resume_never_runs_a_crafted_checkpoint(tmp_path):
    from tiny_models import save_word_model
    from tiny_texts import word_texts

    from cbo.cli import app, register_commands
    from cbo.cli.heal_cmds import CHECKPOINT_FOLDER
    from cbo.surgery.io import save_pruned

    model, tok = save_word_model(tmp_path / "teacher", n_layers=4)
    pruned = save_pruned(remove_blocks(model, [2]), tmp_path / "pruned", tok)
    text = word_texts(tmp_path / "text", 200)
    register_commands()
    marker = tmp_path / "payload-ran"
    out = tmp_path / "out"
    (out / CHECKPOINT_FOLDER).mkdir(parents=True)
    for name in (CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE):
        (out / CHECKPOINT_FOLDER / name).write_bytes(crafted(marker))
        args = ["heal", str(pruned), "--teacher", str(tmp_path / "teacher"), "--out", str(out), "--text", str(text)]
        args += ["--seq-len", "16", "--n-calibration", "4", "--batch-size", "2", "--steps", "1", "--full", "-q"]
        res = CliRunner().invoke(app, [*args, "--resume"])
        assert res.exit_code != 0 and "heal checkpoint" in res.output and "delete it" in " ".join(res.output.split())
        assert not marker.exists()
        (out / CHECKPOINT_FOLDER / name).unlink()


def test_a_truncated_or_mangled_checkpoint_is_a_corrupt_file(teacher, windows, tmp_path):
    ckpt = tmp_path / "ckpt"
    options = dict(steps=2, method="full", lr=1e-3, batch_size=4, schedule="constant", checkpoint_dir=ckpt)
    heal(remove_blocks(teacher, [1]), teacher, windows, **options)
    data = (ckpt / CHECKPOINT_FILE).read_bytes()
    (ckpt / CHECKPOINT_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match="cannot read the heal checkpoint"):
        heal(remove_blocks(teacher, [1]), teacher, windows, resume=True, **options)
    state = decode_state(data)
    state["trainable"] = {k: torch.zeros(1) for k in state["trainable"]}  # right names, wrong shapes
    (ckpt / CHECKPOINT_FILE).write_bytes(encode_state(state))
    student = remove_blocks(teacher, [1])
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    with pytest.raises(CorruptFileError, match="shapes"):
        heal(student, teacher, windows, resume=True, **{**options, "steps": 3})
    assert all(torch.equal(p, before[n]) for n, p in student.named_parameters())


def test_the_state_codec_round_trips_optimizer_state():
    w = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.AdamW([w], lr=1e-2)
    w.sum().backward()
    opt.step()
    state = {"step": 1, "optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "losses": [1.5, float("nan")]}
    state["fingerprint"] = {"lr": 0.01, "teacher": None, "shape": (3, 2)}
    back = decode_state(encode_state(state))
    assert back["step"] == 1 and back["fingerprint"] == state["fingerprint"] and back["losses"][1] != back["losses"][1]
    assert list(back["optimizer"]["state"]) == [0] and back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert torch.equal(back["rng"], state["rng"])
    opt.load_state_dict(back["optimizer"])  # what a resumed heal does with it
    for bad in (b"", b"\xff" * 8 + b"{}", b"\x02\x00\x00\x00\x00\x00\x00\x00{}"):
        with pytest.raises(StateFormatError):
            decode_state(bad)
