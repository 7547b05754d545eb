"""Block discovery: layer and sublayer blocks of every supported architecture, branch semantics, fallbacks."""

from __future__ import annotations

import pytest
import torch
from tiny_models import EXTRA_ARCHS
from torch import nn

from cbo.errors import ModelError
from cbo.model.blocks import (
    Block,
    block_names,
    branch_tensor,
    decoder_layers,
    find_blocks,
    layer_parts,
    with_branch_tensor,
)


def _unique_params(module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def test_layer_blocks(tiny_model, any_arch):
    model = tiny_model(any_arch, n_layers=3)
    layers, path = decoder_layers(model)
    blocks = find_blocks(model)
    assert [b.name for b in blocks] == ["layers.0", "layers.1", "layers.2"]
    assert [b.index for b in blocks] == [0, 1, 2]
    assert all(b.kind == "layer" for b in blocks)
    assert [b.module for b in blocks] == list(layers)
    assert all(b.n_params == _unique_params(layer) for b, layer in zip(blocks, layers))
    assert blocks[1].path == f"{path}.1"
    assert model.get_submodule(blocks[1].path) is layers[1]


def test_sublayer_blocks_partition_the_layer(tiny_model, any_arch):
    model = tiny_model(any_arch, n_layers=3)
    layers, _ = decoder_layers(model)
    blocks = find_blocks(model, "sublayer")
    assert [b.name for b in blocks[:2]] == ["layers.0.attn", "layers.0.mlp"]
    assert [b.kind for b in blocks] == ["attention", "mlp"] * 3
    assert [b.layer for b in blocks] == [0, 0, 1, 1, 2, 2]
    for layer_index, layer in enumerate(layers):
        attn, mlp = blocks[2 * layer_index], blocks[2 * layer_index + 1]
        # every parameter of the layer belongs to exactly one half
        assert attn.n_params + mlp.n_params == _unique_params(layer)
        assert model.get_submodule(attn.path) is attn.module
    assert block_names(model, "sublayer") == [b.name for b in blocks]


def test_sublayer_branches_sum_to_the_layer_update(tiny_model, tiny_windows, any_arch):
    """layer(h) - h == attn branch output + mlp branch output, for sequential and parallel residuals."""
    model = tiny_model(any_arch, n_layers=2)
    layer = decoder_layers(model)[0][1]
    parts = layer_parts(layer, model)
    seen = {}
    hooks = [
        layer.register_forward_hook(
            lambda m, args, kwargs, out: seen.update(h_in=args[0] if args else kwargs["hidden_states"], h_out=out),
            with_kwargs=True,
        ),
        parts["attn_branch"].register_forward_hook(lambda m, a, out: seen.update(attn=branch_tensor(out))),
        parts["mlp_branch"].register_forward_hook(lambda m, a, out: seen.update(mlp=branch_tensor(out))),
    ]
    try:
        with torch.no_grad():
            model(tiny_windows(model, n=2, seq_len=8))
    finally:
        for h in hooks:
            h.remove()
    update = branch_tensor(seen["h_out"]) - seen["h_in"]
    torch.testing.assert_close(update, seen["attn"] + seen["mlp"], atol=1e-5, rtol=1e-5)
    assert seen["attn"].abs().max() > 0 and seen["mlp"].abs().max() > 0


@pytest.mark.parametrize("arch", EXTRA_ARCHS)
def test_more_architectures(tiny_model, tiny_windows, arch):
    test_sublayer_blocks_partition_the_layer(tiny_model, arch)
    test_sublayer_branches_sum_to_the_layer_update(tiny_model, tiny_windows, arch)


def test_gemma3_branches_are_the_post_norms(tiny_model):
    model = tiny_model("gemma3", n_layers=2)
    blocks = find_blocks(model, "sublayer")
    layer = decoder_layers(model)[0][0]
    assert blocks[0].module is layer.post_attention_layernorm
    assert blocks[1].module is layer.post_feedforward_layernorm


def test_gpt_neox_sequential_residual(tiny_model, tiny_windows):
    model = tiny_model("gpt_neox", n_layers=2, use_parallel_residual=False)
    blocks = find_blocks(model, "sublayer")
    assert blocks[0].module is decoder_layers(model)[0][0].attention


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(8, 8)
        self.mlp = nn.Linear(8, 8)

    def forward(self, h):
        h = h + self.attn(h)
        return h + self.mlp(h)


class _CustomLM(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.heads = nn.ModuleList([nn.Linear(8, 10), nn.Linear(8, 10)])  # not blocks: no submodules
        self.stack = nn.ModuleList([_Block() for _ in range(n)])

    def forward(self, x):
        h = self.embed(x)
        for b in self.stack:
            h = b(h)
        return self.heads[0](h)


def test_generic_fallback_finds_the_repeated_block_list():
    model = _CustomLM(3)
    layers, path = decoder_layers(model)
    assert path == "stack" and layers is model.stack
    blocks = find_blocks(model, "sublayer")
    assert [b.name for b in blocks] == [f"layers.{i}.{p}" for i in range(3) for p in ("attn", "mlp")]
    assert blocks[0].module is model.stack[0].attn
    assert blocks[0].n_params == 72


def test_unknown_architecture_names_the_class_and_the_supported_list():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    with pytest.raises(ModelError) as err:
        find_blocks(model)
    message = str(err.value)
    assert "Sequential" in message and "Llama" in message and "GPT-NeoX" in message


def test_fallback_without_halves_rejects_sublayer_granularity():
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4)) for _ in range(2)])

    assert len(find_blocks(Plain())) == 2
    with pytest.raises(ModelError, match="granularity='layer'"):
        find_blocks(Plain(), "sublayer")


def test_unknown_granularity(tiny_model):
    with pytest.raises(ModelError, match="granularity"):
        find_blocks(tiny_model("llama", 2), "head")


def test_branch_tensor_helpers():
    t, u = torch.ones(2), torch.zeros(2)
    assert branch_tensor(t) is t and branch_tensor((t, None)) is t
    assert with_branch_tensor(t, u) is u
    assert with_branch_tensor((t, "w"), u) == (u, "w")
    with pytest.raises(ModelError):
        branch_tensor(None)


def test_block_is_frozen(tiny_model):
    block = find_blocks(tiny_model("llama", 2))[0]
    assert isinstance(block, Block)
    with pytest.raises(AttributeError):
        block.index = 3


@pytest.mark.model
def test_default_model_has_30_llama_blocks(default_model):
    model, _ = default_model
    blocks = find_blocks(model)
    assert len(blocks) == 30 and type(model).__name__ == "LlamaForCausalLM"
    assert len({b.n_params for b in blocks}) == 1
    halves = find_blocks(model, "sublayer")
    assert len(halves) == 60 and halves[0].n_params + halves[1].n_params == blocks[0].n_params


def test_layer_parts_without_the_model(tiny_model, any_arch):
    model = tiny_model(any_arch, n_layers=2)
    layer = decoder_layers(model)[0][0]
    assert layer_parts(layer) == layer_parts(layer, model)
