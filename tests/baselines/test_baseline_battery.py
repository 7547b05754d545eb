"""The shared baseline battery: every registered depth baseline, at every granularity it supports, on a tiny
random model, tested the day it is registered.

Checks: ``select(M)`` gives M distinct valid blocks for every M the ranking answers and agrees with
``select_blocks``; keep lists and kind caps hold; ``max_remove`` is checked and honoured; two runs give the same
ranking (seeded methods included); ``to_json`` / ``from_json`` round-trips through strict JSON; bad input fails
with the right error before any forward pass; the model is left as it was (weights, gradients, flags, training
mode, hooks).

The sizes live here, not in the baselines: the tiny model, the windows, and ``OPTIONS``, the options a baseline
gets in the battery when its defaults do not fit a model this small (Taylor+ protects six layers by default).
"""

from __future__ import annotations

import json

import pytest
import torch

from cbo import baselines as B
from cbo.errors import CBOError, DataError, InfeasibleError, InvalidOptionError, ModelError, UnknownNameError
from cbo.model.blocks import find_blocks

N_LAYERS = 5
N_WINDOWS, SEQ_LEN, BATCH = 5, 8, 3  # two batches, the second short: accumulation across uneven batches
MAX_M = 3
OPTIONS: dict[str, dict] = {
    "taylor": {"protect": (1, 0)},
    "evopress": {"offspring": 4, "generations": 3, "initial": 6, "final_windows": 3},
}


def _cases() -> list:
    return [pytest.param(name, g, id=f"{name}-{g}") for name, cls in B.BASELINES.items() for g in cls.granularities]


CASES = _cases()


@pytest.fixture(scope="module")
def model():
    from tiny_models import build_tiny_model

    return build_tiny_model("llama", n_layers=N_LAYERS, seed=5)


@pytest.fixture(scope="module")
def windows():
    from tiny_models import random_token_windows

    return random_token_windows(128, n=N_WINDOWS, seq_len=SEQ_LEN, seed=4)


def rank(name, model, windows, granularity, **kw):
    kw.setdefault("max_remove", MAX_M)
    return B.rank_blocks(name, model, windows, granularity=granularity, batch_size=BATCH, **OPTIONS.get(name, {}), **kw)


def answerable(r) -> list[int]:
    """The M values a ranking answers (all of 1..max_remove, or the searched ones)."""
    top = min(MAX_M, r.max_remove())
    return sorted(m for m in r.sets if m <= top) if r.sets is not None else list(range(1, top + 1))


def check_selection(r, m, blocks, keep=(), caps=None):
    chosen = r.select(m, caps=caps)
    assert len(chosen) == m and len(set(chosen)) == m, chosen
    assert chosen == sorted(chosen) and all(0 <= i < len(blocks) for i in chosen)
    assert all(isinstance(i, int) for i in chosen)
    assert not set(chosen) & set(keep)
    for kind, limit in (caps or {}).items():
        assert sum(blocks[i].kind == kind for i in chosen) <= limit
    return chosen


# ------------------------------------------------------------------------------------------ the registry
def test_registry_lists_every_builtin_and_describes_it():
    assert {"angular", "block_influence", "ppl", "sleb", "taylor"} <= set(B.methods())
    for name, cls in B.BASELINES.items():
        assert cls.name == name and cls.description, name
        assert set(cls.granularities) <= set(B.GRANULARITIES) and cls.granularities
        B.BASELINES.make_options(name, OPTIONS.get(name, {}))  # the battery's options are valid
    assert B.describe().keys() == set(B.methods())


def test_unknown_baseline_raises_unknown_name_error(model, windows):
    with pytest.raises(UnknownNameError, match="unknown depth baseline 'nope'.*block_influence"):
        B.rank_blocks("nope", model, windows)
    with pytest.raises(UnknownNameError):
        B.select_blocks("nope", model, windows, 2)


# ------------------------------------------------------------------------------------------ selections
@pytest.mark.parametrize("name,granularity", CASES)
def test_select_gives_m_distinct_valid_blocks(name, granularity, model, windows):
    blocks = find_blocks(model, granularity)
    r = rank(name, model, windows, granularity)
    assert (r.method, r.granularity) == (name, granularity)
    assert r.names == [b.name for b in blocks] and r.kinds == [b.kind for b in blocks]
    ms = answerable(r)
    assert ms, f"{name} answers no M on a {len(blocks)}-block model"
    for m in ms:
        chosen = check_selection(r, m, blocks)
        assert chosen == B.select_blocks(
            name, model, windows, m, granularity=granularity, batch_size=BATCH, **OPTIONS.get(name, {})
        )
    with pytest.raises(InfeasibleError):
        r.select(r.max_remove() + 1)
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(InfeasibleError):
            r.select(bad)


@pytest.mark.parametrize("name,granularity", CASES)
def test_keep_list_is_respected(name, granularity, model, windows):
    blocks = find_blocks(model, granularity)
    keep = [1, blocks[3].name]
    r = rank(name, model, windows, granularity, keep=keep)
    assert r.keep == (1, 3)
    for m in answerable(r):
        check_selection(r, m, blocks, keep=(1, 3))
    assert r.max_remove() <= len(blocks) - 2


@pytest.mark.parametrize("name,granularity", [c for c in CASES if c.values[1] == "sublayer"])
def test_kind_caps_are_respected(name, granularity, model, windows):
    blocks = find_blocks(model, granularity)
    caps = {"attention": 1}
    r = rank(name, model, windows, granularity, caps=caps)
    for m in answerable(r):
        check_selection(r, m, blocks, caps=caps)
    for m in answerable(r):
        chosen = B.select_blocks(
            name, model, windows, m, granularity=granularity, caps=caps, batch_size=BATCH, **OPTIONS.get(name, {})
        )
        assert chosen == r.select(m, caps=caps)


@pytest.mark.parametrize("name,granularity", CASES)
def test_max_remove_is_checked_and_honoured(name, granularity, model, windows):
    n = len(find_blocks(model, granularity))
    for bad in (0, n, n + 3, 1.5, "2"):
        with pytest.raises(InfeasibleError, match="max_remove"):
            rank(name, model, windows, granularity, max_remove=bad)
    with pytest.raises(InfeasibleError, match="max_remove"):  # two kept blocks leave n − 2 to remove
        rank(name, model, windows, granularity, keep=[0, 1], max_remove=n - 1)
    r = rank(name, model, windows, granularity, max_remove=2)
    if B.BASELINES.get(name).ranks_up_to_max_remove:
        assert r.max_remove() <= 2
        with pytest.raises(InfeasibleError):
            r.select(3)
    assert all(m <= r.max_remove() for m in answerable(r))


# ------------------------------------------------------------------------------------------ reproducibility
@pytest.mark.parametrize("name,granularity", CASES)
def test_two_runs_agree_and_json_round_trips(name, granularity, model, windows):
    a = rank(name, model, windows, granularity)
    b = rank(name, model, windows, granularity)
    ja, jb = a.to_json(), b.to_json()
    ja.pop("wall_time"), jb.pop("wall_time")
    assert json.dumps(ja, sort_keys=True) == json.dumps(jb, sort_keys=True)

    text = json.dumps(a.to_json(), allow_nan=False)  # strict JSON: nan / inf are written as strings
    again = B.Ranking.from_json(json.loads(text))
    assert again.to_json() == a.to_json()
    for m in answerable(a):
        assert again.select(m) == a.select(m)
    assert again.max_remove() == a.max_remove()


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("name,granularity", CASES)
def test_bad_input_fails_before_any_forward_pass(name, granularity, model, windows, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a forward pass ran before the input was checked")

    monkeypatch.setattr(model, "forward", boom)
    blocks = find_blocks(model, granularity)
    cases = [
        (InvalidOptionError, {"no_such_option": 1}),
        (ModelError, {"granularity": "head"}),
        (InfeasibleError, {"keep": ["layers.99"]}),
        (InfeasibleError, {"keep": [len(blocks)]}),
        (InfeasibleError, {"caps": {"conv": 1}}),
        (InfeasibleError, {"caps": {blocks[0].kind: -1}}),
        (CBOError, {"batch_size": 0}),
    ]
    for error, kw in cases:
        kw = {"granularity": granularity, **kw}
        with pytest.raises(error):
            B.rank_blocks(name, model, windows, max_remove=2, **OPTIONS.get(name, {}), **kw)
    with pytest.raises(DataError):
        B.rank_blocks(name, model, windows[:0], granularity=granularity, **OPTIONS.get(name, {}))
    with pytest.raises(DataError):
        B.rank_blocks(name, model, None, granularity=granularity, **OPTIONS.get(name, {}))
    for bad in (0, 1.5):
        with pytest.raises(InfeasibleError):
            B.select_blocks(name, model, windows, bad, granularity=granularity, **OPTIONS.get(name, {}))


@pytest.mark.parametrize("name,granularity", CASES)
def test_the_model_is_left_as_it_was(name, granularity, model, windows):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {k: p.requires_grad for k, p in model.named_parameters()}
    model.train()
    try:
        rank(name, model, windows, granularity)
        assert model.training
    finally:
        model.eval()
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert {k: p.requires_grad for k, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks, type(module).__name__
