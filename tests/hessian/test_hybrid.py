"""``hybrid``: the diagonal against losses measured on surgically pruned models, the couplings against the Fisher
correlations of the ``fisher`` estimator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hessian_reference import logits_of, ref_loss_per_sequence, teacher_logprobs

from cbo.errors import CBOError
from cbo.hessian import estimate_hessian
from cbo.surgery.depth import remove_blocks


def measured_increase(model, windows, removed, loss):
    """Mean loss increase with the given layers deleted (reference: surgery + torch.nn.functional)."""
    teacher = teacher_logprobs(model, windows) if loss == "kl" else None
    with torch.no_grad():
        base = ref_loss_per_sequence(logits_of(model, windows), windows, loss, teacher).mean()
        pruned = remove_blocks(model, list(removed))
        value = ref_loss_per_sequence(logits_of(pruned, windows), windows, loss, teacher).mean()
    return float(value - base)


@pytest.mark.parametrize("loss", ["kl", "ce"])
def test_diagonal_is_the_measured_single_removal_loss(tiny_model, tiny_windows, loss):
    model = tiny_model("llama", n_layers=4)
    windows = tiny_windows(model, n=5, seq_len=10)
    q = estimate_hessian(model, None, windows, estimator="hybrid", loss=loss, batch_size=2, progress=False)
    ref = [measured_increase(model, windows, [i], loss) for i in range(4)]
    np.testing.assert_allclose(np.diag(q.H) / 2, ref, atol=1e-5, rtol=1e-4)
    assert np.all(q.g == 0)
    # a single removal's energy is its measured loss increase
    for i in range(4):
        x = np.zeros(4)
        x[i] = 1
        assert q.energy(x) == pytest.approx(ref[i], abs=1e-5)
    assert q.metadata["set_evaluations"] == 4 * 3  # N singles on each of the 3 batches
    assert q.metadata["backward_passes"] == 3


def test_couplings_are_fisher_correlations_scaled_by_the_measured_diagonal(tiny_model, tiny_windows):
    model = tiny_model("qwen2", n_layers=5)
    windows = tiny_windows(model, n=6, seq_len=12)
    kw = dict(loss="kl", batch_size=3, seed=3, progress=False)
    raw = estimate_hessian(model, None, windows, estimator="hybrid", couplings="raw", **kw)
    pos = estimate_hessian(model, None, windows, estimator="hybrid", couplings="positive", coupling_scale=0.5, **kw)
    none = estimate_hessian(model, None, windows, estimator="hybrid", couplings="none", **kw)
    fisher = estimate_hessian(model, None, windows, estimator="fisher", **kw)  # same labels (same seed)
    F = fisher.H
    rho = F / np.sqrt(np.outer(np.diag(F), np.diag(F)))
    D = np.diag(raw.H) / 2
    expected = 2 * rho * np.sqrt(np.outer(D, D))
    off = ~np.eye(5, dtype=bool)
    np.testing.assert_allclose(raw.H[off], expected[off], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(pos.H[off], 0.5 * np.maximum(expected, 0)[off], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(np.diag(pos.H), np.diag(raw.H))
    assert np.all(none.H[off] == 0) and none.metadata["backward_passes"] == 0
    # the Gram model: a pair's energy is D_i + D_j + 2 ρ_ij √(D_i D_j)
    x = np.zeros(5)
    x[[1, 3]] = 1
    assert raw.energy(x) == pytest.approx(D[1] + D[3] + expected[1, 3])


def test_measure_cache_is_reused(tiny_model, tiny_windows, tmp_path):
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=10)
    kw = dict(batch_size=2, progress=False, couplings="none", measure_cache=str(tmp_path))
    first = estimate_hessian(model, None, windows, estimator="hybrid", **kw)
    second = estimate_hessian(model, None, windows, estimator="hybrid", coupling_scale=2.0, **kw)
    assert first.metadata["set_evaluations_measured"] == 6
    assert second.metadata["set_evaluations_measured"] == 0
    np.testing.assert_array_equal(np.diag(first.H), np.diag(second.H))


@pytest.mark.parametrize(
    "options",
    [{"couplings": "negative"}, {"coupling_scale": -1.0}, {"samples": 0}, {"measure_cache": 3}],
)
def test_bad_options_are_refused(tiny_model, tiny_windows, options):
    model = tiny_model("llama", n_layers=2)
    with pytest.raises(CBOError):
        estimate_hessian(
            model, None, tiny_windows(model, n=2, seq_len=8), estimator="hybrid", progress=False, **options
        )
