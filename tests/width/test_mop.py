"""The MoP scheduler: reproducible paths, the criterion's choice, the target ratio, recovery."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_tiny_model, random_token_windows

from cbo.errors import InfeasibleError, InvalidOptionError
from cbo.evaluate import count_parameters
from cbo.model.blocks import decoder_layers
from cbo.pipeline.proposers import depth_proposer
from cbo.recovery.finetune import lm_loss_of, recover
from cbo.width.mop import antepenultimate, mixture_of_pruners


@pytest.fixture(scope="module")
def setup():
    model = build_tiny_model("llama", n_layers=6)
    calib = random_token_windows(model, n=4, seq_len=16, seed=1)
    control = random_token_windows(model, n=4, seq_len=16, seed=2)
    return model, calib, control


@pytest.mark.parametrize(
    ("criterion", "depth"), [("kl", "antepenultimate"), ("random", "antepenultimate"), ("cosine", "cbo")]
)
def test_same_seed_same_path(setup, criterion, depth):
    model, calib, control = setup
    runs = [
        mixture_of_pruners(
            model, calib, control, ratio=0.4, criterion=criterion, depth_proposer=depth_proposer(depth, seed=7), seed=7
        )
        for _ in range(2)
    ]
    a, b = (r.to_dict() for r in runs)
    for r in (a, b):
        for step in r["path"]:
            step.pop("seconds")
    assert a == b
    assert runs[0].path_string() == runs[1].path_string() and a["depth"] == depth
    x = random_token_windows(model, n=1, seq_len=8)
    torch.testing.assert_close(runs[0].model(input_ids=x).logits, runs[1].model(input_ids=x).logits)


def test_random_paths_depend_on_the_seed(setup):
    model, calib, control = setup
    paths = {
        mixture_of_pruners(model, calib, control, ratio=0.4, criterion="random", seed=s).path_string() for s in range(6)
    }
    assert len(paths) > 1


@pytest.mark.parametrize("criterion", ["kl", "cosine", "ppl"])
def test_criterion_picks_the_better_candidate_and_reaches_the_target(setup, criterion):
    model, calib, control = setup
    r = mixture_of_pruners(model, calib, control, ratio=0.35, criterion=criterion, seed=0)
    assert model is not r.model and count_parameters(model) == r.params_before  # the original is untouched
    layer_params = count_parameters(decoder_layers(model)[0][0])
    assert abs((r.params_before - r.params_after) - r.target_params) <= layer_params / 2 + 1
    prev = r.params_before
    for step in r.path:
        assert step.params_before == prev and step.params_after < prev
        prev = step.params_after
        if step.depth_score is not None and step.width_score is not None:
            d, w = step.depth_score, step.width_score
            better_width = w > d if criterion == "cosine" else w < d
            assert step.chosen == ("width" if better_width else "depth")
    assert prev == r.params_after
    n_depth = sum(s.chosen == "depth" for s in r.path)
    assert len(decoder_layers(r.model)[0]) == 6 - n_depth
    removed = getattr(r.model.config, "cbo_removed_layers", None) or []
    assert sorted(removed) == sorted(s.depth_original_layer for s in r.path if s.chosen == "depth")


def test_width_only_path(setup):
    model, calib, control = setup
    r = mixture_of_pruners(model, calib, control, ratio=0.1, depth_proposer=None, criterion="kl")
    assert set(r.path_string()) == {"W"} and len(decoder_layers(r.model)[0]) == 6
    assert r.depth == "none"


def test_the_proposer_names_each_depth_candidate(setup):
    """MoP asks the proposer for the current model's layer and, when depth wins, removes exactly that layer."""
    model, calib, control = setup
    asked = []

    def second_layer(current, windows):
        asked.append(len(decoder_layers(current)[0]))
        assert windows is calib
        return 1

    r = mixture_of_pruners(model, calib, control, ratio=0.4, criterion="kl", depth_proposer=second_layer)
    assert r.depth == "second_layer" and asked
    layers = 6
    for step, n in zip((s for s in r.path if not s.final), asked):
        assert n == layers and step.depth_layer == 1
        layers -= step.chosen == "depth"
    original = list(range(6))
    for step in r.path:
        if step.chosen == "depth":
            assert step.depth_original_layer == original.pop(1)
    assert antepenultimate(model) == 3 and antepenultimate(build_tiny_model("llama", n_layers=2)) is None


@pytest.mark.parametrize("method", ["full", "lora"])
def test_recovery_lowers_the_calibration_loss(setup, method):
    model, calib, _ = setup
    import copy

    m = copy.deepcopy(model)
    before = lm_loss_of(m, calib)
    shapes = {n: p.shape for n, p in m.named_parameters()}
    m = recover(m, calib, steps=8, lr=1e-2, method=method, batch_size=4)
    assert lm_loss_of(m, calib) < before
    assert {n: p.shape for n, p in m.named_parameters()} == shapes
    assert m.config.cbo_recovery["method"] == method


def test_bad_input(setup):
    model, calib, control = setup
    with pytest.raises(InvalidOptionError, match="unknown MoP criterion"):
        mixture_of_pruners(model, calib, control, criterion="bleu")
    with pytest.raises(InvalidOptionError, match="depth_proposer must be a callable"):
        mixture_of_pruners(model, calib, control, depth_proposer="antepenultimate")
    with pytest.raises(InvalidOptionError, match=r"returned 6; it must return a layer index in 0\.\.5"):
        mixture_of_pruners(model, calib, control, depth_proposer=lambda m, c: 6)
    with pytest.raises(InfeasibleError, match=r"ratio must be a finite number in \(0, 1\)"):
        mixture_of_pruners(model, calib, control, ratio=1.0)
