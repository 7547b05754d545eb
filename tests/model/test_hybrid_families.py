"""Hybrid stacks (Mamba2, linear attention or short convolutions beside attention; MLPs or experts) on tiny random
configs of every family: block kinds at both granularities, the config fields removal rewrites, and end to end
(estimate, solve with per-kind caps, validate, remove, save, plain reload, logits, greedy generation with the
family's cache)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import (
    HYBRID_ARCHS,
    MOE_ARCHS,
    CharTokenizer,
    build_tiny_hybrid,
    random_token_windows,
    transformers_warnings,
)

from cbo.errors import InfeasibleError
from cbo.evaluate import evaluate
from cbo.model.blocks import find_blocks, resolve_keep
from cbo.model.families import ARCHITECTURES, kind_parts
from cbo.model.gates import gate_blocks, set_gates
from cbo.pipeline import prune_depth
from cbo.pipeline.inputs import token_splits
from cbo.surgery.depth import remove_blocks, remove_sublayers, zeroed_sublayers
from cbo.surgery.io import load_pruned, save_pruned

TEXT = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want. " * 6,
    "However little known the feelings or views of such a man may be on his first entering a neighbourhood. " * 6,
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite. " * 6,
]

# the kinds of the three-layer tiny configs (tiny_models.hybrid_config: attention at layer 1, experts at layer 1
# where the family has them), written out by hand: (layer granularity, sublayer granularity)
KINDS = {
    "bamba": (["mamba+mlp", "attention+mlp", "mamba+mlp"], ["mamba", "mlp", "attention", "mlp", "mamba", "mlp"]),
    "jamba": (["mamba+mlp", "attention+moe", "mamba+mlp"], ["mamba", "mlp", "attention", "moe", "mamba", "mlp"]),
    "falcon_h1": (["attention+mamba+mlp"] * 3, ["attention+mamba", "mlp"] * 3),
    "granitemoehybrid": (["mamba+moe", "attention+moe", "mamba+moe"], ["mamba", "moe", "attention", "moe"] + ["mamba", "moe"]),
    "qwen3_next": (["mamba+mlp", "attention+moe", "mamba+mlp"], ["mamba", "mlp", "attention", "moe", "mamba", "mlp"]),
    "lfm2": (["mamba+mlp", "attention+mlp", "mamba+mlp"], ["mamba", "mlp", "attention", "mlp", "mamba", "mlp"]),
    "nemotron_h": (["mamba", "attention", "moe"], ["mamba", "attention", "moe"]),  # one mixer per layer
}  # fmt: skip


pytestmark = pytest.mark.usefixtures("quiet_kernel_fallbacks")  # see tests/conftest.py


def logits(model, windows):
    with torch.no_grad():
        return model(input_ids=windows).logits


def test_every_family_is_known():
    for arch in (*HYBRID_ARCHS, *MOE_ARCHS):
        assert arch in ARCHITECTURES
    assert all(ARCHITECTURES[a].hybrid for a in HYBRID_ARCHS)


@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_block_kinds(arch):
    model = build_tiny_hybrid(arch, n_layers=3)
    layer, sub = find_blocks(model, "layer"), find_blocks(model, "sublayer")
    assert [b.kind for b in layer] == KINDS[arch][0]
    assert [b.kind for b in sub] == KINDS[arch][1]
    assert all(b.part == "layer" for b in layer)
    for b in sub:  # a half's parameters are inside its layer's
        assert 0 < b.n_params <= layer[b.layer].n_params
        if b.kind in ("attention", "mamba", "mlp", "moe") and b.part != "layer":
            assert b.name.endswith({"attention": "attn"}.get(b.kind, b.kind))
    # a keep list by kind: every block holding a Mamba mixer
    mamba = [i for i, b in enumerate(layer) if "mamba" in kind_parts(b.kind)]
    assert resolve_keep(["mamba"], layer) == mamba


def test_falcon_h1_mixer_half_holds_both_branches():
    model = build_tiny_hybrid("falcon_h1", n_layers=2)
    mixer = find_blocks(model, "sublayer")[0]
    layer = model.model.layers[0]
    assert mixer.modules == (layer.mamba, layer.self_attn)
    params = sum(p.numel() for m in (layer.mamba, layer.self_attn, layer.input_layernorm) for p in m.parameters())
    assert mixer.n_params == params


def test_removing_layers_renumbers_the_attention_layers():
    model = build_tiny_hybrid(n_layers=6)  # attention at 1, 3, 5; mamba at 0, 2, 4
    pruned = remove_blocks(model, [0, 3])
    assert pruned.config.num_hidden_layers == 4
    assert pruned.config.attn_layer_indices == [0, 3]  # old 1 -> 0, old 5 -> 3
    kinds = ["attention" if hasattr(layer, "self_attn") else "mamba" for layer in pruned.model.layers]
    assert kinds == ["attention", "mamba", "mamba", "attention"]
    for k, layer in enumerate(pruned.model.layers):
        mixer = layer.self_attn if hasattr(layer, "self_attn") else layer.mamba
        assert mixer.layer_idx == k


def _rebuilt_layout(pruned):
    """The (class, children) of each layer of the model the pruned config builds: what plain transformers makes."""
    import transformers as tf

    with torch.device("meta"):
        fresh = tf.AutoModelForCausalLM.from_config(pruned.config)
    return [layout(layer) for layer in fresh.model.layers]


def layout(layer):
    return type(layer).__name__, sorted((n, type(c).__name__) for n, c in layer.named_children())


@pytest.mark.parametrize(
    "arch, removed, fields",
    [
        ("jamba", [0], {"attn_layer_period": 2, "attn_layer_offset": 0, "expert_layer_period": 2}),
        ("qwen3_next", [0], {"decoder_sparse_step": 1, "mlp_only_layers": [1]}),  # experts at old 1, 3
        ("nemotron_h", [0], {"layers_block_type": ["full_attention", "moe", "mlp"], "num_hidden_layers": 3}),
        ("lfm2", [0], {"layer_types": ["full_attention", "conv", "full_attention"]}),
        ("granitemoehybrid", [2], {"layer_types": ["linear_attention", "full_attention", "full_attention"]}),
    ],
)
def test_removal_rewrites_the_family_config(arch, removed, fields):
    model = build_tiny_hybrid(arch, n_layers=4)
    pruned = remove_blocks(model, removed)
    for key, value in fields.items():
        assert getattr(pruned.config, key) == value, key
    assert len(pruned.model.layers) == 3 and not zeroed_sublayers(pruned)
    assert _rebuilt_layout(pruned) == [layout(layer) for layer in pruned.model.layers]


def test_jamba_zeroes_a_layer_its_periods_cannot_drop():
    model = build_tiny_hybrid("jamba", n_layers=5)  # mamba, attention, mamba, attention, mamba
    windows = random_token_windows(model, n=2, seq_len=10)
    pruned = remove_blocks(model, [2])  # the rest, m a a m, is no period pattern
    assert pruned.config.num_hidden_layers == 5 and zeroed_sublayers(pruned) == [(2, "attn"), (2, "mlp")]
    with torch.no_grad(), gate_blocks(model, "layer") as a:
        set_gates(a, removed=[2])
        want = logits(model, windows)
    assert float((logits(pruned, windows) - want).abs().max()) <= 1e-5
    both = remove_blocks(model, [0, 2])  # layer 0 goes (a m a m is periodic), then 2 cannot: zeroed
    assert both.config.num_hidden_layers == 4 and zeroed_sublayers(both) == [(1, "attn"), (1, "mlp")]


def test_the_last_attention_layer_is_zeroed_not_deleted():
    model = build_tiny_hybrid("bamba", n_layers=3)  # the one attention layer is layer 1
    pruned = remove_blocks(model, [1])
    assert pruned.config.num_hidden_layers == 3 and zeroed_sublayers(pruned) == [(1, "attn"), (1, "mlp")]
    windows = random_token_windows(model, n=1, seq_len=6)
    with torch.no_grad():  # runs with the hybrid cache (transformers needs one attention layer for its masks)
        cached = pruned.generate(windows, max_new_tokens=3, do_sample=False, use_cache=True)
        plain = pruned.generate(windows, max_new_tokens=3, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)


def test_sublayer_removal_of_a_single_branch_layer_deletes_it():
    model = build_tiny_hybrid("nemotron_h", n_layers=4)
    blocks = find_blocks(model, "sublayer")
    pruned = remove_sublayers(model, [blocks[2]])
    assert pruned.config.layers_block_type == ["linear_attention", "full_attention", "mlp"]


FAST = {("lfm2", "layer"), ("jamba", "sublayer"), ("nemotron_h", "sublayer")}  # the rest: slow, still run
CASES = [
    pytest.param(arch, g, marks=() if (arch, g) in FAST else pytest.mark.slow)
    for arch in HYBRID_ARCHS
    for g in ("layer", "sublayer")
]


@pytest.mark.parametrize("arch, granularity", CASES)
def test_hybrid_end_to_end(arch, granularity, tmp_path):
    import transformers as tf

    model = build_tiny_hybrid(arch, n_layers=3, vocab_size=259)
    caps = {"attention": 1, "mamba": 0}
    remove = 1 if granularity == "layer" else 2
    if arch == "falcon_h1" and granularity == "layer":  # every Falcon-H1 layer holds a Mamba mixer
        with pytest.raises(InfeasibleError, match="cannot be met"):
            prune_depth(model, CharTokenizer(), TEXT, remove=1, caps=caps, cache_dir=None, progress=False)
        caps = None
    report = prune_depth(
        model, CharTokenizer(), TEXT, remove=remove, granularity=granularity, caps=caps, solver="enumerate", top_k=3,
        validate=2, n_calibration=2, n_validation=2, seq_len=16, batch_size=2, cache_dir=None, progress=False,
    )  # fmt: skip
    blocks = find_blocks(model, granularity)
    kinds = [kind_parts(blocks[i].kind) for i in report.chosen_blocks]
    assert len(kinds) == remove and report.pruned_metrics["kl"] >= 0
    if caps:
        assert not any("mamba" in k for k in kinds) and sum("attention" in k for k in kinds) <= 1
    pruned = report.pruned_model
    # the measured validation loss of the chosen set (prefix-tree replay) is that of the pruned model itself
    splits = token_splits(
        None, CharTokenizer(), TEXT, model=model, seq_len=16, n_calibration=2, n_validation=2, n_test=0, seed=0
    )
    direct = evaluate(pruned, splits.validation, batch_size=2)
    assert report.pruned_metrics["ppl"] == pytest.approx(direct["ppl"], rel=1e-4)
    folder = save_pruned(pruned, tmp_path / "m")
    with transformers_warnings() as said:
        plain = tf.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert not [m for m in said if "LOAD REPORT" in m or "initialized" in m], said  # a silent plain load
    reloaded = load_pruned(folder)
    windows = random_token_windows(259, n=2, seq_len=10)
    want = logits(pruned, windows)
    assert float((logits(plain, windows) - logits(reloaded, windows)).abs().max()) <= 1e-5
    assert float((logits(plain, windows) - want).abs().max()) <= 1e-5
    prompt = windows[:1, :5]
    with torch.no_grad():
        expected = pruned.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=False)
        for m in (plain, reloaded, pruned):
            assert torch.equal(m.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=True), expected)
