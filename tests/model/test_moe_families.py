"""Mixture-of-experts families end to end on tiny random configs: blocks (the experts form the MLP half), estimate,
solve, validate, remove, save, reload with plain transformers, generate with the KV cache."""

from __future__ import annotations

import pytest
import torch
from tiny_models import MOE_ARCHS, CharTokenizer, build_tiny_moe, random_token_windows

from cbo.model.blocks import find_blocks
from cbo.pipeline import prune_depth
from cbo.surgery.io import load_pruned, save_pruned

TEXT = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want. " * 6,
    "However little known the feelings or views of such a man may be on his first entering a neighbourhood. " * 6,
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite. " * 6,
    "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own amusement, never took up. " * 6,
]


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_blocks_of_a_moe_model(arch):
    model = build_tiny_moe(arch, vocab_size=259)
    blocks = find_blocks(model, "sublayer")
    assert [b.kind for b in blocks] == ["attention", "moe"] * 4
    assert [b.name for b in blocks][:2] == ["layers.0.attn", "layers.0.moe"]
    layer = model.model.layers[0]
    # the router, every expert, and the norm that only feeds them
    experts = sum(p.numel() for p in [*layer.mlp.parameters(), *layer.post_attention_layernorm.parameters()])
    assert blocks[1].module is layer.mlp and blocks[1].n_params == experts
    assert blocks[1].n_params > blocks[0].n_params  # four experts outweigh the attention


@pytest.mark.parametrize("granularity", ["layer", "sublayer"])
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_end_to_end(arch, granularity, tmp_path):
    import transformers as tf

    model = build_tiny_moe(arch, vocab_size=259)
    report = prune_depth(
        model, CharTokenizer(), TEXT, remove=2, granularity=granularity, solver="enumerate", top_k=3, validate=3,
        n_calibration=3, n_validation=2, seq_len=24, batch_size=3, cache_dir=None, progress=False,
    )  # fmt: skip
    pruned = report.pruned_model
    # the validation measurement equals the pruned model's own loss on the validation windows
    assert report.validation and report.pruned_metrics["kl"] >= 0
    folder = save_pruned(pruned, tmp_path / "m")
    plain = tf.AutoModelForCausalLM.from_pretrained(folder).eval()
    windows = random_token_windows(259, n=2, seq_len=12)
    with torch.no_grad():
        want = pruned(input_ids=windows).logits
        got = (
            plain(input_ids=windows).logits if granularity == "layer" else load_pruned(folder)(input_ids=windows).logits
        )
        assert torch.allclose(got, want, atol=1e-6)
        loaded = plain if granularity == "layer" else load_pruned(folder)
        cached = loaded.generate(windows[:1, :5], max_new_tokens=6, do_sample=False, use_cache=True)
        uncached = loaded.generate(windows[:1, :5], max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached) and cached.shape[1] == 11
    if granularity == "layer":
        assert plain.config.num_hidden_layers == 2
