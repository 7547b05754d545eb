"""Width surgery: the sliced model computes what the original computes with the removed units masked to zero."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from tiny_models import TINY_ARCHS, build_tiny_model, random_token_windows

from cbo.errors import ModelError
from cbo.evaluate import count_parameters
from cbo.model.blocks import decoder_layers, layer_parts
from cbo.model.structures import layer_widths
from cbo.surgery.width import WidthPlan, prune_width


def _random_plan(model, mode: str, seed: int) -> WidthPlan:
    rng = random.Random(seed)
    cfg = model.config
    n = cfg.num_attention_heads
    nkv = getattr(cfg, "num_key_value_heads", n)
    g = n // nkv
    inter = model_structures_width(model)
    plan = WidthPlan()
    for layer in range(cfg.num_hidden_layers):
        if mode == "group" or g == 1:
            kv = sorted(rng.sample(range(nkv), rng.randint(1, nkv)))
            q = [k * g + j for k in kv for j in range(g)]
        else:  # the same number of query heads in every group
            per = rng.randint(1, g)
            kv = list(range(nkv))
            q = sorted(k * g + j for k in kv for j in rng.sample(range(g), per))
        plan.attention[layer] = (q, kv)
        plan.mlp[layer] = sorted(rng.sample(range(inter), rng.randint(1, inter)))
    return plan


def model_structures_width(model) -> int:
    return layer_widths(model)[0]["intermediate"]


def _mask(model, plan: WidthPlan):
    """Zero, by hand, the output-projection entries of every removed head and neuron."""
    masked = copy.deepcopy(model)
    layers, _ = decoder_layers(masked)
    d = layer_widths(model)[0]["head_dim"]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            parts = layer_parts(layer, masked)
            attn, mlp = parts["attn"], parts["mlp"]
            q_kept, _ = plan.attention[i]
            n = attn_heads(attn, d)
            for h in set(range(n)) - set(q_kept):
                cols = slice(h * d, (h + 1) * d)
                if hasattr(attn, "o_proj"):
                    attn.o_proj.weight[:, cols] = 0
                elif hasattr(attn, "c_proj"):  # GPT-2 Conv1D: (in, out)
                    attn.c_proj.weight[cols, :] = 0
                else:
                    attn.dense.weight[:, cols] = 0
            gone = sorted(set(range(model_structures_width(model))) - set(plan.mlp[i]))
            if hasattr(mlp, "down_proj"):
                mlp.down_proj.weight[:, gone] = 0
            elif hasattr(mlp, "c_proj"):
                mlp.c_proj.weight[gone, :] = 0
            else:
                mlp.dense_4h_to_h.weight[:, gone] = 0
    return masked


def attn_heads(attn, d: int) -> int:
    for name in ("o_proj", "dense"):
        if hasattr(attn, name):
            return getattr(attn, name).weight.shape[1] // d
    return attn.c_proj.weight.shape[0] // d


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("mode", ["group", "query"])
def test_sliced_equals_masked(arch, mode):
    if mode == "query" and arch in ("gpt2", "gpt_neox"):
        pytest.skip("multi-head attention: one unit per head in both modes")
    model = build_tiny_model(arch, n_layers=3)
    windows = random_token_windows(model, n=2, seq_len=12)
    for seed in range(2):
        plan = _random_plan(model, mode, seed)
        sliced = prune_width(model, plan)
        masked = _mask(model, plan)
        with torch.no_grad():
            expected = masked(input_ids=windows).logits
            got = sliced(input_ids=windows).logits
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        widths = layer_widths(sliced)
        for i, w in enumerate(widths):
            q, kv = plan.attention[i]
            assert (w["heads"], w["kv_heads"], w["intermediate"]) == (len(q), len(kv), len(plan.mlp[i]))
        assert count_parameters(sliced) < count_parameters(model)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox"])
def test_generation_with_cache_after_slicing(arch):
    model = build_tiny_model(arch, n_layers=2)
    plan = _random_plan(model, "query", seed=1)
    sliced, masked = prune_width(model, plan), _mask(model, plan)
    prompt = random_token_windows(model, n=1, seq_len=6)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(sliced.generate(prompt, **kw), masked.generate(prompt, **kw))


def test_original_untouched_unless_inplace():
    model = build_tiny_model("llama", n_layers=2)
    before = count_parameters(model)
    plan = WidthPlan(mlp={0: list(range(8))})
    prune_width(model, plan)
    assert count_parameters(model) == before
    same = prune_width(model, plan, inplace=True)
    assert same is model and count_parameters(model) < before


def test_invalid_plans_are_rejected():
    model = build_tiny_model("llama", n_layers=2)  # 4 query heads in 2 groups
    with pytest.raises(ModelError, match="same number in every group"):
        prune_width(model, WidthPlan(attention={0: ([0, 1, 2], [0, 1])}))
    with pytest.raises(ModelError, match="key/value heads \\[1\\] that are removed"):
        prune_width(model, WidthPlan(attention={0: ([0, 2], [0])}))
    with pytest.raises(ModelError, match="empty the layer"):
        prune_width(model, WidthPlan(mlp={1: []}))
    with pytest.raises(ModelError, match="out of range"):
        prune_width(model, WidthPlan(mlp={1: [0, 64]}))
    with pytest.raises(ModelError, match="repeated"):
        prune_width(model, WidthPlan(mlp={1: [0, 0]}))
    with pytest.raises(ModelError, match="layer 5"):
        prune_width(model, WidthPlan(mlp={5: [0]}))


def test_slicing_twice_composes():
    model = build_tiny_model("qwen2", n_layers=2)
    windows = random_token_windows(model, n=2, seq_len=10)
    once = prune_width(model, WidthPlan(attention={0: ([0, 2], [0, 1])}, mlp={1: [1, 5, 9, 20]}))
    twice = prune_width(once, WidthPlan(attention={0: ([1], [1])}, mlp={1: [0, 3]}))
    direct = prune_width(model, WidthPlan(attention={0: ([2], [1])}, mlp={1: [1, 20]}))
    torch.testing.assert_close(twice(input_ids=windows).logits, direct(input_ids=windows).logits)
