"""Tiny random models built from configs, random token windows and a character tokenizer for tests.

Import them in test modules with ``from tiny_models import build_tiny_model, TINY_ARCHS, ...``; the
fixtures in ``conftest.py`` wrap the same helpers.
"""

from __future__ import annotations

TINY_ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma3", "gpt2", "gpt_neox")
EXTRA_ARCHS = ("gemma", "gemma2", "phi3", "olmo2")  # also supported; built on request, not in `any_arch`
TINY_VOCAB = 128


def _llama_like(n_layers: int) -> dict:
    """The sizes every tiny dense (and mixture-of-experts) model shares: width 32, 4 heads over 2 KV groups."""
    return dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )


def _config(arch: str, n_layers: int, **overrides):
    import transformers as tf

    common = dict(vocab_size=TINY_VOCAB, initializer_range=0.1)
    llama_like = _llama_like(n_layers)
    if arch == "llama":
        cfg = tf.LlamaConfig(**common, **llama_like)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(**common, **llama_like)
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(**common, **llama_like, head_dim=8)
    elif arch == "mistral":
        cfg = tf.MistralConfig(**common, **llama_like)
    elif arch == "gemma3":
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
        cfg = tf.Gemma3TextConfig(
            **common,
            **llama_like,
            head_dim=8,
            query_pre_attn_scalar=8,
            sliding_window=8,
            layer_types=types,
        )
    elif arch == "gpt2":
        cfg = tf.GPT2Config(
            **common, n_embd=32, n_layer=n_layers, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2
        )
    elif arch == "gpt_neox":
        cfg = tf.GPTNeoXConfig(
            **common,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            max_position_embeddings=128,
        )
    elif arch == "gemma":
        cfg = tf.GemmaConfig(**common, **llama_like, head_dim=8)
    elif arch == "gemma2":
        cfg = tf.Gemma2Config(**common, **llama_like, head_dim=8, query_pre_attn_scalar=8, sliding_window=8)
    elif arch == "phi3":
        cfg = tf.Phi3Config(**common, **llama_like, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    elif arch == "olmo2":
        cfg = tf.Olmo2Config(**common, **llama_like, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}; use one of {TINY_ARCHS + EXTRA_ARCHS}")
    return _overridden(cfg, overrides)


def _overridden(cfg, overrides: dict):
    """``cfg`` with the given attributes set (the tests' way to vary one field of a tiny config)."""
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def _seeded_model(cfg, seed: int, model_class=None):
    """A random model of ``cfg`` (``model_class``, or the auto class of the config), seeded, in eval mode."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    return (model_class(cfg) if model_class else tf.AutoModelForCausalLM.from_config(cfg)).eval()


def build_tiny_model(arch: str = "llama", n_layers: int = 4, seed: int = 0, **overrides):
    """A tiny random causal LM of the given architecture (eval mode, float32, seeded)."""
    import transformers as tf

    return _seeded_model(_config(arch, n_layers, **overrides), seed, tf.Gemma3ForCausalLM if arch == "gemma3" else None)


def save_word_model(path, n_layers: int):
    """A tiny Llama of ``n_layers`` over :func:`tiny_tokenizers.word_level_tokenizer`, saved with the tokenizer as
    the model folder ``path``: (model, tokenizer)."""
    from tiny_tokenizers import word_level_tokenizer

    tok = word_level_tokenizer()
    model = build_tiny_model("llama", n_layers=n_layers, vocab_size=len(tok))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


def random_token_windows(model_or_vocab, n: int = 4, seq_len: int = 16, seed: int = 0):
    """Random int64 token windows ``(n, seq_len)`` valid for a model (or a vocabulary size)."""
    from cbo.data.windows import model_vocab_size, random_windows

    vocab = model_or_vocab if isinstance(model_or_vocab, int) else model_vocab_size(model_or_vocab)
    return random_windows(n, seq_len, vocab, seed=seed)


def random_splits(model, n_cal: int = 4, n_val: int = 4, seq_len: int = 16):
    """``TokenSplits`` of random windows for ``model``: calibration (seed 1), validation (seed 2), one test window."""
    from cbo.data.windows import TokenSplits

    windows = [random_token_windows(model, n=n, seq_len=seq_len, seed=s) for n, s in ((n_cal, 1), (n_val, 2), (1, 3))]
    return TokenSplits(*windows, {"source": "random"})


class CharTokenizer:
    """A tokenizer-free stand-in: one id per byte (ids 3..258), id 2 = end of text."""

    eos_token_id = 2
    name_or_path = "char-tokenizer"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [3 + b for b in text.encode("utf-8")]

    def __len__(self) -> int:
        return 259


MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")  # mixture-of-experts: the experts form the MLP half


def build_tiny_moe(arch: str = "mixtral", n_layers: int = 4, seed: int = 0, **overrides):
    """A tiny random mixture-of-experts causal LM (4 experts, 2 per token; eval mode, float32, seeded)."""
    import transformers as tf

    common = dict(vocab_size=TINY_VOCAB, initializer_range=0.1, **_llama_like(n_layers), num_experts_per_tok=2)
    if arch == "mixtral":
        cfg = tf.MixtralConfig(**common, num_local_experts=4)
    elif arch == "qwen2_moe":
        cfg = tf.Qwen2MoeConfig(
            **common, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=1
        )
    elif arch == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**common, num_experts=4, moe_intermediate_size=32, decoder_sparse_step=1, head_dim=8)
    elif arch == "olmoe":
        cfg = tf.OlmoeConfig(**common, num_experts=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    else:
        raise ValueError(f"unknown tiny mixture-of-experts architecture {arch!r}; use one of {MOE_ARCHS}")
    return _seeded_model(_overridden(cfg, overrides), seed)


HYBRID_ARCHS = ("bamba", "jamba", "falcon_h1", "granitemoehybrid", "qwen3_next", "lfm2", "nemotron_h")
MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_expand=2, mamba_chunk_size=16)


def hybrid_config(arch: str = "bamba", n_layers: int = 4, **overrides):
    """The config of a tiny hybrid: state-space (or linear-attention, or short-convolution) mixers with attention at
    the odd layers, and, where the family has them, experts (4, 2 per token) at the odd layers too."""
    import transformers as tf

    common = dict(
        vocab_size=TINY_VOCAB, initializer_range=0.1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    odd = list(range(1, n_layers, 2))
    types = ["full_attention" if i in odd else "linear_attention" for i in range(n_layers)]
    experts = dict(num_experts_per_tok=2)
    if arch == "bamba":
        cfg = tf.BambaConfig(**common, num_hidden_layers=n_layers, attn_layer_indices=odd, **MAMBA2)
    elif arch == "jamba":
        cfg = tf.JambaConfig(
            **common, **experts, num_hidden_layers=n_layers, attn_layer_period=2, attn_layer_offset=1,
            expert_layer_period=2, expert_layer_offset=1, num_experts=4, mamba_d_state=8, mamba_expand=2,
        )  # fmt: skip
    elif arch == "falcon_h1":
        cfg = tf.FalconH1Config(**common, num_hidden_layers=n_layers, mamba_d_ssm=64, **MAMBA2)
    elif arch == "granitemoehybrid":
        cfg = tf.GraniteMoeHybridConfig(
            **common, **experts, num_hidden_layers=n_layers, layer_types=types, num_local_experts=4,
            shared_intermediate_size=32, **MAMBA2,
        )  # fmt: skip
    elif arch == "qwen3_next":
        cfg = tf.Qwen3NextConfig(
            **common, **experts, num_hidden_layers=n_layers, layer_types=types, head_dim=8, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4,
            moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=2, mlp_only_layers=[],
        )  # fmt: skip
    elif arch == "lfm2":
        conv = ["full_attention" if i in odd else "conv" for i in range(n_layers)]
        cfg = tf.Lfm2Config(**common, num_hidden_layers=n_layers, layer_types=conv)
    elif arch == "nemotron_h":
        pattern = ["linear_attention", "full_attention", "moe", "mlp"]
        cfg = tf.NemotronHConfig(
            **common, **experts, layers_block_type=[pattern[i % 4] for i in range(n_layers)], mamba_num_heads=4,
            mamba_head_dim=16, n_groups=1, ssm_state_size=8, expand=2, chunk_size=16, n_routed_experts=4,
            moe_intermediate_size=32, moe_shared_expert_intermediate_size=32, head_dim=8,
        )  # fmt: skip
    else:
        raise ValueError(f"unknown tiny hybrid architecture {arch!r}; use one of {HYBRID_ARCHS}")
    return _overridden(cfg, overrides)


def build_tiny_hybrid(arch: str = "bamba", n_layers: int = 4, seed: int = 0, **overrides):
    """A tiny random hybrid causal LM of :func:`hybrid_config` (eval mode, float32, seeded)."""
    return _seeded_model(hybrid_config(arch, n_layers, **overrides), seed)


def transformers_warnings():
    """A context manager collecting the messages transformers logs at WARNING or above inside it (a list)."""
    import logging
    from contextlib import contextmanager

    @contextmanager
    def collect():
        records: list[str] = []

        class Collect(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record.getMessage())

        logger, handler = logging.getLogger("transformers"), Collect(level=logging.WARNING)
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        try:
            yield records
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)

    return collect()
