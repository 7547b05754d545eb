"""Evaluation: perplexity, KL, agreement against direct references; throughput; bad windows."""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.nn.functional as F

from cbo.errors import DataError
from cbo.evaluate import (
    count_parameters,
    evaluate,
    kl_to_reference,
    next_token_agreement,
    perplexity,
    reference_logits,
    throughput,
)
from cbo.surgery.depth import remove_blocks


def _direct(model, x):
    with torch.no_grad():
        return model(x).logits.float()


def test_perplexity_matches_cross_entropy(tiny_model, tiny_windows):
    model = tiny_model("qwen2", n_layers=3)
    x = tiny_windows(model, n=5, seq_len=10)
    logits = _direct(model, x)
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    assert perplexity(model, x, batch_size=2) == pytest.approx(math.exp(float(ce)), rel=1e-5)


def test_kl_and_agreement_match_direct_computation(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=4)
    pruned = remove_blocks(model, [1])
    x = tiny_windows(model, n=5, seq_len=10)
    ref = reference_logits(model, x, batch_size=3)
    assert ref.shape == (5, 10, 128) and ref.dtype == torch.float32
    logp = F.log_softmax(_direct(pruned, x), -1)
    expected_kl = F.kl_div(logp, ref, log_target=True, reduction="sum") / (5 * 10)
    expected_agree = (logp.argmax(-1) == ref.argmax(-1)).float().mean()
    assert kl_to_reference(pruned, x, ref, batch_size=2) == pytest.approx(float(expected_kl), rel=1e-5)
    assert next_token_agreement(pruned, x, ref) == pytest.approx(float(expected_agree))
    assert float(expected_kl) > 0


def test_model_against_its_own_reference(tiny_model, tiny_windows):
    model = tiny_model("gemma3", n_layers=2)
    x = tiny_windows(model, n=3, seq_len=12)
    ref = reference_logits(model, x)
    result = evaluate(model, x, ref, batch_size=2)
    assert result["kl"] == pytest.approx(0.0, abs=1e-6)
    assert result["agreement"] == 1.0
    assert result["n_tokens"] == 3 * 11
    assert result["n_params"] == count_parameters(model)
    assert result["ppl"] == pytest.approx(math.exp(result["nll"]))
    assert evaluate(model, x)["kl"] is None


def test_batch_size_does_not_change_results(tiny_model, tiny_windows):
    model = tiny_model("gpt_neox", n_layers=2)
    x = tiny_windows(model, n=7, seq_len=8)
    ref = reference_logits(remove_blocks(model, [0]), x)
    a, b = evaluate(model, x, ref, batch_size=1), evaluate(model, x, ref, batch_size=7)
    for key in ("nll", "kl", "agreement"):
        assert a[key] == pytest.approx(b[key], rel=1e-5)


def test_low_precision_reference(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=2)
    x = tiny_windows(model)
    ref = reference_logits(model, x, dtype=torch.bfloat16)
    assert ref.dtype == torch.bfloat16
    assert kl_to_reference(model, x, ref) < 1e-2


def test_count_parameters_counts_tied_weights_once(tiny_model):
    model = tiny_model("llama", n_layers=2, tie_word_embeddings=True)
    model.tie_weights()
    assert model.lm_head.weight is model.get_input_embeddings().weight
    unique = {id(p): p.numel() for p in model.parameters()}
    assert count_parameters(model) == sum(unique.values())
    untied = tiny_model("llama", n_layers=2)
    assert count_parameters(untied) == count_parameters(model) + 128 * 32


@pytest.mark.parametrize(
    "windows, match",
    [
        (torch.rand(2, 8), "integer"),
        (torch.zeros(8, dtype=torch.long), "shape"),
        (torch.zeros(2, 1, dtype=torch.long), "shape"),
        (torch.full((2, 8), 128), "different tokenizer"),
        (torch.full((2, 8), -1), "negative"),
        ([[1, 2, 3]], "torch.Tensor"),
    ],
)
def test_bad_windows(tiny_model, windows, match):
    with pytest.raises(DataError, match=match):
        perplexity(tiny_model("llama", n_layers=2), windows)


def test_reference_shape_mismatch(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=2)
    x = tiny_windows(model, n=3, seq_len=8)
    with pytest.raises(DataError, match="reference log-probs"):
        kl_to_reference(model, x, torch.zeros(2, 8, 128))


def test_int32_windows_are_accepted(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=2)
    x = tiny_windows(model)
    assert perplexity(model, x.int()) == pytest.approx(perplexity(model, x))


def test_throughput_reports_prefill_and_decode(tiny_model):
    model = tiny_model("llama", n_layers=2)
    result = throughput(model, prompt_len=16, new_tokens=4, batch_size=2, repeats=2)
    assert result["prefill_tokens_per_s"] > 0 and result["decode_tokens_per_s"] > 0
    assert result["prefill_tokens_per_s"] == pytest.approx(32 / result["prefill_s"])
    assert result["decode_tokens_per_s"] == pytest.approx(8 / result["decode_s"])
    assert result["peak_memory_bytes"] > 0 and result["device"] == "cpu"
    assert not model.training
    with pytest.raises(DataError):
        throughput(model, new_tokens=0)


def test_throughput_on_pruned_gpt2(tiny_model):
    result = throughput(remove_blocks(tiny_model("gpt2", n_layers=3), [1]), prompt_len=8, new_tokens=3, repeats=1)
    assert result["decode_tokens_per_s"] > 0


@pytest.mark.model
def test_default_model_perplexity_and_timing(default_model, default_text):
    from cbo.data.windows import make_splits

    model, tokenizer = default_model
    splits = make_splits(tokenizer, n_calibration=2, n_validation=0, n_test=4)
    ppl = perplexity(model, splits.test)
    assert 10 < ppl < 100  # unpruned SmolLM2-135M on Persuasion: about 40
    x = splits.calibration
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    loss = model(x, labels=x).loss
    loss.backward()
    elapsed = time.perf_counter() - t0
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    print(f"\none forward+backward on 2x128 tokens: {elapsed:.2f} s; test PPL {ppl:.1f}")
    assert math.isfinite(loss.item()) and len(grads) > 0
