"""The shared battery every registered estimator passes: API shape, a symmetric finite QUBO, seeds reproduce, an
interrupted run resumed from its checkpoint equals an uninterrupted one, bad options are refused. A new estimator
is tested here the day it is registered; the sizes live in this file."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cbo.errors import InvalidOptionError, UnknownNameError
from cbo.hessian import ESTIMATORS, describe, estimate_hessian
from cbo.qubo.block_qubo import BlockQUBO

# the battery's sizes: a 3-layer tiny Llama, 6 windows of 8 tokens in batches of 2 (3 batches)
N_LAYERS, N_WINDOWS, SEQ_LEN, BATCH = 3, 6, 8, 2
REMOVE = 1  # for estimators that refine their QUBO for one target M


class Interrupt(Exception):
    pass


def _options(name: str) -> dict:
    cls = ESTIMATORS.get(name)
    return {"remove": REMOVE} if "remove" in cls.target_options else {}


@pytest.fixture(scope="module")
def setup():
    from tiny_models import build_tiny_model, random_token_windows

    model = build_tiny_model("llama", n_layers=N_LAYERS, seed=5)
    return model, random_token_windows(model, n=N_WINDOWS, seq_len=SEQ_LEN, seed=2)


def _default_loss(name: str) -> dict:
    """The driver's default loss (kl), or the first loss of an estimator that does not take it (``paper``: ce)."""
    if name not in ESTIMATORS.names():
        return {}
    losses = ESTIMATORS.get(name).losses
    return {} if "kl" in losses else {"loss": losses[0]}


def _estimate(setup, name, **kw):
    model, windows = setup
    kw = {"batch_size": BATCH, "progress": False, "seed": 3, **_options(name), **_default_loss(name), **kw}
    return estimate_hessian(model, None, windows, estimator=name, **kw)


@pytest.mark.parametrize("name", ESTIMATORS.names())
def test_api_shape_and_a_symmetric_finite_qubo(setup, name):
    cls = ESTIMATORS.get(name)
    assert cls.name == name and cls.description and cls.cost and set(cls.losses) <= {"kl", "ce"}
    for loss in cls.losses:
        q = _estimate(setup, name, loss=loss)
        assert isinstance(q, BlockQUBO) and q.n == N_LAYERS
        assert q.names == tuple(f"layers.{i}" for i in range(N_LAYERS)) and set(q.kinds) == {"layer"}
        assert np.all(np.isfinite(q.H)) and np.all(np.isfinite(q.g))
        np.testing.assert_array_equal(q.H, q.H.T)
        md = q.metadata
        assert (md["estimator"], md["loss"], md["n_sequences"], md["seq_len"]) == (name, loss, N_WINDOWS, SEQ_LEN)
        assert md["forward_passes"] >= 1 and md["fpe"] >= 1.0 and md["backward_passes"] >= 0
        assert md["options"] == dataclasses.asdict(ESTIMATORS.make_options(cls, _options(name)))


@pytest.mark.parametrize("name", ESTIMATORS.names())
def test_sublayer_blocks(setup, name):
    q = _estimate(setup, name, granularity="sublayer")
    assert q.n == 2 * N_LAYERS and q.kinds == ("attention", "mlp") * N_LAYERS
    assert np.all(np.isfinite(q.H)) and np.all(np.isfinite(q.g))


@pytest.mark.parametrize("name", ESTIMATORS.names())
def test_the_same_seed_reproduces_the_qubo(setup, name):
    a = _estimate(setup, name)
    b = _estimate(setup, name)
    np.testing.assert_array_equal(a.H, b.H)
    np.testing.assert_array_equal(a.g, b.g)


@pytest.mark.parametrize("name", ESTIMATORS.names())
def test_resumed_from_a_checkpoint_equals_uninterrupted(setup, name, tmp_path):
    whole = _estimate(setup, name)

    def stop(b, state):
        if b == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        _estimate(setup, name, checkpoint=tmp_path, callback=stop)
    assert len(list(tmp_path.glob("*.ckpt.npz"))) == 1
    resumed = _estimate(setup, name, checkpoint=tmp_path)
    assert resumed.metadata["resumed_from_batch"] == 2
    np.testing.assert_allclose(resumed.H, whole.H, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(resumed.g, whole.g, rtol=1e-12, atol=1e-15)
    assert not list(tmp_path.glob("*.ckpt.npz"))


@pytest.mark.parametrize("name", ESTIMATORS.names())
def test_bad_options_are_refused_before_any_pass(setup, name, monkeypatch):
    from cbo.hessian import driver

    def no_pass(*args, **kwargs):
        raise AssertionError("an option error must come before any forward pass")

    monkeypatch.setattr(driver, "Gates", no_pass)
    with pytest.raises(InvalidOptionError, match=r"no option\(s\) \['no_such_option'\]; valid options"):
        _estimate(setup, name, no_such_option=1)
    with pytest.raises(InvalidOptionError, match="unknown loss 'l2'"):
        _estimate(setup, name, loss="l2")
    with pytest.raises(InvalidOptionError, match="batch_size"):
        _estimate(setup, name, batch_size=0)


def test_unknown_estimators_name_the_registered_ones(setup):
    with pytest.raises(UnknownNameError, match=r"unknown estimator 'newton'; registered: \['exact', 'fisher'"):
        _estimate(setup, "newton")
    assert set(describe()) == set(ESTIMATORS.names())
