"""The measurer against surgically pruned models (an independent path: ``remove_blocks`` / ``remove_sublayers`` and
a plain forward pass, losses written with torch.nn.functional) and against the full gated pass."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hessian_reference import logits_of, ref_loss_per_sequence, teacher_logprobs
from tiny_models import EXTRA_ARCHS, TINY_ARCHS

from cbo.errors import InvalidOptionError, ModelError
from cbo.measure import replay as replay_module
from cbo.measure.measurer import MeasureCache, Measurer, RemovalLosses, Work, measure_sets
from cbo.model.blocks import find_blocks
from cbo.model.gates import Gates
from cbo.surgery.depth import remove_blocks, remove_sublayers


def _pruned(model, blocks, removed):
    if all(blocks[i].kind == "layer" for i in removed):
        return remove_blocks(model, [blocks[i].layer for i in removed])
    return remove_sublayers(model, [blocks[i] for i in removed])


def _pruned_losses(model, blocks, windows, removed, teacher):
    """(KL, CE, agreement) per sequence of the surgically pruned model."""
    with torch.no_grad():
        logits = logits_of(_pruned(model, blocks, removed), windows)
    agree = (logits.argmax(-1) == teacher.argmax(-1)).double().mean(-1).numpy()
    return (
        ref_loss_per_sequence(logits, windows, "kl", teacher).numpy(),
        ref_loss_per_sequence(logits, windows, "ce").numpy(),
        agree,
    )


def _assert_equal_to_surgery(model, blocks, windows, sets, got):
    teacher = teacher_logprobs(model, windows)
    for s, g in zip(sets, got):
        kl, ce, agree = _pruned_losses(model, blocks, windows, s, teacher)
        np.testing.assert_allclose(g["kl"].numpy(), kl, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(g["ce"].numpy(), ce, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(g["agree"].numpy(), agree, atol=1e-6)


@pytest.mark.parametrize("arch", TINY_ARCHS + EXTRA_ARCHS)
def test_prefix_tree_equals_pruned_models(tiny_model, tiny_windows, arch):
    model = tiny_model(arch, n_layers=5)
    windows = tiny_windows(model, n=3, seq_len=12)
    blocks = find_blocks(model, "layer")
    sets = [s for r in (1, 2, 4) for s in itertools.combinations(range(5), r)]
    meter = RemovalLosses(model, blocks, windows)
    got = meter.losses(sets)
    assert meter.replay, "the prefix tree should apply to every supported architecture"
    _assert_equal_to_surgery(model, blocks, windows, sets, got)
    # shared prefixes: far fewer layer calls than one forward per set
    assert meter.layer_calls < len(sets) * 5 / 2
    assert meter.full_calls == 0 and meter.original_calls == 1


@pytest.mark.parametrize("arch", TINY_ARCHS + EXTRA_ARCHS)
def test_sublayer_sets_replay_equal_to_gated_passes_and_surgery(tiny_model, tiny_windows, arch):
    model = tiny_model(arch, n_layers=3)
    windows = tiny_windows(model, n=3, seq_len=12)
    blocks = find_blocks(model, "sublayer")  # attn0, mlp0, attn1, mlp1, attn2, mlp2
    sets = [(0,), (1,), (5,), (0, 1), (2, 5), (1, 2), (0, 3, 4), (1, 2, 3), (0, 1, 4, 5), (0, 2, 4)]
    meter = RemovalLosses(model, blocks, windows)
    got = meter.losses(sets)
    assert meter.replay, "sublayer sets should go through the prefix tree"
    assert meter.full_calls == 0 and meter.original_calls == 1
    gated = RemovalLosses(model, blocks, windows, prefix=False)
    want = gated.losses(sets)
    assert not gated.replay and gated.full_calls == len(sets)
    for g, w in zip(got, want):
        for key in ("kl", "ce", "agree"):
            np.testing.assert_allclose(g[key].numpy(), w[key].numpy(), atol=2e-5, rtol=1e-4)
    _assert_equal_to_surgery(model, blocks, windows, sets, got)
    # a removed half skips its module: cheaper than the layer calls of one full forward per set
    assert meter.cost < len(sets)


def test_mixed_layer_and_half_blocks(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=4)
    windows = tiny_windows(model, n=2, seq_len=10)
    layers, halves = find_blocks(model, "layer"), find_blocks(model, "sublayer")
    blocks = [layers[0], halves[2], halves[5], layers[3]]  # layer 0, attn 1, mlp 2, layer 3
    sets = [(0,), (1,), (1, 2), (0, 2, 3), (1, 3)]
    meter = RemovalLosses(model, blocks, windows)
    got = meter.losses(sets)
    assert meter.replay
    _assert_equal_to_surgery(model, blocks, windows, sets, got)


def test_a_replay_that_fails_its_check_falls_back_to_gated_passes(tiny_model, tiny_windows, monkeypatch):
    model = tiny_model("qwen2", n_layers=3)
    windows = tiny_windows(model, n=2, seq_len=10)
    blocks = find_blocks(model, "sublayer")

    class Wrong(replay_module.ZeroStandIn):
        def forward(self, *args, **kwargs):  # not a removal: the check against the gated pass must catch it
            out = super().forward(*args, **kwargs)
            return (out[0] + 1.0, *out[1:]) if isinstance(out, tuple) else out + 1.0

    monkeypatch.setattr(replay_module, "ZeroStandIn", Wrong)
    sets = [(0,), (3,), (1, 4)]
    meter = RemovalLosses(model, blocks, windows)
    got = meter.losses(sets)
    assert not meter.replay and meter.full_calls == len(sets)
    _assert_equal_to_surgery(model, blocks, windows, sets, got)


def test_base_losses_and_empty_set(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=2, seq_len=10)
    blocks = find_blocks(model, "layer")
    meter = RemovalLosses(model, blocks, windows)
    (empty,) = meter.losses([()])
    ce = ref_loss_per_sequence(logits_of(model, windows).detach(), windows, "ce").numpy()
    np.testing.assert_allclose(empty["ce"].numpy(), ce, atol=1e-5)
    assert float(empty["kl"].abs().max()) < 1e-5 and bool((empty["agree"] == 1).all())
    with pytest.raises(IndexError, match="out of range"):
        meter.losses([(7,)])


def test_works_inside_an_estimators_gates(tiny_model, tiny_windows):
    model = tiny_model("qwen2", n_layers=4)
    windows = tiny_windows(model, n=2, seq_len=10)
    for granularity, sets in (("layer", [(1,), (0, 3)]), ("sublayer", [(1,), (0, 5), (2, 3)])):
        blocks = find_blocks(model, granularity)
        plain = RemovalLosses(model, blocks, windows).losses(sets)
        with Gates(model, blocks, requires_grad=True):
            gated = RemovalLosses(model, blocks, windows)
            values = gated.losses(sets)
            assert gated.replay
        for a, b in zip(plain, values):
            np.testing.assert_allclose(a["kl"].numpy(), b["kl"].numpy(), atol=1e-6)


# ------------------------------------------------------------------------------------------------ Measurer
def test_measurer_returns_per_sequence_losses_on_the_first_windows(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=4)
    windows = tiny_windows(model, n=6, seq_len=10)
    blocks = find_blocks(model, "layer")
    measurer = Measurer(model, blocks, windows, batch_size=4)
    sets = [(2,), (0, 3), ()]
    out = measurer.losses(sets, windows=5)
    assert out.sets == [(2,), (0, 3), ()] and out.kl.shape == (3, 5) and out.base_ce.shape == (5,)
    _assert_equal_to_surgery(
        model,
        blocks,
        windows[:5],
        sets[:2],
        [
            {
                "kl": torch.from_numpy(out.kl[k]),
                "ce": torch.from_numpy(out.ce[k]),
                "agree": torch.from_numpy(out.agreement[k]),
            }
            for k in range(2)
        ],
    )
    np.testing.assert_allclose(out.ce[2], out.base_ce, atol=1e-5)
    assert out.increase("kl")[2] == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose(out.increase("ce"), out.ce.mean(1) - out.base_ce.mean())
    m = out.metrics(1)
    assert m["nll"] == pytest.approx(out.ce[1].mean()) and m["ppl"] == pytest.approx(np.exp(out.ce[1].mean()))
    assert m["n_tokens"] == 5 * 9 and out.base_metrics()["kl"] == 0.0
    # the first batch was kept: more sets on it need no original pass
    before = measurer.work
    measurer.losses([(1,)], windows=4)
    assert (measurer.work - before).original_passes == 0


def test_the_progress_bar_says_what_is_measured(tiny_model, tiny_windows, capsys):
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=8)
    blocks = find_blocks(model, "layer")
    Measurer(model, blocks, windows, batch_size=2, progress=True, label="race: windows 0-4").losses([(1,)])
    assert "race: windows 0-4" in capsys.readouterr().err
    Measurer(model, blocks, windows, batch_size=2, progress=True).losses([(1,)])
    assert "measuring" in capsys.readouterr().err
    Measurer(model, blocks, windows, batch_size=2, label="validation").losses([(1,)])  # no bar without progress
    assert capsys.readouterr().err == ""


def test_fpe_count_every_call_by_its_parameters(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=5)
    windows = tiny_windows(model, n=4, seq_len=8)
    blocks = find_blocks(model, "layer")
    n = len(blocks)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    head = model.lm_head.weight.numel()
    full = n * layer + head
    measurer = Measurer(model, blocks, windows, batch_size=4)
    measurer.losses([(i,) for i in range(n)])
    w = measurer.work
    # the singles through the tree: layer i removed runs layers i+1..n-1; the check replays the last layer and head
    assert w.layer_calls == n * (n - 1) // 2 + 1 and w.head_runs == n + 1
    assert w.original_passes == 1 and w.full_passes == 0 and w.sets == n
    assert w.fpe == pytest.approx(1 + (w.layer_calls * layer + w.head_runs * head) / full)
    # on half the windows (one of two batches) and in units of all of them: half the work
    half = Measurer(model, blocks, windows, batch_size=2)
    half.losses([(i,) for i in range(n)], windows=2)
    assert half.work.fpe == pytest.approx(w.fpe / 2)
    assert (w - w) == Work() and (w + Work()).layer_calls == w.layer_calls


def test_measurer_refuses_bad_input(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=2, seq_len=8)
    blocks = find_blocks(model)
    measurer = Measurer(model, blocks, windows)
    with pytest.raises(ModelError, match=r"block indices \[3\] are out of range 0..2"):
        measurer.losses([(0, 3)])
    with pytest.raises(InvalidOptionError, match="windows must be an integer in 1..2"):
        measurer.losses([(0,)], windows=3)
    with pytest.raises(InvalidOptionError, match="batch_size"):
        Measurer(model, blocks, windows, batch_size=0)


def test_cache_round_trip_and_reuse(tiny_model, tiny_windows, tmp_path):
    model = tiny_model("llama", n_layers=4)
    windows = tiny_windows(model, n=6, seq_len=10)
    blocks = find_blocks(model, "layer")
    sets = [(0,), (1, 2), (3,)]
    cache = MeasureCache(tmp_path, model, blocks)
    first = measure_sets(model, blocks, windows, sets, batch_size=4, cache=cache)
    assert first["work"].sets == 2 * len(sets) and first["work"].original_passes == 2
    again = measure_sets(
        model, blocks, windows, sets + [(2,)], batch_size=4, cache=MeasureCache(tmp_path, model, blocks)
    )
    assert again["work"].sets == 2 and again["work"].original_passes == 2  # only the new set, on both batches
    for key in ("kl", "ce", "agree"):
        np.testing.assert_array_equal(first[key], again[key][:3])
    # another model never reads these values
    other = tiny_model("llama", n_layers=4, seed=1)
    fresh = measure_sets(
        other, find_blocks(other), windows, sets, batch_size=4, cache=MeasureCache(tmp_path, other, blocks)
    )
    assert fresh["work"].sets == 2 * len(sets)


def test_cache_files_without_agreement_are_read(tiny_model, tiny_windows, tmp_path):
    import io
    import json

    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=2, seq_len=8)
    blocks = find_blocks(model)
    cache = MeasureCache(tmp_path, model, blocks)
    path = cache.batch(windows).path
    buf = io.BytesIO()  # a file written before the agreement was recorded
    sets = np.frombuffer(json.dumps([[1]]).encode(), dtype=np.uint8)
    np.savez(buf, sets=sets, kl=np.full((1, 2), 0.5, np.float32), ce=np.full((1, 2), 3.0, np.float32))
    path.write_bytes(buf.getvalue())
    out = Measurer(model, blocks, windows, cache=MeasureCache(tmp_path, model, blocks)).losses([(1,)])
    assert out.kl[0].tolist() == [0.5, 0.5] and np.isnan(out.agreement).all()


def test_pruned_parameters_equal_the_surgically_pruned_models(tiny_model):
    from cbo.evaluate import count_parameters

    model = tiny_model("gemma3", n_layers=4)
    layers, halves = find_blocks(model, "layer"), find_blocks(model, "sublayer")
    mixed = [layers[0], halves[2], halves[3], halves[5]]
    for blocks, sets in ((layers, [(1,), (0, 3)]), (halves, [(0,), (2, 3), (1, 4, 7)]), (mixed, [(0, 1), (1, 2, 3)])):
        measurer = Measurer(model, blocks, torch.zeros(1, 4, dtype=torch.int64))
        for s in sets:
            assert measurer.pruned_parameters(s) == count_parameters(_pruned(model, blocks, s)), (blocks, s)


def test_small_kl_under_large_logits_and_a_large_vocabulary_is_exact_to_rounding(tiny_model, tiny_windows):
    """A removal that barely changes a model whose logits are large (|z| ~ 30) over 32k tokens: KL computed as
    Σ p z − logsumexp(z) would cancel two numbers of the size of the logits and be off by ~20 % here."""
    model = tiny_model("llama", n_layers=3, vocab_size=32768, initializer_range=1.0)
    with torch.no_grad():
        for m in (model.model.layers[1].self_attn.o_proj, model.model.layers[1].mlp.down_proj):
            m.weight.mul_(0.01)
    windows = tiny_windows(model, n=4, seq_len=16)
    blocks = find_blocks(model)
    out = Measurer(model, blocks, windows).losses([(1,)])
    kl, ce, _ = _pruned_losses(model, blocks, windows, (1,), teacher_logprobs(model, windows))
    assert kl.max() < 0.01  # the case: a small divergence
    np.testing.assert_allclose(out.kl[0], kl, rtol=1e-2, atol=1e-5)
    np.testing.assert_allclose(out.ce[0], ce, rtol=1e-5)


def test_a_poisoned_measurement_file_is_not_used(tiny_model, tiny_windows, tmp_path):
    """Another batch's file copied over this batch's path, or values of the wrong shape or blocks, are ignored
    with a warning naming the file and measured again (the measured values equal an uncached run's)."""
    import io
    import json

    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=2, seq_len=8)
    other_windows = tiny_windows(model, n=2, seq_len=8, seed=5)
    blocks = find_blocks(model)
    truth = Measurer(model, blocks, windows).losses([(1,)])
    cache = MeasureCache(tmp_path, model, blocks)
    Measurer(model, blocks, other_windows, cache=cache).losses([(1,)])
    path = cache.batch(windows).path
    cache.batch(other_windows).path.replace(path)  # a file of another batch at this batch's path

    def legacy(sets, shape):
        buf = io.BytesIO()
        raw = np.frombuffer(json.dumps(sets).encode(), dtype=np.uint8)
        np.savez(buf, sets=raw, kl=np.full(shape, 0.5, np.float32), ce=np.full(shape, 3.0, np.float32))
        return buf.getvalue()

    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2 : len(good) // 2 + 64] = bytes(64)  # zeroed bytes inside a compressed member
    poisons = {
        "records the key": good,
        "shape": legacy([[1]], (1, 5)),
        "outside": legacy([[9]], (1, 2)),
        "not readable": good[: len(good) // 2],  # truncated: a bad zip file (issue 27)
        "not readable.*": bytes(flipped),
    }
    for why, content in poisons.items():
        path.write_bytes(content)
        with pytest.warns(UserWarning, match=f"ignoring the measurement cache file '{path}': .*{why}"):
            out = Measurer(model, blocks, windows, cache=MeasureCache(tmp_path, model, blocks)).losses([(1,)])
        np.testing.assert_allclose(out.kl, truth.kl, rtol=1e-6)
        np.testing.assert_allclose(out.ce, truth.ce, rtol=1e-6)
