"""The measurement engine of the measured estimators against surgically pruned models (an independent path:
``remove_blocks`` / ``remove_sublayers`` and a plain forward pass, losses written with torch.nn.functional)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hessian_reference import logits_of, ref_loss_per_sequence, teacher_logprobs
from tiny_models import EXTRA_ARCHS, TINY_ARCHS

from cbo.blocks import find_blocks
from cbo.hessian import Gates
from cbo.hessian.measure import MeasureCache, RemovalLosses, measure_sets
from cbo.surgery.depth import remove_blocks, remove_sublayers


def _pruned_losses(model, blocks, windows, removed, teacher):
    if all(blocks[i].kind == "layer" for i in removed):
        pruned = remove_blocks(model, [blocks[i].layer for i in removed])
    else:
        pruned = remove_sublayers(model, [blocks[i] for i in removed])
    with torch.no_grad():
        logits = logits_of(pruned, windows)
    return (
        ref_loss_per_sequence(logits, windows, "kl", teacher).numpy(),
        ref_loss_per_sequence(logits, windows, "ce").numpy(),
    )


@pytest.mark.parametrize("arch", TINY_ARCHS + EXTRA_ARCHS)
def test_prefix_tree_equals_pruned_models(tiny_model, tiny_windows, arch):
    model = tiny_model(arch, n_layers=5)
    windows = tiny_windows(model, n=3, seq_len=12)
    blocks = find_blocks(model, "layer")
    teacher = teacher_logprobs(model, windows)
    sets = [s for r in (1, 2, 4) for s in itertools.combinations(range(5), r)]
    meter = RemovalLosses(model, blocks, windows)
    got = meter.losses(sets)
    assert meter.replay, "the prefix tree should apply to every supported architecture"
    for s, g in zip(sets, got):
        kl, ce = _pruned_losses(model, blocks, windows, s, teacher)
        np.testing.assert_allclose(g["kl"].numpy(), kl, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(g["ce"].numpy(), ce, atol=2e-5, rtol=1e-4)
    # shared prefixes: far fewer layer calls than one forward per set
    assert meter.layer_calls < len(sets) * 5 / 2
    assert meter.full_calls == 0 and meter.original_calls == 1


def test_base_losses_and_empty_set(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=2, seq_len=10)
    blocks = find_blocks(model, "layer")
    meter = RemovalLosses(model, blocks, windows)
    (empty,) = meter.losses([()])
    ce = ref_loss_per_sequence(logits_of(model, windows).detach(), windows, "ce").numpy()
    np.testing.assert_allclose(empty["ce"].numpy(), ce, atol=1e-5)
    assert float(empty["kl"].abs().max()) < 1e-5
    with pytest.raises(IndexError, match="out of range"):
        meter.losses([(7,)])


def test_sublayer_blocks_fall_back_to_gated_passes(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=2)
    windows = tiny_windows(model, n=2, seq_len=10)
    blocks = find_blocks(model, "sublayer")
    teacher = teacher_logprobs(model, windows)
    sets = [(0,), (1, 2), (3,)]
    meter = RemovalLosses(model, blocks, windows)
    got = meter.losses(sets)
    assert not meter.replay and meter.full_calls == len(sets)
    for s, g in zip(sets, got):
        kl, ce = _pruned_losses(model, blocks, windows, s, teacher)
        np.testing.assert_allclose(g["kl"].numpy(), kl, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(g["ce"].numpy(), ce, atol=2e-5, rtol=1e-4)


def test_works_inside_an_estimators_gates(tiny_model, tiny_windows):
    model = tiny_model("qwen2", n_layers=4)
    windows = tiny_windows(model, n=2, seq_len=10)
    blocks = find_blocks(model, "layer")
    plain = RemovalLosses(model, blocks, windows).losses([(1,), (0, 3)])
    with Gates(model, blocks, requires_grad=True):
        gated = RemovalLosses(model, blocks, windows).losses([(1,), (0, 3)])
    for a, b in zip(plain, gated):
        np.testing.assert_allclose(a["kl"].numpy(), b["kl"].numpy(), atol=1e-6)


def test_cache_round_trip_and_reuse(tiny_model, tiny_windows, tmp_path):
    model = tiny_model("llama", n_layers=4)
    windows = tiny_windows(model, n=6, seq_len=10)
    blocks = find_blocks(model, "layer")
    sets = [(0,), (1, 2), (3,)]
    cache = MeasureCache(tmp_path, model, blocks)
    first = measure_sets(model, blocks, windows, sets, batch_size=4, cache=cache)
    assert first["measured"] == 2 * len(sets) and first["original_calls"] == 2
    again = measure_sets(
        model, blocks, windows, sets + [(2,)], batch_size=4, cache=MeasureCache(tmp_path, model, blocks)
    )
    assert again["measured"] == 2 and again["original_calls"] == 2  # only the new set, on both batches
    np.testing.assert_array_equal(first["kl"], again["kl"][:3])
    np.testing.assert_array_equal(first["ce"], again["ce"][:3])
    # another model never reads these values
    other = tiny_model("llama", n_layers=4, seed=1)
    fresh = measure_sets(
        other, find_blocks(other), windows, sets, batch_size=4, cache=MeasureCache(tmp_path, other, blocks)
    )
    assert fresh["measured"] == 2 * len(sets)
