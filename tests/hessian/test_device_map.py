"""Hessian estimators on models dispatched with accelerate (device_map): the same QUBO as the plain model.

Every entry of the device maps here is a CPU entry (or "disk"), but `force_hooks=True` makes
accelerate wrap each block in an AlignDevicesHook exactly as it does across GPUs, and "disk"
offload leaves the parameters of those blocks on the meta device between forward passes.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

accelerate = pytest.importorskip("accelerate")
from accelerate import dispatch_model  # noqa: E402
from accelerate.hooks import AlignDevicesHook  # noqa: E402

from cbo.hessian import estimate_hessian  # noqa: E402
from cbo.model.fingerprint import model_fingerprint  # noqa: E402


def _device_map(n_layers: int, offload: tuple[int, ...] = ()) -> dict[str, str]:
    dm = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    for i in range(n_layers):
        dm[f"model.layers.{i}"] = "disk" if i in offload else "cpu"
    return dm


def _dispatched(model, offload=(), offload_dir=None):
    d = dispatch_model(
        copy.deepcopy(model),
        device_map=_device_map(len(model.model.layers), offload),
        force_hooks=True,
        offload_dir=str(offload_dir) if offload_dir is not None else None,
    )
    for layer in d.model.layers:
        assert isinstance(layer._hf_hook, AlignDevicesHook)
    return d


@pytest.fixture
def setup(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=4, seed=3)
    windows = tiny_windows(model, n=4, seq_len=10, seed=1)
    return model, windows


def _estimate(model, windows, estimator, **kw):
    return estimate_hessian(model, None, windows, estimator=estimator, batch_size=2, progress=False, seed=0, **kw)


@pytest.mark.parametrize("estimator", ["singles", "fisher", "exact", "pairwise", "hybrid"])
def test_dispatched_model_gives_the_same_qubo(setup, estimator):
    model, windows = setup
    ref = _estimate(model, windows, estimator)
    d = _dispatched(model)
    got = _estimate(d, windows, estimator)
    assert np.abs(ref.H).max() > 0
    np.testing.assert_allclose(got.H, ref.H, rtol=1e-10, atol=1e-12 * np.abs(ref.H).max())
    np.testing.assert_allclose(got.g, ref.g, rtol=1e-10, atol=1e-12 * max(np.abs(ref.H).max(), 1.0))
    assert got.metadata["model_fingerprint"] == ref.metadata["model_fingerprint"]
    # the same energy for every removal set
    X = np.array([[int(i in s) for i in range(ref.n)] for s in itertools.combinations(range(ref.n), 2)])
    np.testing.assert_allclose(got.energy(X), ref.energy(X), rtol=1e-9, atol=1e-12 * np.abs(ref.H).max())
    # the gates are gone after the run, the accelerate hooks stay, and the model still computes the same logits
    for layer in d.model.layers:
        assert not layer._forward_hooks
        assert isinstance(layer._hf_hook, AlignDevicesHook)
    with torch.no_grad():
        torch.testing.assert_close(d(windows).logits, model(windows).logits, rtol=0, atol=0)


def test_offloaded_blocks_give_the_same_fisher_and_sublayer_qubo(setup, tmp_path):
    model, windows = setup
    d = _dispatched(model, offload=(1, 3), offload_dir=tmp_path)
    assert d.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    assert model_fingerprint(d) == model_fingerprint(model)
    for granularity in ("layer", "sublayer"):
        ref = _estimate(model, windows, "fisher", granularity=granularity)
        got = _estimate(d, windows, "fisher", granularity=granularity)
        np.testing.assert_allclose(got.H, ref.H, rtol=1e-10, atol=1e-12 * np.abs(ref.H).max())
        assert got.n == ref.n == (4 if granularity == "layer" else 8)


def test_exact_hessian_through_offloaded_blocks(setup, tmp_path):
    """Double backward through weights that accelerate loads per forward pass and then drops."""
    model, windows = setup
    d = _dispatched(model, offload=(0, 3), offload_dir=tmp_path)
    ref = _estimate(model, windows, "exact", loss="ce")
    got = _estimate(d, windows, "exact", loss="ce")
    np.testing.assert_allclose(got.H, ref.H, rtol=1e-9, atol=1e-12 * np.abs(ref.H).max())
    np.testing.assert_allclose(got.g, ref.g, rtol=1e-9, atol=1e-12 * np.abs(ref.g).max())


def test_measured_singles_through_offloaded_blocks(setup, tmp_path):
    """The default estimator replays decoder layers one by one from stored streams: through accelerate's hooks,
    with weights loaded per call from disk, it must measure what the plain model measures, on the prefix path
    (no fall-back to full gated passes)."""
    model, windows = setup
    d = _dispatched(model, offload=(0, 2), offload_dir=tmp_path)
    ref = _estimate(model, windows, "singles")
    got = _estimate(d, windows, "singles")
    np.testing.assert_allclose(got.H, ref.H, rtol=1e-9, atol=1e-12 * np.abs(ref.H).max())
    assert got.metadata["layer_calls"] == ref.metadata["layer_calls"] > 0
