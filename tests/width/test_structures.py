"""Which weights form a head / KV group / neuron, per architecture."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_ARCHS, build_tiny_model

from cbo.errors import ModelError
from cbo.model.structures import attention_units, layer_widths, mlp_units, model_structures


def _attn_params(attn) -> int:
    # every attention weight and bias except the output projection's bias (not per head)
    total = 0
    for name, p in attn.named_parameters():
        if name.split(".")[0] in ("o_proj", "c_proj", "dense") and name.endswith("bias"):
            continue
        if "norm" in name:  # q_norm / k_norm act on head_dim, shared by all heads
            continue
        total += p.numel()
    return total


def _mlp_params(mlp) -> int:
    total = 0
    for name, p in mlp.named_parameters():
        if name.split(".")[0] in ("down_proj", "c_proj", "dense_4h_to_h") and name.endswith("bias"):
            continue
        total += p.numel()
    return total


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_structures_cover_the_weights(arch):
    model = build_tiny_model(arch, n_layers=2)
    s = model_structures(model)
    cfg = model.config
    assert sorted(s.attention) == sorted(s.mlp) == [0, 1]
    for i in range(2):
        a, m = s.attention[i], s.mlp[i]
        assert a.n_heads == cfg.num_attention_heads
        assert a.n_kv_heads == getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
        assert a.n_params == _attn_params(a.module)
        assert m.n_params == _mlp_params(m.module)
    widths = layer_widths(model)
    assert len(widths) == 2 and widths[0]["heads"] == cfg.num_attention_heads


def test_units_of_grouped_query_attention():
    model = build_tiny_model("llama", n_layers=1)  # 4 query heads, 2 KV heads, head_dim 8, hidden 32
    a = model_structures(model).attention[0]
    hidden, d = 32, 8
    group = attention_units(a, "group")
    assert group.n == 2 and group.q.tolist() == [[0, 1], [2, 3]] and group.kv.tolist() == [[0], [1]]
    assert group.params == (2 * 2 + 2) * d * hidden  # two q heads + one k + one v + two o slices
    query = attention_units(a, "query")
    assert query.n == 4 and query.kv.shape == (4, 0) and query.chunk == 2
    assert query.params == 2 * d * hidden
    m = mlp_units(model_structures(model).mlp[0])
    assert m.n == 64 and m.params == 3 * hidden


def test_gpt2_slots_follow_the_transposed_layout():
    model = build_tiny_model("gpt2", n_layers=1)
    a = model_structures(model).attention[0]
    c_attn = a.module.c_attn.weight  # (in, 3*out): q | k | v along the columns
    q_slot = [s for s in a.slots if s.name.endswith("c_attn.weight") and s.role == "q"][0]
    rows = q_slot.gather(c_attn, torch.tensor([[1]]))
    assert torch.equal(rows.reshape(-1), c_attn[:, 8:16].T.reshape(-1))
    k_slot = [s for s in a.slots if s.name.endswith("c_attn.weight") and s.role == "kv"][0]
    assert torch.equal(
        k_slot.gather(c_attn, torch.tensor([[1]])).reshape(-1), c_attn[:, 32 + 8 : 32 + 16].T.reshape(-1)
    )


def _phi3():
    import transformers as tf

    cfg = tf.Phi3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
    )
    return tf.Phi3ForCausalLM(cfg).eval()


def test_unsupported_attention_layout_names_the_layouts():
    with pytest.raises(ModelError, match="unsupported attention layout in layer 0: Phi3Attention") as err:
        model_structures(_phi3())
    assert "q_proj/k_proj/v_proj/o_proj" in str(err.value)


def test_unsupported_mlp_layout():
    import transformers as tf

    cfg = tf.Qwen2MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = tf.Qwen2MoeForCausalLM(cfg).eval()
    with pytest.raises(ModelError, match="unsupported MLP layout in layer 0"):
        model_structures(model)
    assert 0 in model_structures(model, kinds=("attention",)).attention


def test_unknown_kind():
    with pytest.raises(ModelError, match="unknown structure kind"):
        model_structures(build_tiny_model("llama", n_layers=1), kinds=("conv",))
