"""Losses over chunks of positions (cbo.model.head) equal the losses of the full logits, on every tiny architecture."""

from __future__ import annotations

import pytest
import torch

import cbo.model.head
from cbo.evaluate import evaluate, reference_logits
from cbo.measure.measurer import Measurer
from cbo.model.blocks import find_blocks
from cbo.model.head import chunk_positions, position_logits

# 3 positions per chunk for the tiny models' 128-token vocabulary and batches of 4 windows
SMALL_CHUNK = 4 * 128 * 4 * 3


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(cbo.model.head, "CHUNK_BYTES", SMALL_CHUNK)


def full_reference(model, windows):
    """Independent reference: the model's own full logits, losses summed with plain torch."""
    with torch.no_grad():
        logits = model(input_ids=windows, use_cache=False).logits.float()
    return torch.log_softmax(logits, -1)


def test_chunk_positions_bounds_the_chunk_bytes():
    assert chunk_positions(8, 128, 262144, 128 * 2**20) == 16
    assert chunk_positions(8, 128, 10, 1) == 1
    assert chunk_positions(1, 5, 10) == 5


def test_position_logits_cover_every_position_in_order(any_arch, tiny_model, tiny_windows, small_chunks):
    model = tiny_model(any_arch)
    windows = tiny_windows(model, n=4, seq_len=10)
    want = full_reference(model, windows)
    pieces = list(position_logits(model, windows))
    starts = [s for s, _ in pieces]
    assert starts == sorted(starts) and starts[0] == 0
    if any_arch != "gpt2":  # GPT-2's forward reshapes the stream to the input's shape: one chunk of all positions
        assert len(pieces) == 4
    got = torch.cat([torch.log_softmax(z.float(), -1) for _, z in pieces], dim=1)
    assert torch.allclose(got, want, atol=1e-5)


def test_evaluate_chunked_equals_full_logits(any_arch, tiny_model, tiny_windows, small_chunks):
    model = tiny_model(any_arch)
    teacher = tiny_model(any_arch, seed=1)
    windows = tiny_windows(model, n=6, seq_len=10)
    ref = reference_logits(teacher, windows, batch_size=4)
    assert torch.allclose(ref, full_reference(teacher, windows), atol=1e-5)
    out = evaluate(model, windows, ref, batch_size=4)
    logp = full_reference(model, windows)
    nll = -logp[:, :-1].gather(-1, windows[:, 1:].unsqueeze(-1)).mean()
    kl = (ref.exp() * (ref - logp)).sum(-1).mean()
    agreement = (ref.argmax(-1) == logp.argmax(-1)).float().mean()
    assert out["nll"] == pytest.approx(float(nll), rel=1e-5)
    assert out["kl"] == pytest.approx(float(kl), rel=1e-4, abs=1e-7)
    assert out["agreement"] == pytest.approx(float(agreement))
    assert out["n_tokens"] == windows.shape[0] * (windows.shape[1] - 1)


@pytest.mark.parametrize("granularity", ["layer", "sublayer"])
def test_measurer_chunked_equals_unchunked(tiny_model, tiny_windows, monkeypatch, granularity):
    model = tiny_model("gemma3", n_layers=4)
    windows = tiny_windows(model, n=8, seq_len=12)
    blocks = find_blocks(model, granularity)
    sets = [(), (0,), (1, 2), (len(blocks) - 1,), tuple(range(1, len(blocks)))]
    whole = Measurer(model, blocks, windows, batch_size=4).losses(sets)
    monkeypatch.setattr(cbo.model.head, "CHUNK_BYTES", SMALL_CHUNK)
    chunked_meter = Measurer(model, blocks, windows, batch_size=4)
    chunked = chunked_meter.losses(sets)
    assert chunked_meter.work.full_passes == 0  # still replayed, not measured by full passes
    for metric in ("kl", "ce", "agreement"):
        assert chunked.__dict__[metric] == pytest.approx(whole.__dict__[metric], rel=1e-4, abs=1e-6)
    assert chunked.base_ce == pytest.approx(whole.base_ce, rel=1e-5)
