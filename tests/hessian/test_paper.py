"""The ``paper`` estimator against the paper's recipe written out by hand: one gate per decoder layer scaling both
its attention and MLP branches, the per-sequence gradient of the mean next-token cross-entropy (true labels) of
each sequence alone (batch 1, plain autograd), ``H = AᵀA / n`` and no linear term."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cbo.errors import InvalidOptionError
from cbo.hessian import describe, estimate_hessian
from cbo.model.blocks import find_blocks


@contextmanager
def tied_gates(model, a):
    """Multiply the output of every attention and MLP branch of layer l by ``a[l]`` (forward hooks, by hand)."""
    handles = []

    def scale(layer):
        def hook(module, args, output):
            if isinstance(output, tuple):
                return (output[0] * a[layer].to(output[0].dtype), *output[1:])
            return output * a[layer].to(output.dtype)

        return hook

    try:
        for b in find_blocks(model, "sublayer"):
            handles.append(b.module.register_forward_hook(scale(b.layer)))
        yield
    finally:
        for h in handles:
            h.remove()


def ce_of(model, window):
    logits = model(input_ids=window[None], use_cache=False).logits[0].double()
    return F.cross_entropy(logits[:-1], window[1:])


def per_sequence_gradients(model, windows):
    """(n, N) gradients of each sequence's mean CE with respect to the tied layer gates, one sequence at a time."""
    n_layers = len(find_blocks(model, "layer"))
    rows = []
    for w in windows:
        a = torch.ones(n_layers, dtype=torch.float64, requires_grad=True)
        with tied_gates(model, a):
            (grad,) = torch.autograd.grad(ce_of(model, w), a)
        rows.append(grad.numpy())
    return np.array(rows)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "gpt2"])
def test_paper_h_is_the_mean_outer_product_of_per_sequence_tied_gate_gradients(tiny_model, tiny_windows, arch):
    model = tiny_model(arch, n_layers=3).double()
    windows = tiny_windows(model, n=5, seq_len=10)
    q = estimate_hessian(model, None, windows, estimator="paper", loss="ce", batch_size=2, progress=False)
    A = per_sequence_gradients(model, windows)
    H = A.T @ A / len(A)
    # float32 norms inside the float64 models: batch shapes change the rounding slightly
    np.testing.assert_allclose(q.H, H, rtol=1e-5, atol=1e-6 * np.abs(H).max())
    assert np.all(q.g == 0.0)  # no linear term
    x = np.array([1, 0, 1])
    assert q.energy(x) == pytest.approx(0.5 * x @ H @ x, rel=1e-5)
    md = q.metadata
    assert (md["estimator"], md["loss"], md["gradient_samples"]) == ("paper", "ce", 5)
    assert (md["forward_passes"], md["backward_passes"]) == (3, 3)


def test_the_reference_gradient_is_the_derivative_of_the_tied_gate(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=3).double()
    window = tiny_windows(model, n=1, seq_len=10)[0]
    A = per_sequence_gradients(model, window[None])[0]
    h = 2.0**-7  # float32 norms inside the float64 model: a step well above their rounding
    for layer in range(3):

        def loss_at(shift, layer=layer):
            a = torch.ones(3, dtype=torch.float64)
            a[layer] += shift
            with torch.no_grad(), tied_gates(model, a):
                return float(ce_of(model, window))

        assert A[layer] == pytest.approx((loss_at(h) - loss_at(-h)) / (2 * h), rel=2e-3, abs=1e-6)


def test_the_tied_gate_differs_from_fishers_layer_gate(tiny_model, tiny_windows):
    # fisher's layer gate scales the layer's output difference, so its MLP sees the ungated attention output:
    # another gradient, which is why the paper's gate is its own estimator
    model = tiny_model("llama", n_layers=3).double()
    windows = tiny_windows(model, n=4, seq_len=10)
    paper = estimate_hessian(model, None, windows, estimator="paper", loss="ce", progress=False)
    fisher = estimate_hessian(model, None, windows, estimator="fisher", loss="ce", labels="empirical", progress=False)
    scaled = fisher.H / (windows.shape[1] - 1)
    assert np.abs(paper.H - scaled).max() > 1e-3 * np.abs(scaled).max()


def test_paper_takes_the_cross_entropy_only_and_is_listed(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=2)
    windows = tiny_windows(model, n=2, seq_len=8)
    with pytest.raises(InvalidOptionError, match=r"supports loss \['ce'\], not 'kl'"):
        estimate_hessian(model, None, windows, estimator="paper", loss="kl", progress=False)
    assert describe()["paper"]["losses"] == "ce"


def test_the_paper_estimator_is_in_the_cli_listing():
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    register_commands()
    result = CliRunner().invoke(app, ["estimators"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "paper" in result.output
