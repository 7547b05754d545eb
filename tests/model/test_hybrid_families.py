"""A hybrid state-space family (Bamba: Mamba2 mixer layers and attention layers) end to end on a tiny random
config at layer granularity: estimate, solve, validate, remove (the attention-layer list renumbered with the
layers), save, reload with plain transformers, generate with the hybrid cache."""

from __future__ import annotations

import logging

import pytest
import torch
from tiny_models import CharTokenizer, build_tiny_hybrid, random_token_windows

from cbo.model.blocks import find_blocks
from cbo.pipeline import prune_depth
from cbo.surgery.depth import remove_blocks
from cbo.surgery.io import save_pruned

TEXT = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want. " * 6,
    "However little known the feelings or views of such a man may be on his first entering a neighbourhood. " * 6,
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite. " * 6,
    "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own amusement, never took up. " * 6,
]


@pytest.fixture(autouse=True)
def quiet_kernel_fallbacks():
    # transformers says once per kernel that the reference PyTorch implementation of the Mamba2 scan is used
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def test_removing_layers_renumbers_the_attention_layers():
    model = build_tiny_hybrid(n_layers=6)  # attention at 1, 3, 5; mamba at 0, 2, 4
    pruned = remove_blocks(model, [0, 3])
    assert pruned.config.num_hidden_layers == 4
    assert pruned.config.attn_layer_indices == [0, 3]  # old 1 -> 0, old 5 -> 3
    kinds = ["attention" if hasattr(layer, "self_attn") else "mamba" for layer in pruned.model.layers]
    assert kinds == ["attention", "mamba", "mamba", "attention"]
    assert pruned.config.layers_block_type == [
        "full_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
    ]
    for k, layer in enumerate(pruned.model.layers):
        mixer = layer.self_attn if hasattr(layer, "self_attn") else layer.mamba
        assert mixer.layer_idx == k


def test_hybrid_end_to_end(tmp_path):
    import transformers as tf

    model = build_tiny_hybrid(n_layers=6, vocab_size=259)
    assert len(find_blocks(model, "layer")) == 6
    report = prune_depth(
        model, CharTokenizer(), TEXT, remove=2, solver="enumerate", top_k=3, validate=3, n_calibration=3,
        n_validation=2, seq_len=24, batch_size=3, cache_dir=None, progress=False,
    )  # fmt: skip
    pruned = report.pruned_model
    windows = random_token_windows(259, n=2, seq_len=12)
    folder = save_pruned(pruned, tmp_path / "m")
    plain = tf.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert plain.config.num_hidden_layers == 4
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=windows).logits, pruned(input_ids=windows).logits, atol=1e-6)
        cached = plain.generate(windows[:1, :5], max_new_tokens=6, do_sample=False, use_cache=True)
        uncached = plain.generate(windows[:1, :5], max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached) and cached.shape[1] == 11
    # the measured validation loss of the chosen set is that of the pruned model itself
    from cbo.evaluate import evaluate
    from cbo.pipeline.inputs import token_splits

    splits = token_splits(
        None, CharTokenizer(), TEXT, model=model, seq_len=24, n_calibration=3, n_validation=2, n_test=0, seed=0
    )
    direct = evaluate(pruned, splits.validation, batch_size=3)
    assert report.pruned_metrics["ppl"] == pytest.approx(direct["ppl"], rel=1e-4)
