"""Saving and loading pruned models: per-layer widths, removed layers and zeroed sublayers reload exactly."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import build_tiny_model, random_token_windows, transformers_warnings

from cbo.errors import CorruptFileError
from cbo.model.structures import layer_widths
from cbo.surgery.depth import remove_blocks, remove_sublayers
from cbo.surgery.io import REMOTE_FILE, WIDTHS_KEY, load_pruned, save_pruned
from cbo.surgery.width import WidthPlan, prune_width


def _width_plan(model) -> WidthPlan:
    cfg = model.config
    n = cfg.num_attention_heads
    nkv = getattr(cfg, "num_key_value_heads", n)
    g = n // nkv
    inter = layer_widths(model)[0]["intermediate"]
    plan = WidthPlan()
    for i in range(cfg.num_hidden_layers):
        if i % 2 == 0:  # drop the last KV group
            kv = list(range(nkv - 1)) if nkv > 1 else [0]
            plan.attention[i] = ([k * g + j for k in kv for j in range(g)], kv)
        plan.mlp[i] = list(range(0, inter - 8 * (i + 1)))
    return plan


def _logits(model, windows):
    with torch.no_grad():
        return model(input_ids=windows).logits


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "gpt2", "gpt_neox"])
@pytest.mark.parametrize("order", ["depth_then_width", "width_then_depth"])
def test_save_load_identical(arch, order, tmp_path):
    model = build_tiny_model(arch, n_layers=4)
    windows = random_token_windows(model, n=2, seq_len=10)
    if order == "depth_then_width":
        pruned = remove_blocks(model, [1])
        pruned = prune_width(pruned, _width_plan(pruned))
    else:
        pruned = prune_width(model, _width_plan(model))
        pruned = remove_blocks(pruned, [1])
    pruned = remove_sublayers(pruned, [(2, "mlp")])
    folder = save_pruned(pruned, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    assert config[WIDTHS_KEY] == layer_widths(pruned)
    assert config["cbo_removed_layers"] == [1]
    assert config[WIDTHS_KEY][2]["intermediate"] == 0  # the zeroed MLP
    loaded = load_pruned(folder)
    assert layer_widths(loaded) == layer_widths(pruned)
    assert torch.equal(_logits(loaded, windows), _logits(pruned, windows))
    # the plain-transformers route (remote code that imports cbo)
    import transformers as tf

    plain = tf.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert torch.equal(_logits(plain, windows), _logits(pruned, windows))


def test_uniform_widths_need_no_remote_code(tmp_path):
    import transformers as tf

    model = build_tiny_model("llama", n_layers=3)
    pruned = remove_blocks(model, [0])
    folder = save_pruned(pruned, tmp_path / "m")
    assert not (folder / REMOTE_FILE).exists()
    assert "auto_map" not in json.loads((folder / "config.json").read_text())
    windows = random_token_windows(model, n=1, seq_len=8)
    plain = tf.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert torch.equal(_logits(plain, windows), _logits(pruned, windows))
    assert torch.equal(_logits(load_pruned(folder), windows), _logits(pruned, windows))


def test_resave_of_a_loaded_model(tmp_path):
    model = build_tiny_model("llama", n_layers=2)
    pruned = prune_width(model, _width_plan(model))
    first = load_pruned(save_pruned(pruned, tmp_path / "a"))
    second = load_pruned(save_pruned(first, tmp_path / "b"))
    windows = random_token_windows(model, n=1, seq_len=8)
    assert torch.equal(_logits(second, windows), _logits(pruned, windows))


def test_generation_after_reload(tmp_path):
    model = build_tiny_model("llama", n_layers=3)
    pruned = prune_width(remove_blocks(model, [2]), WidthPlan(attention={0: ([2, 3], [1])}, mlp={1: list(range(24))}))
    loaded = load_pruned(save_pruned(pruned, tmp_path / "m"))
    prompt = random_token_windows(model, n=1, seq_len=5)
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(loaded.generate(prompt, **kw), pruned.generate(prompt, **kw))


def test_bad_folders(tmp_path):
    with pytest.raises(CorruptFileError, match="no config.json"):
        load_pruned(tmp_path)
    model = build_tiny_model("llama", n_layers=2)
    folder = save_pruned(prune_width(model, _width_plan(model)), tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config[WIDTHS_KEY][1]["intermediate"] = 16  # hand-edited: weights no longer fit
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CorruptFileError, match="do not match"):
        load_pruned(folder)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_one_save_route_and_one_load_route_for_depth_sublayer_and_width(arch, tmp_path):
    """Layers removed, halves zeroed, widths sliced: save_pruned writes each, load_pruned rebuilds each exactly."""
    model = build_tiny_model(arch, n_layers=4)
    windows = random_token_windows(model, n=2, seq_len=10)
    cases = {
        "depth": remove_blocks(model, [2]),
        "sublayer": remove_sublayers(model, [(0, "attn"), (3, "mlp")]),
        "width": prune_width(model, _width_plan(model)),
    }
    for name, pruned in cases.items():
        loaded = load_pruned(save_pruned(pruned, tmp_path / name))
        assert not loaded.training
        assert torch.equal(_logits(loaded, windows), _logits(pruned, windows)), name


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "gpt2", "gpt_neox", "olmo2"])
def test_sublayer_folder_loads_with_plain_transformers(arch, tmp_path):
    """A folder with zeroed halves gives the load_pruned logits through plain from_pretrained too."""
    import transformers as tf

    model = build_tiny_model(arch, n_layers=4)
    windows = random_token_windows(model, n=2, seq_len=10)
    pruned = remove_sublayers(remove_blocks(model, [1]), [(0, "attn"), (2, "mlp"), (1, "attn")])
    folder = save_pruned(pruned, tmp_path / "m")
    reference = _logits(load_pruned(folder), windows)
    assert torch.equal(reference, _logits(pruned, windows))
    plain = tf.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert torch.equal(_logits(plain, windows), reference)
    # and the half really is computed by the standard modules (not silently replaced): its input weights exist
    assert not any(type(m).__name__.startswith("Zero") for m in plain.modules())
    prompt = random_token_windows(model, n=1, seq_len=5)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(plain.generate(prompt, **kw), load_pruned(folder).generate(prompt, **kw))


def _folder_bytes(folder):
    return sum(p.stat().st_size for p in folder.rglob("*.safetensors"))


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_plain_load_of_a_sublayer_folder_is_silent(arch, tmp_path):
    """Every weight the config asks for is in the folder (zeros for the removed halves): no LOAD REPORT of missing
    weights; saving only the output projections is smaller and warns. The disk cost: the halves' full size."""
    import transformers as tf

    model = build_tiny_model(arch, n_layers=4, **({"tie_word_embeddings": True} if arch == "llama" else {}))
    windows = random_token_windows(model, n=2, seq_len=10)
    pruned = remove_sublayers(model, [(0, "attn"), (2, "mlp"), (3, "attn")])
    full, small = (
        save_pruned(pruned, tmp_path / "all"),
        save_pruned(pruned, tmp_path / "outputs", plain_weights="outputs"),
    )
    with transformers_warnings() as said:
        plain = tf.AutoModelForCausalLM.from_pretrained(full).eval()
    assert not [m for m in said if "LOAD REPORT" in m or "MISSING" in m or "initialized" in m], said
    assert torch.equal(_logits(plain, windows), _logits(pruned, windows))
    with transformers_warnings() as said:
        warned = tf.AutoModelForCausalLM.from_pretrained(small).eval()
    assert any("LOAD REPORT" in m for m in said)  # the check above can fail
    assert torch.equal(_logits(warned, windows), _logits(pruned, windows))
    model.save_pretrained(tmp_path / "original")
    assert _folder_bytes(full) == pytest.approx(_folder_bytes(tmp_path / "original"), rel=0.02)
    assert _folder_bytes(small) < _folder_bytes(full)


def test_save_keeps_foreign_files_and_replaces_only_its_own(tmp_path):
    """Saving into a folder keeps files CBO did not write; a later save removes only CBO's own stale files."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"not cbo's")
    model = build_tiny_model("llama", n_layers=2)
    save_pruned(remove_blocks(model, [0]), folder)
    assert (folder / "notes.txt").read_text() == "mine"
    assert (folder / "model-00001-of-00002.safetensors").read_bytes() == b"not cbo's"
    assert (folder / "model.safetensors").is_file()
    # a second save that writes fewer files removes the one it wrote before (and nothing else)
    (folder / "extra-by-cbo.txt").write_text("x")
    record = json.loads((folder / ".cbo-written.json").read_text())
    record["files"].append("extra-by-cbo.txt")
    (folder / ".cbo-written.json").write_text(json.dumps(record))
    save_pruned(remove_blocks(model, [1]), folder)
    assert not (folder / "extra-by-cbo.txt").exists()
    assert (folder / "notes.txt").exists() and (folder / "model-00001-of-00002.safetensors").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".staging")]
