"""Depth baselines against their definitions, computed independently on tiny random models."""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pytest
import torch

from cbo import baselines as B
from cbo.errors import InfeasibleError, InvalidOptionError, UnknownNameError
from cbo.evaluate import perplexity
from cbo.model.blocks import find_blocks
from cbo.surgery.depth import remove_blocks, remove_sublayers

N_LAYERS = 5


@pytest.fixture
def llama(tiny_model):
    return tiny_model("llama", n_layers=N_LAYERS, seed=3)


@pytest.fixture
def windows(tiny_windows):
    return tiny_windows(128, n=6, seq_len=12, seed=1)


def _raw_hidden_states(model, windows):
    """hidden_states of HF's own output, with the final norm disabled so the last entry is the last layer's output."""
    m = copy.deepcopy(model)
    if hasattr(m, "model"):
        m.model.norm = torch.nn.Identity()
    else:
        m.transformer.ln_f = torch.nn.Identity()
    with torch.no_grad():
        return [h.double() for h in m(input_ids=windows, output_hidden_states=True, use_cache=False).hidden_states]


def _cos_mean(a, b):
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    return float((torch.nn.functional.cosine_similarity(a, b, dim=-1)).mean())


# ------------------------------------------------------------------------------------------ block influence
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_block_influence_matches_hidden_state_loop(tiny_model, windows, arch):
    model = tiny_model(arch, n_layers=N_LAYERS, seed=2)
    hs = _raw_hidden_states(model, windows)
    expected = np.array([1.0 - _cos_mean(hs[i], hs[i + 1]) for i in range(N_LAYERS)])
    r = B.rank_blocks("block_influence", model, windows, batch_size=4)  # two batches: accumulation across them
    np.testing.assert_allclose(r.scores, expected, rtol=1e-9, atol=1e-12)
    for m in (1, 2, 4):
        assert r.select(m) == sorted(np.argsort(expected, kind="stable")[:m].tolist())
    assert r.passes["forward"] == 2


def test_block_influence_sublayer_matches_surgery(llama, windows):
    """The state between the two halves of layer k is layer k's output once its MLP is removed."""
    hs = _raw_hidden_states(llama, windows)
    expected = []
    for k in range(N_LAYERS):
        no_mlp = remove_sublayers(llama, [(k, "mlp")])
        mid = _raw_hidden_states(no_mlp, windows)[k + 1]
        expected += [1.0 - _cos_mean(hs[k], mid), 1.0 - _cos_mean(mid, hs[k + 1])]
    r = B.rank_blocks("block_influence", llama, windows, granularity="sublayer")
    np.testing.assert_allclose(r.scores, expected, rtol=1e-6, atol=1e-9)
    assert r.names[:2] == ["layers.0.attn", "layers.0.mlp"]


def test_keep_and_caps_are_respected(llama, windows):
    r = B.rank_blocks("block_influence", llama, windows, keep=[3, "layers.4"])
    assert not {3, 4} & set(r.select(3))
    assert r.max_remove() == N_LAYERS - 2
    with pytest.raises(InfeasibleError):
        r.select(4)
    s = B.rank_blocks("block_influence", llama, windows, granularity="sublayer")
    chosen = s.select(4, caps={"attention": 1})
    assert sum(s.kinds[i] == "attention" for i in chosen) <= 1
    # brute force: the feasible 4-set with the smallest total score
    feasible = [c for c in itertools.combinations(range(10), 4) if sum(s.kinds[i] == "attention" for i in c) <= 1]
    assert chosen == list(min(feasible, key=lambda c: sum(s.scores[i] for i in c)))


# ------------------------------------------------------------------------------------------ angular
def test_angular_matches_direct_computation(llama, windows):
    hs = _raw_hidden_states(llama, windows)
    last = [h[:, -1] for h in hs]  # (B, d) per boundary

    def dist(a, b):
        cos = torch.nn.functional.cosine_similarity(last[a], last[b], dim=-1).clamp(-1, 1)
        return float((torch.arccos(cos) / math.pi).mean())

    r = B.rank_blocks("angular", llama, windows)
    for n in range(1, N_LAYERS):
        ds = [dist(start, start + n) for start in range(N_LAYERS - n + 1)]
        for start, d in enumerate(ds):
            assert r.distances[start, start + n] == pytest.approx(d, rel=1e-6, abs=1e-9)
        best = int(np.argmin(ds))
        assert r.select(n) == list(range(best, best + n))
    # a kept block forces the run elsewhere
    kept = B.rank_blocks("angular", llama, windows, keep=[r.select(2)[0]])
    assert r.select(2)[0] not in kept.select(2)
    assert kept.select(2) == sorted(kept.select(2)) and np.all(np.diff(kept.select(2)) == 1)


# ------------------------------------------------------------------------------------------ ppl and sleb
def _nll(model, windows):
    return math.log(perplexity(model, windows, batch_size=4))


def test_ppl_matches_remove_blocks_and_perplexity(llama, windows):
    expected = np.array([_nll(remove_blocks(llama, [i]), windows) for i in range(N_LAYERS)])
    r = B.rank_blocks("ppl", llama, windows, batch_size=4)
    np.testing.assert_allclose(r.scores, expected, rtol=1e-5)
    assert r.select(2) == sorted(np.argsort(expected)[:2].tolist())
    # through the measurer's prefix tree: one original pass per batch, no model copy, no full pass per set
    work = r.info["measurement"]
    assert r.passes["forward"] == work["original_passes"] == 2 and work["full_passes"] == 0
    assert work["set_evaluations"] == 2 * N_LAYERS
    # removing layer i runs the layers after it: Σ_i (N − 1 − i) decoder-layer calls per batch, plus the replay's
    # check of the last layer against the original logits, once per batch
    assert work["layer_calls"] == 2 * (sum(N_LAYERS - 1 - i for i in range(N_LAYERS)) + 1)


def test_ppl_sublayer_matches_remove_sublayers(llama, windows):
    blocks = find_blocks(llama, "sublayer")
    expected = np.array([_nll(remove_sublayers(llama, [b]), windows) for b in blocks])
    r = B.rank_blocks("ppl", llama, windows, granularity="sublayer")
    np.testing.assert_allclose(r.scores, expected, rtol=1e-5)


def test_sleb_matches_brute_force_greedy(llama, windows):
    removed, losses = [], []
    for _ in range(3):
        trial = {i: _nll(remove_blocks(llama, removed + [i]), windows) for i in range(N_LAYERS) if i not in removed}
        best = min(trial, key=trial.get)
        removed.append(best)
        losses.append(trial[best])
    r = B.rank_blocks("sleb", llama, windows, max_remove=3, batch_size=4)
    assert r.order == removed
    np.testing.assert_allclose(r.order_losses, losses, rtol=1e-5)
    assert r.info["measurement"]["set_evaluations"] == 2 * (5 + 4 + 3)
    assert r.passes["forward"] == 2 * 3  # one original pass per batch and greedy step
    for m in (1, 2, 3):
        assert B.select_blocks("sleb", llama, windows, m, batch_size=4) == sorted(removed[:m])
    with pytest.raises(InfeasibleError):
        r.select(4)


def test_sleb_kl_loss_and_caps(llama, windows):
    blocks = find_blocks(llama, "sublayer")
    r = B.rank_blocks("sleb", llama, windows, granularity="sublayer", max_remove=3, caps={"attention": 1}, loss="kl")
    assert sum(blocks[i].kind == "attention" for i in r.order) <= 1
    # first step: KL of each single removal, measured against the original model by hand
    with torch.no_grad():
        ref = torch.log_softmax(llama(input_ids=windows).logits.float(), -1)

    def kl(i):
        m = remove_sublayers(llama, [blocks[i]])
        with torch.no_grad():
            logq = torch.log_softmax(m(input_ids=windows).logits.float(), -1)
        return float((ref.exp() * (ref - logq)).sum(-1).mean())

    first = min(range(len(blocks)), key=kl)
    assert r.order[0] == first
    # the measurer's KL is Σp·log p − Σp·z + logsumexp(z) in float32: an absolute rounding error of a few 1e-8
    assert r.order_losses[0] == pytest.approx(kl(first), rel=1e-5, abs=2e-7)


# ------------------------------------------------------------------------------------------ taylor
def test_taylor_matches_manual_weight_gradient_sum(llama, windows):
    model = copy.deepcopy(llama)
    logits = model(input_ids=windows).logits.float()
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    loss.backward()
    layers = model.model.layers
    expected = np.array([sum(float((p.detach() * p.grad).abs().sum()) for p in layer.parameters()) for layer in layers])

    r = B.rank_blocks("taylor", llama, windows, batch_size=4, protect=(0, 0))
    np.testing.assert_allclose(r.info["importance"], expected, rtol=1e-4)
    assert r.select(2) == sorted(np.argsort(expected)[:2].tolist())
    assert all(p.grad is None for p in llama.parameters())  # the model's gradients are left as they were

    plus = B.rank_blocks("taylor", llama, windows, protect=(1, 1))
    assert set(plus.select(3)) == {1, 2, 3}
    with pytest.raises(InfeasibleError):
        plus.select(4)


def test_taylor_sublayer_sums_the_half_and_its_norm(llama, windows):
    model = copy.deepcopy(llama)
    logits = model(input_ids=windows).logits.float()
    torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1)
    ).backward()

    def s(*mods):
        return sum(float((p.detach() * p.grad).abs().sum()) for m in mods for p in m.parameters())

    expected = []
    for layer in model.model.layers:
        expected += [s(layer.self_attn, layer.input_layernorm), s(layer.mlp, layer.post_attention_layernorm)]
    r = B.rank_blocks("taylor", llama, windows, granularity="sublayer", protect=None)
    np.testing.assert_allclose(r.info["importance"], expected, rtol=1e-4)


# ------------------------------------------------------------------------------------------ plumbing
def test_methods_registry_and_errors(llama, windows):
    assert B.methods() == ["angular", "block_influence", "blockpruner", "evopress", "ppl", "sleb", "taylor"]
    with pytest.raises(UnknownNameError, match="unknown depth baseline 'nope'"):
        B.select_blocks("nope", llama, windows, 2)
    with pytest.raises(InvalidOptionError, match="option"):
        B.select_blocks("block_influence", llama, windows, 2, loss="kl")
    with pytest.raises(InfeasibleError):
        B.select_blocks("ppl", llama, windows, N_LAYERS)
    r = B.rank_blocks("ppl", llama, windows)
    again = B.Ranking.from_json(r.to_json())
    assert again.select(2) == r.select(2)


def test_prune_depth_dispatches_to_baselines(llama, windows, tiny_windows):
    from cbo.data.windows import TokenSplits
    from cbo.pipeline import depth_methods, prune_depth

    assert set(B.methods()) <= set(depth_methods())
    splits = TokenSplits(windows, tiny_windows(128, n=4, seq_len=12, seed=9), windows[:0])
    report = prune_depth(llama, splits=splits, remove=2, method="block_influence", progress=False, cache_dir=None)
    assert report.chosen_blocks == B.select_blocks("block_influence", llama, windows, 2)
    assert report.pruned_model.config.num_hidden_layers == N_LAYERS - 2


def test_sleb_interrupted_resumes_from_its_measurement_cache(llama, windows, tmp_path, monkeypatch):
    """An interrupted SLEB run started again measures only what it had not measured; the result is the same."""
    import cbo.measure.measurer as measure

    full = B.rank_blocks("sleb", llama, windows, max_remove=3, batch_size=4)
    real, calls = measure.measure_sets, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # step 1 done (two batches), interrupted in step 2
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(measure, "measure_sets", interrupted)
    with pytest.raises(KeyboardInterrupt):
        B.rank_blocks("sleb", llama, windows, max_remove=3, batch_size=4, cache_dir=tmp_path)
    monkeypatch.setattr(measure, "measure_sets", real)
    resumed = B.rank_blocks("sleb", llama, windows, max_remove=3, batch_size=4, cache_dir=tmp_path)
    assert resumed.order == full.order and resumed.order_losses == full.order_losses
    assert resumed.info["measurement"]["sets"] == 2 * (4 + 3)  # step 1 came from the cache
    again = B.rank_blocks("sleb", llama, windows, max_remove=3, batch_size=4, cache_dir=tmp_path)
    assert again.order_losses == full.order_losses
    assert again.info["measurement"]["sets"] == 0 and again.passes["forward"] == 0
