"""Estimators against independent references: finite differences of the loss (exact), one-sequence-at-a-time
autograd (fisher), losses measured on surgically pruned models (pairwise)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hessian_reference import ARCHS, logits_of, mean_loss_at, ref_loss_per_sequence, teacher_logprobs

from cbo.hessian import estimate_hessian
from cbo.hessian.base import seeded_generator
from cbo.model.blocks import find_blocks
from cbo.model.gates import gate_blocks
from cbo.surgery.depth import remove_blocks, remove_sublayers


def _state(n, removed):
    x = np.zeros(n, dtype=np.uint8)
    x[list(removed)] = 1
    return x


@pytest.mark.parametrize("loss", ["kl", "ce"])
@pytest.mark.parametrize("arch", ARCHS)
def test_exact_hessian_equals_finite_differences_of_the_loss(tiny_model, tiny_windows, arch, loss):
    model = tiny_model(arch, n_layers=3).double()
    windows = tiny_windows(model, n=4, seq_len=10)
    blocks = find_blocks(model, "layer")
    teacher = teacher_logprobs(model, windows)
    q = estimate_hessian(model, None, windows, estimator="exact", loss=loss, batch_size=3, progress=False)
    n = len(blocks)
    h = 2.0**-6

    def L(*shifts):
        a = np.ones(n)
        for i, s in shifts:
            a[i] += s
        return mean_loss_at(model, blocks, windows, a, loss, teacher)

    H = np.zeros((n, n))
    for i in range(n):
        H[i, i] = (L((i, h)) - 2 * L() + L((i, -h))) / h**2
        for j in range(i + 1, n):
            H[i, j] = H[j, i] = (L((i, h), (j, h)) - L((i, h), (j, -h)) - L((i, -h), (j, h)) + L((i, -h), (j, -h))) / (
                4 * h**2
            )
    g = np.array([(L((i, h)) - L((i, -h))) / (2 * h) for i in range(n)])
    scale = np.abs(H).max()
    tol = 2e-2 if arch == "gemma3" else 5e-3
    np.testing.assert_allclose(q.H, H, rtol=tol, atol=tol * scale)
    np.testing.assert_allclose(q.g, g, atol=tol * max(scale, np.abs(g).max()))
    if loss == "kl":
        assert np.abs(q.g).max() < 1e-6 * scale  # the gradient of a divergence at its minimum
    # the energy is the second-order prediction of the loss increase: E(x) ≈ L(1 - x) - L(1) for small x
    x = np.full(n, 0.01)
    predicted = 0.5 * x @ q.H @ x - q.g @ x
    measured = mean_loss_at(model, blocks, windows, 1 - x, loss, teacher) - L()
    assert predicted == pytest.approx(measured, rel=0.03, abs=1e-3 * scale * 0.01**2)


def test_exact_vectorized_equals_the_loop(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=3).double()
    windows = tiny_windows(model, n=4, seq_len=10)
    loop = estimate_hessian(model, None, windows, estimator="exact", loss="ce", progress=False)
    vec = estimate_hessian(model, None, windows, estimator="exact", loss="ce", progress=False, vectorize=True)
    np.testing.assert_allclose(vec.H, loop.H, rtol=1e-10, atol=1e-12)


def _per_sequence_reference(model, blocks, windows, labels, positions):
    """Gate gradient of each sequence's mean NLL of ``labels``, computed one sequence at a time."""
    grads = []
    with gate_blocks(model, blocks) as a:
        for s in range(windows.shape[0]):
            logits = logits_of(model, windows[s : s + 1]).double()[:, :positions]
            nll = F.cross_entropy(logits[0], labels[s], reduction="mean")
            grads.append(torch.autograd.grad(nll, a)[0].double().numpy())
    return np.array(grads)


@pytest.mark.parametrize("loss", ["kl", "ce"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fisher_empirical_equals_the_mean_outer_product_of_per_sequence_gradients(tiny_model, tiny_windows, arch, loss):
    model = tiny_model(arch, n_layers=3).double()
    windows = tiny_windows(model, n=5, seq_len=10)
    blocks = find_blocks(model, "layer")
    q = estimate_hessian(
        model, None, windows, estimator="fisher", loss=loss, labels="empirical", batch_size=2, progress=False
    )
    T = windows.shape[1]
    G = _per_sequence_reference(model, blocks, windows, windows[:, 1:], T - 1)
    H = (T - 1) * G.T @ G / len(G)
    # float32 RMSNorm inside the float64 models: batch shapes change the rounding slightly
    np.testing.assert_allclose(q.H, H, rtol=1e-5, atol=1e-6 * np.abs(H).max())
    np.testing.assert_allclose(q.g, G.mean(0) if loss == "ce" else 0.0, rtol=1e-5, atol=1e-6 * np.abs(G).max())


@pytest.mark.parametrize("loss", ["kl", "ce"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_fisher_sampled_equals_the_mean_outer_product_of_per_sequence_gradients(tiny_model, tiny_windows, arch, loss):
    model = tiny_model(arch, n_layers=3).double()
    windows = tiny_windows(model, n=5, seq_len=10)
    blocks = find_blocks(model, "layer")
    bs, draws, seed = 2, 2, 7
    q = estimate_hessian(
        model, None, windows, estimator="fisher", loss=loss, samples=draws, batch_size=bs, seed=seed, progress=False
    )
    T = windows.shape[1]
    positions = T if loss == "kl" else T - 1
    outer = []
    for b in range(0, windows.shape[0], bs):
        batch = windows[b : b + bs]
        with torch.no_grad():
            lp = F.log_softmax(logits_of(model, batch).double(), -1)[:, :positions]
        for draw in range(draws):
            gen = seeded_generator(seed, b // bs, draw)
            labels = torch.multinomial(lp.exp().reshape(-1, lp.shape[-1]), 1, generator=gen).reshape(lp.shape[:2])
            outer.append(_per_sequence_reference(model, blocks, batch, labels, positions))
    G = np.concatenate(outer)
    H = positions * G.T @ G / len(G)
    np.testing.assert_allclose(q.H, H, rtol=1e-5, atol=1e-6 * np.abs(H).max())
    if loss == "ce":
        Gt = _per_sequence_reference(model, blocks, windows, windows[:, 1:], T - 1)
        np.testing.assert_allclose(q.g, Gt.mean(0), rtol=1e-5, atol=1e-6 * np.abs(Gt).max())
    assert q.metadata["fisher_gradient_samples"] == windows.shape[0] * draws


def test_fisher_with_sampled_labels_estimates_the_exact_kl_hessian(tiny_model, tiny_windows):
    """The scaling: with many label draws the sampled Fisher converges to the exact Hessian of the mean KL."""
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=40, seq_len=12)
    exact = estimate_hessian(model, None, windows, estimator="exact", loss="kl", batch_size=40, progress=False)
    fisher = estimate_hessian(
        model, None, windows, estimator="fisher", loss="kl", samples=60, batch_size=40, progress=False
    )
    err = np.abs(fisher.H - exact.H).max() / np.abs(exact.H).max()
    assert err < 0.1, (fisher.H, exact.H)


def _measured_losses(model, windows, loss, sets, remove):
    teacher = teacher_logprobs(model, windows)
    with torch.no_grad():
        base = float(ref_loss_per_sequence(logits_of(model, windows), windows, loss, teacher).mean())
        out = {}
        for s in sets:
            pruned = remove(model, s)
            out[s] = float(ref_loss_per_sequence(logits_of(pruned, windows), windows, loss, teacher).mean()) - base
    return out


@pytest.mark.parametrize("loss", ["kl", "ce"])
@pytest.mark.parametrize("arch", ARCHS)
def test_pairwise_energy_reproduces_every_single_and_pair(tiny_model, tiny_windows, arch, loss):
    model = tiny_model(arch, n_layers=4)
    windows = tiny_windows(model, n=5, seq_len=12)
    n = 4
    q = estimate_hessian(
        model, None, windows, estimator="pairwise", loss=loss, couplings="raw", batch_size=2, progress=False
    )
    sets = [(i,) for i in range(n)] + list(itertools.combinations(range(n), 2))
    measured = _measured_losses(model, windows, loss, sets, remove_blocks)
    for s, d in measured.items():
        assert q.energy(_state(n, s)) == pytest.approx(d, rel=1e-4, abs=1e-6), s
    # one original pass per batch (3 batches); the sets share streams through the measurer's prefix tree
    assert q.metadata["forward_passes"] == 3
    assert 1 < q.metadata["fpe"] < 1 + len(sets)


def test_pairwise_sublayers_reproduce_every_single_and_pair(tiny_model, tiny_windows):
    model = tiny_model("qwen2", n_layers=2)
    windows = tiny_windows(model, n=3, seq_len=12)
    blocks = find_blocks(model, "sublayer")
    q = estimate_hessian(
        model, None, windows, estimator="pairwise", granularity="sublayer", couplings="raw", progress=False
    )
    assert q.kinds == ("attention", "mlp", "attention", "mlp")
    sets = [(i,) for i in range(4)] + list(itertools.combinations(range(4), 2))
    measured = _measured_losses(model, windows, "kl", sets, lambda m, s: remove_sublayers(m, [blocks[i] for i in s]))
    for s, d in measured.items():
        assert q.energy(_state(4, s)) == pytest.approx(d, rel=1e-4, abs=1e-6), s


def test_pairwise_positive_couplings_and_scale(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=4)
    windows = tiny_windows(model, n=3, seq_len=12)
    kw = dict(estimator="pairwise", loss="kl", progress=False)
    raw = estimate_hessian(model, None, windows, couplings="raw", **kw)
    pos = estimate_hessian(model, None, windows, couplings="positive", **kw)
    half = estimate_hessian(model, None, windows, couplings="raw", coupling_scale=0.5, **kw)
    off = ~np.eye(4, dtype=bool)
    assert (raw.H[off] < 0).any()  # tiny models show sub-additive damage too
    np.testing.assert_allclose(np.diag(pos.H), np.diag(raw.H))
    np.testing.assert_allclose(pos.H[off], np.maximum(raw.H[off], 0))
    np.testing.assert_allclose(half.H[off], 0.5 * raw.H[off])
    assert pos.metadata["measured"] == raw.metadata["measured"]


def test_estimators_give_block_names_kinds_sizes_and_metadata(tiny_model, tiny_windows):
    from cbo.data.windows import data_hash

    model = tiny_model("gemma3", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=8)
    q = estimate_hessian(model, None, windows, estimator="fisher", granularity="sublayer", progress=False)
    blocks = find_blocks(model, "sublayer")
    assert q.names == tuple(b.name for b in blocks)
    assert q.kinds == ("attention", "mlp") * 3
    assert list(q.sizes) == [b.n_params for b in blocks]
    md = q.metadata
    assert md["data_hash"] == data_hash(windows)
    assert md["n_tokens"] == 32 and md["n_sequences"] == 4 and md["seq_len"] == 8
    assert (md["estimator"], md["loss"], md["granularity"]) == ("fisher", "kl", "sublayer")
    assert md["options"] == {"labels": "sampled", "samples": 1}
    assert md["forward_passes"] == 1 and md["backward_passes"] == 1
    assert np.all(np.linalg.eigvalsh(q.H) > -1e-12)  # a Fisher matrix is positive semi-definite


def test_bfloat16_model_accumulates_in_float32(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=12)
    kw = dict(estimator="fisher", loss="ce", labels="empirical", progress=False)
    full = estimate_hessian(model, None, windows, **kw)
    half = estimate_hessian(model.to(torch.bfloat16), None, windows, **kw)
    assert half.H.dtype == np.float64 and np.all(np.isfinite(half.H))
    assert half.metadata["dtype"] == "bfloat16"
    np.testing.assert_allclose(half.H, full.H, rtol=0.2, atol=0.05 * np.abs(full.H).max())
