"""Executors and Measurements: values equal the measurer's, nothing is measured twice, FPE counted, Ray = in-process."""

from __future__ import annotations

import numpy as np
import pytest

from cbo.errors import CBOError
from cbo.measure.executors import InProcessExecutor, Measurements, RayExecutor, SearchCheckpoint


def _setup(tiny_model, tiny_windows, granularity="layer"):
    from cbo.model.blocks import find_blocks

    model = tiny_model("llama", n_layers=4, seed=0)
    windows = tiny_windows(model, n=3, seq_len=10, seed=1)
    return model, find_blocks(model, granularity), windows


@pytest.mark.parametrize("granularity", ["layer", "sublayer"])
def test_values_equal_the_measurer_and_are_measured_once(tiny_model, tiny_windows, granularity):
    from cbo.measure.measurer import measure_sets

    model, blocks, windows = _setup(tiny_model, tiny_windows, granularity)
    sets = [(0,), (1, 2), (0, 3), (2,)]
    m = Measurements(InProcessExecutor(model, blocks, windows))
    kl = m(sets, [0, 1, 2])
    ce = m(sets, [2, 0], loss="ce")
    ref = measure_sets(model, blocks, windows, sets, batch_size=3)  # the measurer, all windows in one batch
    assert np.allclose(kl, ref["kl"], rtol=1e-4, atol=1e-6)
    assert np.allclose(ce, ref["ce"][:, [2, 0]], rtol=1e-4, atol=1e-6)
    spent, pairs = m.fpe, m.pairs
    assert pairs == len(sets) * 3
    again = m(list(reversed(sets)), [1])
    assert m.fpe == spent and m.pairs == pairs  # all known: nothing measured
    assert np.allclose(again[::-1, 0], kl[:, 1])


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_fpe_counts_each_call_by_its_parameters(tiny_model, tiny_windows):
    model, layers, windows = _setup(tiny_model, tiny_windows, "layer")
    _, halves, _ = _setup(tiny_model, tiny_windows, "sublayer")
    decoder = model.model.layers
    L = _params(decoder[0])
    head = _params(model.get_output_embeddings())
    full = 4 * L + head
    attn, mlp = _params(decoder[0].self_attn), _params(decoder[0].mlp)
    sub = Measurements(InProcessExecutor(model, halves, windows))
    # halves 0 (layer 0's attention), 3 (layer 1's MLP), 5 (layer 2's MLP): each set replays from its layer on,
    # that layer without the removed half, then the head; plus the window's setup (its original pass)
    sub([(0,), (3,), (5,)], [0])
    replayed = ((L - attn) + 3 * L + head) + ((L - mlp) + 2 * L + head) + ((L - mlp) + L + head)
    assert sub.fpe == pytest.approx(1.0 + replayed / full)
    lay = Measurements(InProcessExecutor(model, layers, windows))
    lay([(3,)], [0])  # the last layer removed: the original pass and the head only
    assert lay.fpe == pytest.approx(1.0 + head / full)
    lay([(0,)], [0])  # from the first layer: three layer calls and the head
    assert lay.fpe == pytest.approx(1.0 + (3 * L + 2 * head) / full)


def test_state_round_trip_and_bad_input(tiny_model, tiny_windows, tmp_path):
    model, blocks, windows = _setup(tiny_model, tiny_windows)
    m = Measurements(InProcessExecutor(model, blocks, windows))
    m([(1,), (0, 2)], [0, 2])
    ck = SearchCheckpoint(tmp_path / "c.json", {"a": (1, 2)})
    ck.save({"measure": m.state()})
    back = Measurements(InProcessExecutor(model, blocks, windows))
    back.restore(SearchCheckpoint(tmp_path / "c.json", {"a": [1, 2]}).load()["measure"])
    assert back.values == m.values and back.fpe == m.fpe
    with pytest.warns(UserWarning, match="another run"):
        assert SearchCheckpoint(tmp_path / "c.json", {"a": 3}).load() is None
    with pytest.raises(CBOError, match="out of range"):
        m([(0,)], [5])
    with pytest.raises(CBOError, match="loss"):
        m([(0,)], [0], loss="mse")
    with pytest.raises(CBOError, match="windows must be"):
        InProcessExecutor(model, blocks, windows[0])


def _replica():
    """Built on each Ray worker: the same tiny model and windows as the driver's (seeded)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tiny_models import build_tiny_model, random_token_windows

    from cbo.model.blocks import find_blocks

    model = build_tiny_model("llama", n_layers=4, seed=0)
    return model, find_blocks(model, "layer"), random_token_windows(model, n=3, seq_len=10, seed=1)


@pytest.mark.slow
def test_ray_pool_gives_the_in_process_results(tiny_model, tiny_windows, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_raylet_start_wait_time_s", "300")  # a loaded machine starts the local cluster slowly
    import sys

    import ray
    from ray import cloudpickle

    from cbo.baselines.evopress import evopress

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module

    model, blocks, windows = _setup(tiny_model, tiny_windows)
    local = Measurements(InProcessExecutor(model, blocks, windows))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        pool = RayExecutor(_replica, workers=2)
        remote = Measurements(pool)
        sets = [(0,), (1, 3), (2,), (0, 1)]
        # a worker runs torch with its own thread count, so sums may be reduced in another order (float32 rounding)
        np.testing.assert_allclose(remote(sets, [0, 1, 2]), local(sets, [0, 1, 2]), rtol=1e-5, atol=1e-7)
        assert remote.fpe == pytest.approx(local.fpe)
        opts = dict(generations=3, offspring=3, initial=4, stages=((2, 1), (1, 3)), seed=1)
        a = evopress(Measurements(pool), ["layer"] * 4, 2, **opts)
        b = evopress(Measurements(InProcessExecutor(model, blocks, windows)), ["layer"] * 4, 2, **opts)
        assert [h["removed"] for h in a.history] == [h["removed"] for h in b.history]
        assert [h["fitness"] for h in a.history] == pytest.approx([h["fitness"] for h in b.history], rel=1e-5)
        assert [h["fpe"] for h in a.history] == pytest.approx([h["fpe"] for h in b.history])
        assert a.fpe == pytest.approx(b.fpe)
        pool.close()
    finally:
        ray.shutdown()
