"""A mistyped model name is refused at once with the nearest installable name and the installed models (it spent
53 s on hub retries with noisy logs); bare names the local hub cache holds, and org/name hub ids, still pass."""

from __future__ import annotations

import time

import pytest
from tiny_models import save_word_model
from typer.testing import CliRunner

from cbo.errors import ModelError
from cbo.model.loading import DEFAULT_MODEL, model_dir, resolve_model


def test_a_typo_is_refused_at_once_with_the_nearest_name(cbo_home, monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelError, match=r"Did you mean 'smollm2-135m'\?.*None is installed yet; run `make setup`"):
        resolve_model("smolm2-135m")
    save_word_model(model_dir(DEFAULT_MODEL), n_layers=2)
    start = time.perf_counter()
    with pytest.raises(ModelError, match=r"no model 'smolm2-135m'.*Installed here: smollm2-135m\."):
        resolve_model("smolm2-135m")
    with pytest.raises(ModelError, match="hub id .*organization/name") as caught:
        resolve_model("nothing-like-it")
    assert "Did you mean" not in str(caught.value) and time.perf_counter() - start < 1.0
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "hub" / "models--gpt2").mkdir(parents=True)  # a bare hub id downloaded before still loads
    assert resolve_model("gpt2") == "gpt2"


def test_the_cli_says_so_before_any_work(cbo_home, tmp_path):
    from cbo.cli import app, register_commands

    register_commands()
    res = CliRunner().invoke(app, ["hessian", "smolm2-135m", "-o", str(tmp_path / "q.cboq"), "-q"])
    assert res.exit_code == 2 and "Did you mean 'smollm2-135m'?" in " ".join(res.output.split())
    assert "Traceback" not in res.output and not (tmp_path / "q.cboq").exists()
