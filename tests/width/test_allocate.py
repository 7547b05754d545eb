"""Global allocation: γ, chunks that keep layers valid, minimums, rounding, budgets and bad input."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_tiny_model

from cbo.errors import InfeasibleError
from cbo.evaluate import count_parameters
from cbo.model.structures import layer_widths
from cbo.surgery.width import prune_width
from cbo.width.allocate import allocate, default_gamma, gamma_for_shapes
from cbo.width.scores import score_units


def _model(arch: str = "llama", **kw):
    shape = dict(hidden_size=64, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4, head_dim=8)
    shape.update(kw)
    return build_tiny_model(arch, n_layers=4, **shape)


def test_gamma_formula():
    assert gamma_for_shapes(intermediate=14336, heads=32, kv_heads=8, head_dim=128) == pytest.approx(4.2)
    assert gamma_for_shapes(intermediate=8192, heads=24, kv_heads=8, head_dim=128) == pytest.approx(3.0)
    assert gamma_for_shapes(intermediate=1536, heads=9, kv_heads=3, head_dim=64) == pytest.approx(3.0)  # SmolLM2
    model = _model()
    s = score_units(model, None, "magnitude")
    mlp = 4 * 3 * 64 * 256
    attn = 4 * 64 * 8 * (2 * 8 + 2 * 4)
    assert default_gamma(s.structures) == pytest.approx(mlp / attn)


@pytest.mark.parametrize("gqa", ["group", "query"])
@pytest.mark.parametrize("ratio", [0.1, 0.3])
def test_budget_rounding_and_valid_layouts(gqa, ratio):
    model = _model()
    s = score_units(model, None, "magnitude", gqa=gqa)
    alloc = allocate(s, ratio=ratio, round_to=16)
    pruned = prune_width(model, alloc.plan)
    removed = count_parameters(model) - count_parameters(pruned)
    assert removed == alloc.removed_params
    # within one chunk per kind of the target (a KV group is the largest chunk: 4*8*64 params per head pair)
    assert abs(removed - alloc.target_params) <= 3 * 64 * 16 + (2 * 2 + 2) * 8 * 64
    for w in layer_widths(pruned):
        assert w["intermediate"] % 16 == 0 and w["intermediate"] >= 16
        assert w["heads"] % w["kv_heads"] == 0 and w["heads"] >= 1
        if gqa == "query":
            assert w["kv_heads"] == 4


def test_gamma_sets_the_ratio_of_pruning_fractions():
    model = _model(num_attention_heads=16, num_key_value_heads=16, head_dim=4)  # fine-grained heads
    s = score_units(model, None, "magnitude")
    a = sum(x.n_params for x in s.structures.attention.values())
    m = sum(x.n_params for x in s.structures.mlp.values())
    head = 4 * 4 * 64
    for gamma in (1.0, 3.0):
        alloc = allocate(s, ratio=0.3, gamma=gamma, round_to=1)
        s_attn = alloc.target_params / (a + gamma * m)
        assert abs(alloc.removed_by_kind["attention"] - s_attn * a) <= head / 2 + 1
        assert abs(alloc.removed_params - alloc.target_params) <= 3 * 64 / 2  # the MLP absorbs the rest
        s_mlp = alloc.removed_by_kind["mlp"] / m
        assert s_mlp / (alloc.removed_by_kind["attention"] / a) == pytest.approx(gamma, rel=0.1)


def test_lowest_scores_go_first_across_layers():
    model = _model()
    s = score_units(model, None, "magnitude")
    for key in s.values:
        s.values[key] = torch.linspace(10.0, 20.0, s.values[key].numel())
    # make layer 2's neurons 0..31 and layer 3's KV group 1 the least important in the whole model
    s.values[(2, "mlp")][:32] = torch.arange(32.0) * 0.01
    s.values[(3, "attention")][1] = -1.0
    per_group = (2 * 2 + 2) * 8 * 64
    budget = 32 * 3 * 64 + per_group
    a = sum(x.n_params for x in s.structures.attention.values())
    m = sum(x.n_params for x in s.structures.mlp.values())
    gamma = (budget * a / per_group - a) / m  # gives attention a budget of exactly one KV group
    alloc = allocate(s, remove_params=budget, gamma=gamma, round_to=8)
    assert alloc.removed_units[(2, "mlp")] == list(range(32))
    assert alloc.removed_units[(3, "attention")] == [1]
    assert set(alloc.removed_units) == {(2, "mlp"), (3, "attention")}
    heads, kv = alloc.plan.attention[3]
    assert heads.tolist() == [0, 1, 4, 5, 6, 7] and kv.tolist() == [0, 2, 3]


def test_query_mode_removes_the_same_number_per_group():
    model = _model()
    s = score_units(model, None, "magnitude", gqa="query")
    for key in s.values:
        s.values[key] = torch.full_like(s.values[key], 5.0)
    # groups are (0, 1), (2, 3), (4, 5), (6, 7); the cheapest head of every group is 0, 3, 4, 7
    s.values[(1, "attention")] = torch.tensor([0.0, 9.0, 9.0, 0.1, 0.2, 9.0, 9.0, 0.3])
    per_round = 4 * 2 * 8 * 64  # one query head from each of the 4 groups
    alloc = allocate(s, remove_params=per_round, gamma=1e-6)
    heads, kv = alloc.plan.attention[1]
    assert heads.tolist() == [1, 2, 5, 6] and kv.tolist() == [0, 1, 2, 3]
    assert alloc.removed_params == per_round
    # one expensive head in a group blocks the round in that layer: a round goes only when all its heads would
    s.values[(1, "attention")][7] = 6.0
    alloc = allocate(s, remove_params=per_round, gamma=1e-6)
    assert 1 not in alloc.plan.attention


def test_minimums_are_kept():
    model = _model()
    s = score_units(model, None, "magnitude")
    for key in s.values:
        s.values[key] = torch.zeros_like(s.values[key])
    s.values[(0, "mlp")] = s.values[(0, "mlp")] - 1.0  # layer 0 is the cheapest everywhere
    alloc = allocate(s, ratio=0.3, min_neurons=64, min_heads=2, round_to=8)
    pruned = prune_width(model, alloc.plan)
    for w in layer_widths(pruned):
        assert w["intermediate"] >= 64 and w["kv_heads"] >= 2


def test_bad_input():
    model = _model()
    s = score_units(model, None, "magnitude")
    for ratio in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(InfeasibleError, match=r"ratio must be a finite number in \(0, 1\)"):
            allocate(s, ratio=ratio)
    with pytest.raises(InfeasibleError, match="would leave a layer empty"):
        allocate(s, ratio=0.95)
    with pytest.raises(InfeasibleError, match="round_to=512 is larger than the MLP width 256 of layer 0"):
        allocate(s, ratio=0.1, round_to=512)
    with pytest.raises(InfeasibleError, match="gamma must be > 0"):
        allocate(s, ratio=0.1, gamma=0.0)
    with pytest.raises(InfeasibleError, match="exactly one"):
        allocate(s)


def test_uniform_allocation_takes_the_same_share_of_every_layer():
    model = _model()
    s = score_units(model, None, "magnitude")
    torch.manual_seed(0)
    for key in s.values:  # very different scales per layer: a global ranking would strip layer 0
        s.values[key] = torch.rand_like(s.values[key]) * 10.0 ** key[0]
    glob = allocate(s, ratio=0.25, round_to=8, allocation="global")
    assert glob.kept[(0, "mlp")] == 8  # layer 0 is stripped to the minimum
    uni = allocate(s, ratio=0.25, round_to=8, allocation="uniform")
    assert uni.allocation == "uniform"
    removed = [256 - uni.kept[(i, "mlp")] for i in range(4)]
    assert max(removed) - min(removed) <= 8  # the same share, up to one rounding chunk
    assert abs(uni.removed_params - uni.target_params) <= 3 * 64 * 8
    with pytest.raises(InfeasibleError, match="unknown allocation"):
        allocate(s, ratio=0.2, allocation="layerwise")


def test_amp_defaults_to_uniform_allocation():
    model = _model()
    windows = torch.randint(0, 128, (2, 8))
    assert allocate(score_units(model, windows, "amp"), ratio=0.1).allocation == "uniform"
    assert allocate(score_units(model, windows, "ntk"), ratio=0.1).allocation == "global"
