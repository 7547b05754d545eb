"""Tiny GGUF files written offline for tests: a random Qwen2 model from ``tiny_models`` with a byte-level BPE
tokenizer, stored as float32 tensors under llama.cpp's names, so that a conversion back must reproduce the
original model's logits exactly.

    model = write_tiny_gguf(tmp_path / "tiny.gguf")
"""

from __future__ import annotations

from pathlib import Path

from tiny_models import build_tiny_model
from tiny_tokenizers import byte_level_vocabulary

# llama.cpp's tensor names for the modules of a Qwen2 decoder layer
_LAYER_TENSORS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_TOP_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def write_tiny_gguf(path: Path, *, n_layers: int = 2, seed: int = 0, architecture: str = "qwen2"):
    """Write a tiny random Qwen2 model as a GGUF file at ``path``; returns the model it holds.

    ``architecture`` is the ``general.architecture`` written (another value makes a file transformers refuses).
    """
    import gguf

    tokens, merges = byte_level_vocabulary()
    model = build_tiny_model("qwen2", n_layers=n_layers, seed=seed, vocab_size=len(tokens))
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-qwen2")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    rope = getattr(cfg, "rope_parameters", None) or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 1) + [3])  # 1 = normal, 3 = control
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 1)
    writer.add_eos_token_id(len(tokens) - 1)
    for key, tensor in model.state_dict().items():
        if key in _TOP_TENSORS:
            name = _TOP_TENSORS[key]
        else:
            _, _, index, *rest = key.split(".")
            name = f"blk.{index}.{_LAYER_TENSORS['.'.join(rest[:-1])]}.{rest[-1]}"
        writer.add_tensor(name, tensor.detach().float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
