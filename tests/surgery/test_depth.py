"""Depth surgery: deleted layers and zeroed halves equal gated-off branches, save/reload exactly, generate with
the KV cache."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from tiny_models import EXTRA_ARCHS

from cbo.errors import ModelError
from cbo.evaluate import count_parameters
from cbo.model.blocks import decoder_layers, find_blocks, layer_parts, with_branch_tensor
from cbo.surgery.depth import (
    ZeroAttention,
    remove_blocks,
    remove_sublayers,
    restore_zeroed_sublayers,
    zeroed_sublayers,
)
from cbo.surgery.io import load_pruned


def _logits(model, x):
    with torch.no_grad():
        return model(x, use_cache=False).logits


def _skip_layers_by_hooks(model, layer_ids):
    """Reference: the original model with the residual branch of each listed layer set to 0 by hooks."""
    layers, _ = decoder_layers(model)

    def identity(module, args, kwargs, output):
        h_in = args[0] if args else kwargs["hidden_states"]
        return with_branch_tensor(output, h_in)

    return [layers[i].register_forward_hook(identity, with_kwargs=True) for i in layer_ids]


def _zero_branches_by_hooks(model, halves):
    layers, _ = decoder_layers(model)
    hooks = []
    for layer, part in halves:
        branch = layer_parts(layers[layer], model)[f"{part}_branch"]
        hooks.append(
            branch.register_forward_hook(
                lambda m, a, out: with_branch_tensor(out, torch.zeros_like(out[0] if isinstance(out, tuple) else out))
            )
        )
    return hooks


def _check_saved_reloaded(pruned, x, folder, new_tokens: int):
    """Save ``pruned``, reload it with ``load_pruned``: the same logits, and cached greedy generation equal to
    generation without a cache. Returns the reloaded model."""
    pruned.save_pretrained(folder)
    reloaded = load_pruned(folder)
    assert torch.equal(_logits(reloaded, x), _logits(pruned, x))
    prompt = x[:1, :6]
    generated = reloaded.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    assert torch.equal(generated, _greedy_without_cache(reloaded, prompt, new_tokens))
    return reloaded


def _greedy_without_cache(model, prompt, n):
    """Greedy decoding by full forward passes (no KV cache), stopping at the end-of-text token like generate."""
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos]) - {None}
    seq = prompt
    for _ in range(n):
        nxt = _logits(model, seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
        if int(nxt) in eos:
            break
    return seq


def test_removed_layers_equal_gated_off_layers(tiny_model, tiny_windows, any_arch):
    model = tiny_model(any_arch, n_layers=5)
    x = tiny_windows(model, n=2, seq_len=12)
    hooks = _skip_layers_by_hooks(model, [0, 3])
    try:
        expected = _logits(model, x)
    finally:
        for h in hooks:
            h.remove()
    pruned = remove_blocks(model, [3, 0])
    torch.testing.assert_close(_logits(pruned, x), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(_logits(model, x), expected)  # the removal did change the model


def test_remove_blocks_updates_config_and_layer_idx(tiny_model, any_arch):
    model = tiny_model(any_arch, n_layers=5)
    types = list(getattr(model.config, "layer_types", None) or [])
    pruned = remove_blocks(model, [1, 4])
    layers, _ = decoder_layers(pruned)
    assert len(layers) == 3 and pruned.config.num_hidden_layers == 3
    assert len(decoder_layers(model)[0]) == 5 and model.config.num_hidden_layers == 5  # original untouched
    for k, layer in enumerate(layers):
        idx = {m.layer_idx for m in layer.modules() if isinstance(getattr(m, "layer_idx", None), int)}
        assert idx == {k}
    if types:
        assert list(pruned.config.layer_types) == [types[0], types[2], types[3]]
    assert pruned.config.cbo_removed_layers == [1, 4]
    assert pruned.config.cbo_original_layers == [0, 2, 3]


def test_save_reload_identical_and_generates_with_cache(tiny_model, tiny_windows, any_arch, tmp_path):
    model = tiny_model(any_arch, n_layers=5)
    x = tiny_windows(model, n=2, seq_len=12)
    pruned = remove_blocks(model, [0, 2])
    pruned.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.num_hidden_layers == 3
    assert torch.equal(_logits(reloaded, x), _logits(pruned, x))
    prompt = x[:1, :6]
    generated = reloaded.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert generated.shape == (1, 11)
    assert torch.equal(generated, _greedy_without_cache(reloaded, prompt, 5))


@pytest.mark.parametrize("arch", EXTRA_ARCHS)
def test_more_architectures(tiny_model, tiny_windows, arch, tmp_path):
    model = tiny_model(arch, n_layers=4)
    x = tiny_windows(model, n=2, seq_len=12)
    hooks = _skip_layers_by_hooks(model, [1]) + _zero_branches_by_hooks(model, [(0, "attn"), (2, "mlp")])
    try:
        expected = _logits(model, x)
    finally:
        for h in hooks:
            h.remove()
    pruned = remove_sublayers(remove_blocks(model, [1]), [(0, "attn"), (1, "mlp")])
    torch.testing.assert_close(_logits(pruned, x), expected, atol=1e-5, rtol=1e-5)
    _check_saved_reloaded(pruned, x, tmp_path, 4)


def test_repeated_removal_tracks_original_indices(tiny_model):
    model = tiny_model("llama", n_layers=6)
    once = remove_blocks(model, [1])
    twice = remove_blocks(once, [1, 4])  # original layers 2 and 5
    assert twice.config.cbo_removed_layers == [1, 2, 5]
    assert twice.config.cbo_original_layers == [0, 3, 4]
    direct = remove_blocks(model, [1, 2, 5])
    x = torch.randint(0, 128, (2, 8))
    assert torch.equal(_logits(twice, x), _logits(direct, x))


def test_inplace_and_blocks_objects(tiny_model):
    model = tiny_model("qwen2", n_layers=4)
    blocks = find_blocks(model)
    out = remove_blocks(model, [blocks[3]], inplace=True)
    assert out is model and len(decoder_layers(model)[0]) == 3
    assert remove_blocks(model, []) is not model


@pytest.mark.parametrize(
    "bad, match",
    [([4], "out of range"), ([-1], "out of range"), ([0, 1, 2, 3], "at least one"), ([True], "not an integer")],
)
def test_remove_blocks_rejects_bad_indices(tiny_model, bad, match):
    with pytest.raises(ModelError, match=match):
        remove_blocks(tiny_model("llama", n_layers=4), bad)


def test_remove_blocks_rejects_sublayer_blocks(tiny_model):
    model = tiny_model("llama", n_layers=2)
    with pytest.raises(ModelError, match="remove_sublayers"):
        remove_blocks(model, [find_blocks(model, "sublayer")[0]])


def test_gpt2_inverse_layer_scaling_is_refused(tiny_model):
    model = tiny_model("gpt2", n_layers=3, scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ModelError, match="layer_idx"):
        remove_blocks(model, [0])


# --------------------------------------------------------------------------------------------- sublayers


def test_zeroed_halves_equal_gated_off_branches(tiny_model, tiny_windows, any_arch):
    model = tiny_model(any_arch, n_layers=4)
    x = tiny_windows(model, n=2, seq_len=12)
    halves = [(0, "attn"), (1, "mlp"), (3, "attn")]
    hooks = _zero_branches_by_hooks(model, halves)
    try:
        expected = _logits(model, x)
    finally:
        for h in hooks:
            h.remove()
    pruned = remove_sublayers(model, halves)
    torch.testing.assert_close(_logits(pruned, x), expected, atol=1e-5, rtol=1e-5)
    blocks = {b.name: b for b in find_blocks(model, "sublayer")}
    removed = sum(blocks[f"layers.{i}.{p}"].n_params for i, p in halves)
    assert count_parameters(model) - count_parameters(pruned) == removed
    assert zeroed_sublayers(pruned) == sorted(halves)
    assert isinstance(
        decoder_layers(pruned)[0][0].get_submodule(layer_parts(decoder_layers(model)[0][0], model)["attn_name"]),
        ZeroAttention,
    )


def test_zeroed_halves_save_reload_and_generate(tiny_model, tiny_windows, any_arch, tmp_path):
    model = tiny_model(any_arch, n_layers=4)
    x = tiny_windows(model, n=2, seq_len=12)
    pruned = remove_sublayers(model, [(0, "attn"), (2, "mlp")])  # layer 0: the cache length is read there
    _check_saved_reloaded(pruned, x, tmp_path, 5)
    # plain from_pretrained + restore gives the same model
    plain = restore_zeroed_sublayers(transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval())
    assert torch.equal(_logits(plain, x), _logits(pruned, x))


def test_both_halves_delete_the_layer(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=4)
    x = tiny_windows(model)
    step1 = remove_sublayers(model, [(1, "attn"), (3, "mlp")])
    step2 = remove_sublayers(step1, [(1, "mlp"), "layers.2.attn"])  # layer 1 now fully gone
    assert step2.config.num_hidden_layers == 3
    assert zeroed_sublayers(step2) == [(1, "attn"), (2, "mlp")]  # old layers 2, 3 renumbered
    reference = remove_blocks(remove_sublayers(model, [(2, "attn"), (3, "mlp")]), [1])
    torch.testing.assert_close(_logits(step2, x), _logits(reference, x), atol=1e-6, rtol=1e-6)


def test_remove_blocks_renumbers_zeroed_halves(tiny_model):
    model = remove_sublayers(tiny_model("llama", n_layers=4), [(1, "attn"), (3, "mlp")])
    pruned = remove_blocks(model, [0, 1])
    assert zeroed_sublayers(pruned) == [(1, "mlp")]


def test_sublayer_blocks_and_bad_parts(tiny_model):
    model = tiny_model("gemma3", n_layers=3)
    blocks = find_blocks(model, "sublayer")
    pruned = remove_sublayers(model, [blocks[1], blocks[2]])
    assert zeroed_sublayers(pruned) == [(0, "mlp"), (1, "attn")]
    with pytest.raises(ModelError, match="unknown sublayer part"):
        remove_sublayers(model, [(0, "router")])
    with pytest.raises(ModelError, match="out of range"):
        remove_sublayers(model, [(3, "attn")])
    with pytest.raises(ModelError, match="at least one layer"):
        remove_sublayers(model, [(i, p) for i in range(3) for p in ("attn", "mlp")])


def test_copy_is_independent(tiny_model):
    model = tiny_model("gpt2", n_layers=3)
    before = copy.deepcopy(model.state_dict())
    remove_sublayers(model, [(0, "attn")])
    remove_blocks(model, [1])
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.model
def test_default_model_prune_save_reload(default_model, tmp_path):
    model, tokenizer = default_model
    pruned = remove_blocks(model, [20, 25, 28])
    pruned.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = tokenizer("It is a truth universally acknowledged", return_tensors="pt")["input_ids"]
    assert reloaded.config.num_hidden_layers == 27
    assert torch.equal(_logits(reloaded, ids), _logits(pruned, ids))
    out = reloaded.generate(ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(out, _greedy_without_cache(reloaded, ids, 5))
