"""A width-pruned folder loads and generates where cbo cannot be imported (its remote-code file is self-contained)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tiny_models import build_tiny_model, random_token_windows

from cbo.model.structures import layer_widths
from cbo.surgery.depth import remove_blocks, remove_sublayers
from cbo.surgery.io import LAYOUT_KEY, REMOTE_FILE, load_pruned, save_pruned
from cbo.surgery.width import WidthPlan, prune_width

# Runs in a fresh interpreter: isolated mode (no PYTHONPATH, no current folder, no user site), and without the
# editable-install finder of the venv, so that only the installed third-party packages can be imported.
CHILD = textwrap.dedent(
    """
    import importlib.util, sys
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
    # the repository's folders go (the venv's site-packages may live inside the repository: it stays)
    sys.path[:] = [
        p for p in sys.path
        if "__editable__" not in p and ("site-packages" in p or not p.startswith({repos!r}))
    ]
    for name in [m for m in sys.modules if m == "cbo" or m.startswith("cbo.")]:
        del sys.modules[name]
    try:
        import cbo  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("cbo is importable in the child: the test would prove nothing")
    import torch, transformers
    folder, windows_file, out_file = sys.argv[1:4]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    windows = torch.load(windows_file)
    with torch.no_grad():
        logits = model(input_ids=windows).logits
        tokens = model.generate(windows[:1, :6], max_new_tokens=8, do_sample=False, use_cache=True)
    assert "cbo" not in sys.modules
    torch.save({{"logits": logits, "tokens": tokens, "module": type(model).__module__}}, out_file)
    """
)


def _plan(model) -> WidthPlan:
    cfg = model.config
    n = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    nkv = getattr(cfg, "num_key_value_heads", None) or n
    g = n // nkv
    inter = layer_widths(model)[0]["intermediate"]
    plan = WidthPlan()
    for i in range(len(layer_widths(model))):
        if i % 2 == 0:
            kv = list(range(nkv - 1)) if nkv > 1 else [0]
            plan.attention[i] = ([k * g + j for k in kv for j in range(g)] if nkv > 1 else list(range(n - 1)), kv)
        plan.mlp[i] = list(range(0, inter - 8 * (i + 1)))
    return plan


def _run_child(folder, windows, tmp_path):
    repos = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    import cbo

    repos.append(os.path.dirname(os.path.dirname(os.path.abspath(cbo.__file__))))
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(repos=tuple(sorted(set(repos)))))
    torch.save(windows, tmp_path / "windows.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-I", str(script), str(folder), str(tmp_path / "windows.pt"), str(tmp_path / "out.pt")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(tmp_path / "out.pt")


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_width_pruned_folder_loads_and_generates_without_cbo(arch, tmp_path):
    model = build_tiny_model(arch, n_layers=4)
    pruned = prune_width(remove_blocks(model, [1]), _plan(remove_blocks(model, [1])))
    if arch != "gpt2":
        pruned = remove_sublayers(pruned, [(2, "mlp")])
    folder = save_pruned(pruned, tmp_path / "m")
    source = (folder / REMOTE_FILE).read_text()
    assert "cbo" not in source.replace("CBO", "").replace("cbo_remote_layout", "")
    config = json.loads((folder / "config.json").read_text())
    assert config[LAYOUT_KEY]["shapes"] and "auto_map" in config
    windows = random_token_windows(model, n=2, seq_len=10)
    got = _run_child(folder, windows, tmp_path)
    with torch.no_grad():
        want = pruned(input_ids=windows).logits
        tokens = pruned.generate(windows[:1, :6], max_new_tokens=8, do_sample=False, use_cache=True)
    assert torch.equal(got["logits"], want)
    assert torch.equal(got["tokens"], tokens)
    # the generation used the KV cache: the same tokens as greedy decoding without it
    with torch.no_grad():
        plain = pruned.generate(windows[:1, :6], max_new_tokens=8, do_sample=False, use_cache=False)
    assert torch.equal(tokens, plain)
    assert torch.equal(load_pruned(folder)(input_ids=windows).logits, want)


def test_remote_layout_records_only_what_changed(tmp_path):
    from cbo.surgery.io import remote_layout

    model = build_tiny_model("llama", n_layers=3)
    assert remote_layout(model) == {"swaps": {}, "shapes": {}, "attrs": {}}
    plan = WidthPlan(mlp={1: list(range(40))})
    layout = remote_layout(prune_width(model, plan))
    assert layout["swaps"] == {}
    assert set(layout["shapes"]) == {f"model.layers.1.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert layout["shapes"]["model.layers.1.mlp.down_proj.weight"] == [32, 40]
    assert layout["attrs"]["model.layers.1.mlp"] == {"intermediate_size": 40}
