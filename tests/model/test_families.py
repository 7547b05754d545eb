"""The family table's pure parts (no torch): kinds, caps on kinds that combined kinds hold, keep by kind, and the
config rewrites of the families whose layer pattern is not a per-layer list."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cbo.errors import InfeasibleError
from cbo.model.families import (
    blocks_of_kind,
    can_delete_layers,
    combined_kind,
    kind_parts,
    module_kind,
    periodic,
    resolve_caps,
    sparse_step_rewrite,
)


def test_combined_kinds():
    assert combined_kind(["mlp", "mamba"]) == "mamba+mlp"
    assert combined_kind(["attention+mamba", "mlp"]) == "attention+mamba+mlp"
    assert combined_kind(["moe", "moe"]) == "moe"
    assert kind_parts("attention+moe") == {"attention", "moe"}


def test_module_kind_from_what_the_module_is():
    class BambaMixer:
        pass

    class Qwen3NextGatedDeltaNet:
        pass

    class LlamaAttention:
        pass

    experts = SimpleNamespace(experts=[1, 2])
    assert module_kind(BambaMixer(), "attention") == "mamba"
    assert module_kind(Qwen3NextGatedDeltaNet(), "attention") == "mamba"
    assert module_kind(LlamaAttention(), "mlp") == "attention"
    assert module_kind(experts, "mlp") == "moe"
    assert module_kind(SimpleNamespace(), "mlp") == "mlp"
    assert module_kind(SimpleNamespace(stand_in_kind="mamba"), "mlp") == "mamba"  # a zero stand-in says


def test_caps_on_kinds_that_combined_kinds_hold():
    layers = ["mamba+mlp", "attention+mlp", "mamba+mlp", "attention+moe"]
    assert resolve_caps({"mamba": 0}, layers) == {"mamba+mlp": 0}
    assert resolve_caps({"mamba+mlp": 2, "mamba": 0}, layers) == {"mamba+mlp": 0}  # the tighter cap holds
    assert resolve_caps({"attention": 0}, layers) == {"attention+mlp": 0, "attention+moe": 0}
    assert resolve_caps({"moe": 1}, layers) == {"attention+moe": 1}
    with pytest.raises(InfeasibleError, match="spans the block kinds"):
        resolve_caps({"attention": 1}, layers)  # one count over two cap groups: not a per-kind cap
    with pytest.raises(InfeasibleError, match="does not have"):
        resolve_caps({"router": 1}, layers)
    assert resolve_caps({"attention": 1, "mamba": 0}, ["mamba", "mlp", "attention", "mlp"]) == {
        "attention": 1,
        "mamba": 0,
    }


def test_blocks_of_a_kind():
    assert blocks_of_kind("mamba", ["mamba+mlp", "attention+mlp", "mamba"]) == [0, 2]
    assert blocks_of_kind("attention+mlp", ["mamba+mlp", "attention+mlp"]) == [1]
    assert blocks_of_kind("moe", ["layer", "layer"]) == []


def test_periodic_patterns():
    assert periodic([False, True, False, True]) == (2, 1)
    assert periodic([True, False, False]) == (3, 0)  # one occurrence: a period past the end
    assert periodic([False, False]) == (3, 2)  # none at all: an offset past the end
    assert periodic([True, True, False]) is None
    for flags in ([True, False, False, True, False, False], [False] * 4, [True] * 3):
        period, offset = periodic(flags)
        assert [i % period == offset for i in range(len(flags))] == flags


def test_jamba_deletion_needs_a_periodic_rest_and_an_attention_layer():
    config = SimpleNamespace(
        model_type="jamba", attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
        layer_types=["linear_attention", "full_attention"] * 2 + ["linear_attention"],
    )  # fmt: skip
    assert can_delete_layers(config, [1, 2, 3, 4])  # a m a m
    assert not can_delete_layers(config, [0, 1, 3, 4])  # m a a m
    assert not can_delete_layers(config, [0, 2, 4])  # no attention layer left
    dense = SimpleNamespace(model_type="llama", layer_types=["full_attention"] * 3)
    assert can_delete_layers(dense, [0])


def test_sparse_step_rewrite_writes_the_kept_pattern():
    # experts at every second layer (1, 3, 5), layer 3 dense by the list: MoE at 1 and 5
    config = SimpleNamespace(decoder_sparse_step=2, mlp_only_layers=[3], num_experts=4)
    assert sparse_step_rewrite(config, [0, 1, 3, 5]) == ("decoder_sparse_step", "mlp_only_layers")
    assert config.decoder_sparse_step == 1 and config.mlp_only_layers == [0, 2]
