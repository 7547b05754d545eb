"""What a pruning ratio is a fraction of: the decoder layers' parameters by default, all of them on request; both
fractions reported, by compress, `cbo compress` / `cbo prune --width` and the depth report."""

from __future__ import annotations

import json

import pytest
from tiny_models import CharTokenizer, build_tiny_model

from cbo.errors import InfeasibleError, InvalidOptionError
from cbo.evaluate import count_parameters
from cbo.model.blocks import find_blocks, prunable_parameters
from cbo.pipeline.compression import compress

TEXT = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want. " * 12,
    "However little known the feelings or views of such a man may be on his first entering a neighbourhood. " * 12,
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite. " * 12,
]
SMALL = dict(seq_len=24, n_calibration=6, n_validation=3, n_test=3, measure_speed=False)


@pytest.fixture(scope="module")
def model():
    # a 260-token vocabulary and untied embeddings: a large share of the parameters no pruning can remove
    return build_tiny_model("llama", n_layers=6, vocab_size=260)


def test_prunable_parameters_are_the_decoder_layers(model):
    layers = sum(p.numel() for layer in model.model.layers for p in layer.parameters())
    assert prunable_parameters(model) == layers == sum(b.n_params for b in find_blocks(model, "layer"))
    assert layers < count_parameters(model)


@pytest.mark.parametrize("ratio_of", ["blocks", "model"])
def test_the_target_is_a_fraction_of_the_named_denominator(model, ratio_of):
    r = compress(model, CharTokenizer(), TEXT, ratio=0.3, ratio_of=ratio_of, **SMALL)
    prunable, total = prunable_parameters(model), count_parameters(model)
    denominator = prunable if ratio_of == "blocks" else total
    assert r.target_params == round(0.3 * denominator)
    removed = r.params_before - r.params_after
    assert r.prunable_before == prunable
    assert r.ratio == pytest.approx(removed / total) and r.prunable_ratio == pytest.approx(removed / prunable)
    # width pruning reaches its target to within one MLP rounding step and head per layer
    assert abs(removed - r.target_params) <= 0.02 * prunable
    assert f"{r.prunable_ratio:.1%} of the decoder layers'" in r.summary()
    assert r.settings["ratio_of"] == ratio_of and r.to_json()["prunable_ratio"] == pytest.approx(r.prunable_ratio)


def test_bad_denominators_fail_before_any_work(model):
    with pytest.raises(InvalidOptionError, match="ratio_of"):
        compress(model, CharTokenizer(), TEXT, ratio=0.3, ratio_of="embeddings", **SMALL)
    share = prunable_parameters(model) / count_parameters(model)
    with pytest.raises(InfeasibleError, match="decoder layers hold only"):
        compress(model, CharTokenizer(), TEXT, ratio=min(0.99, share + 0.05), ratio_of="model", **SMALL)


def test_cli_prune_width_prints_both_fractions(model, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    register_commands()
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(33 + i): i for i in range(200)} | {"[UNK]": 200}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    text = tmp_path / "text"
    text.mkdir()
    for k, doc in enumerate(TEXT * 2):
        (text / f"doc{k}.txt").write_text(doc)
    runner = CliRunner()
    args = ["prune", str(folder), "--width", "magnitude", "--ratio", "0.25", "--text", str(text), "--seq-len", "16"]
    args += ["--n-calibration", "3", "--n-validation", "2", "-q"]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["settings"]["ratio_of"] == "blocks" and report["target_params"] == round(
        0.25 * report["prunable_before"]
    )
    res = runner.invoke(app, [*args, "--ratio-of", "model", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["target_params"] == round(0.25 * report["params_before"])
    res = runner.invoke(app, ["prune", "--help"], env={"COLUMNS": "250"})
    assert "--ratio-of" in res.output and "decoder layers" in " ".join(res.output.split())
