"""The shared battery every registered width score passes (a new score is tested the day it is registered).

Sizes live here, not in the scores: tiny random models of two layouts (Llama: separate projections with
grouped-query attention; GPT-2: fused, transposed Conv1D weights), a few short token windows.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_models import build_tiny_model, random_token_windows

from cbo.errors import DataError, InvalidOptionError
from cbo.model.structures import KINDS, model_structures, units_of
from cbo.width.allocate import ALLOCATIONS
from cbo.width.scores import SCORES, score_units

N_LAYERS, N_WINDOWS, SEQ_LEN, BATCH = 2, 4, 12, 2
ARCHS = ("llama", "gpt2")
NAMES = SCORES.names()


def _model(arch: str = "llama"):
    model = build_tiny_model(arch, n_layers=N_LAYERS)
    return model, random_token_windows(model, n=N_WINDOWS, seq_len=SEQ_LEN, seed=3)


def _windows(name: str, windows):
    return windows if SCORES.get(name).needs_data else None


def _no_hooks(model) -> bool:
    return all(not m._forward_pre_hooks and not m._forward_hooks and not m._backward_hooks for m in model.modules())


def test_the_builtins_are_registered():
    assert {"afr", "amp", "magnitude", "ntk", "taylor"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_registration(name):
    cls = SCORES.get(name)
    assert cls.name == name and all(SCORES.get(alias) is cls for alias in cls.aliases)
    assert cls.description and cls.default_allocation in ALLOCATIONS
    fields = {f.name for f in dataclasses.fields(cls.Options)}
    assert set(cls.finalize_options) <= fields
    SCORES.make_options(name, {})  # the defaults are valid


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("gqa", ["group", "query"])
@pytest.mark.parametrize("name", NAMES)
def test_one_finite_importance_per_unit_of_every_structure(name, arch, gqa):
    model, windows = _model(arch)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    s = score_units(model, _windows(name, windows), name, gqa=gqa, batch_size=BATCH)
    structs = model_structures(model)
    expected = {(st.layer, st.kind): units_of(st, gqa).n for st in structs.all()}
    assert {k: v.shape for k, v in s.values.items()} == {k: (n,) for k, n in expected.items()}
    assert all(torch.isfinite(v).all() for v in s.values.values())
    assert s.score == name and s.gqa == gqa and s.keys() == sorted(expected, key=lambda k: (k[0], KINDS.index(k[1])))
    # scoring leaves the model as it was: weights, gradient switches, no gradients, no hooks, eval mode
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters()) and _no_hooks(model) and not model.training


@pytest.mark.parametrize("name", NAMES)
def test_same_inputs_same_scores(name):
    model, windows = _model()
    a = score_units(model, _windows(name, windows), name, batch_size=BATCH)
    b = score_units(_model()[0], _windows(name, windows), name, batch_size=BATCH)  # a fresh, identical model
    assert a.values.keys() == b.values.keys()
    assert all(torch.equal(a.values[k], b.values[k]) for k in a.values)


@pytest.mark.parametrize("name", [n for n in NAMES if SCORES.get(n).needs_data])
def test_hooks_and_switches_are_removed_when_a_batch_raises(name):
    model, windows = _model()
    model.lm_head.weight.requires_grad_(False)  # a user's setting that must survive
    calls = []

    def fail_on_the_second_batch(module, args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("batch failed")

    handle = model.model.layers[-1].register_forward_pre_hook(fail_on_the_second_batch)
    try:
        with pytest.raises(RuntimeError, match="batch failed"):
            score_units(model, windows, name, batch_size=BATCH)
    finally:
        handle.remove()
    assert len(calls) == 2 and _no_hooks(model)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    assert flags.pop("lm_head.weight") is False and all(flags.values())
    assert all(p.grad is None for p in model.parameters())
    again = score_units(model, windows, name, batch_size=BATCH)  # and the model scores normally afterwards
    assert all(torch.isfinite(v).all() for v in again.values.values()) and _no_hooks(model)


@pytest.mark.parametrize("name", NAMES)
def test_bad_options_fail_before_any_forward_pass(name):
    model, windows = _model()
    calls = []
    handle = model.model.layers[0].register_forward_pre_hook(lambda m, a: calls.append(1))
    cls = SCORES.get(name)
    try:
        with pytest.raises(InvalidOptionError, match="no option"):
            score_units(model, windows, name, no_such_option=1)
        for f in dataclasses.fields(cls.Options):
            if isinstance(f.default, str):  # string options are choices, checked by the options' validate()
                with pytest.raises(InvalidOptionError, match=repr("not-a-choice")):
                    score_units(model, windows, name, **{f.name: "not-a-choice"})
        if cls.needs_data:
            with pytest.raises(DataError, match="needs calibration token windows"):
                score_units(model, None, name)
        with pytest.raises(DataError, match="batch_size"):
            score_units(model, _windows(name, windows), name, batch_size=0)
    finally:
        handle.remove()
    assert calls == []
