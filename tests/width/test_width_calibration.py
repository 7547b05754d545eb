"""KL-based calibration selection."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_tiny_model, random_token_windows

from cbo.errors import DataError
from cbo.evaluate import kl_to_reference, reference_logits
from cbo.width.calibration import candidate_batches, select_calibration
from cbo.width.prune import width_prune


def test_candidate_batches_are_disjoint_and_seeded():
    pool = torch.arange(40).reshape(20, 2)
    a = candidate_batches(pool, 4, 5, seed=3)
    b = candidate_batches(pool, 4, 5, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    rows = torch.cat(a)[:, 0].tolist()
    assert len(rows) == 20 and len(set(rows)) == 20  # disjoint while the pool allows it
    c = candidate_batches(pool, 5, 8, seed=0)  # 40 > 20: independent draws
    assert len(c) == 5 and all(len(set(x[:, 0].tolist())) == 8 for x in c)
    with pytest.raises(DataError, match="pool of at least 30"):
        candidate_batches(pool, 2, 30)


def test_select_calibration_keeps_the_lowest_kl():
    model = build_tiny_model("llama", n_layers=3)
    pool = random_token_windows(model, n=12, seq_len=12, seed=5)
    control = random_token_windows(model, n=4, seq_len=12, seed=9)
    candidates = candidate_batches(pool, 3, 4, seed=1)
    choice = select_calibration(model, candidates, control, ratio=0.2, score="taylor", round_to=8)
    ref = reference_logits(model, control)
    expected = []
    for batch in candidates:  # prune with each candidate independently and measure
        pruned, _ = width_prune(model, batch, ratio=0.2, score="taylor", round_to=8)
        expected.append(kl_to_reference(pruned, control, ref))
    assert choice.kl == pytest.approx(expected, rel=1e-5)
    assert choice.index == min(range(3), key=lambda i: expected[i])
    assert torch.equal(choice.windows, candidates[choice.index])
    assert "calibration batch" in choice.summary()
