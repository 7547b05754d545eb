"""Each width score equals its definition computed by hand (explicit slicing, own autograd calls)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from tiny_models import build_tiny_model, random_token_windows

from cbo.errors import DataError, InvalidOptionError, UnknownNameError
from cbo.width.scores import names, score_units

D, G = 8, 2  # tiny Llama: head_dim 8, 4 query heads in 2 KV groups, MLP width 64


def _llama_entries(model, layer: int, kind: str, unit: int, tensors: dict) -> list[torch.Tensor]:
    """Per-matrix 1-D entries of one unit, sliced by hand from tensors shaped like the weights."""
    p = f"model.layers.{layer}."
    if kind == "mlp":
        return [
            tensors[p + "mlp.gate_proj.weight"][unit],
            tensors[p + "mlp.up_proj.weight"][unit],
            tensors[p + "mlp.down_proj.weight"][:, unit],
        ]
    q = slice(unit * G * D, (unit + 1) * G * D)
    kv = slice(unit * D, (unit + 1) * D)
    return [
        tensors[p + "self_attn.q_proj.weight"][q].reshape(-1),
        tensors[p + "self_attn.k_proj.weight"][kv].reshape(-1),
        tensors[p + "self_attn.v_proj.weight"][kv].reshape(-1),
        tensors[p + "self_attn.o_proj.weight"][:, q].T.reshape(-1),
    ]


def _weights(model) -> dict:
    return {n: p.detach() for n, p in model.named_parameters()}


def _mean_grads(model, windows, objective, batch_size: int) -> dict:
    params = dict(model.named_parameters())
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    batches = [windows[i : i + batch_size] for i in range(0, len(windows), batch_size)]
    for b in batches:
        value = objective(model(input_ids=b).logits, b)
        grads = torch.autograd.grad(value, list(params.values()), allow_unused=True)
        for (n, _), gr in zip(params.items(), grads):
            if gr is not None:
                total[n] += gr
    return {n: t / len(batches) for n, t in total.items()}


def _ce(logits, b):
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))


UNITS = [(0, "mlp", 0), (0, "mlp", 37), (1, "mlp", 63), (0, "attention", 0), (1, "attention", 1)]


@pytest.fixture(scope="module")
def llama():
    model = build_tiny_model("llama", n_layers=2)
    return model, random_token_windows(model, n=4, seq_len=12)


def test_registry_lists_the_builtins():
    assert {"magnitude", "taylor", "afr", "ntk", "amp"} <= set(names())
    with pytest.raises(UnknownNameError, match="unknown width score 'wanda'"):
        score_units(build_tiny_model("llama", n_layers=1), None, "wanda")


def test_no_score_is_named_after_an_option_value():
    """A score's names never spell an option value: "l1" named magnitude while norm="l2" computed the L2 norm."""
    from cbo.width.scores.base import SCORES

    for name, cls in SCORES.items():
        values = {v for v in dataclasses.asdict(cls.Options()).values() if isinstance(v, str)}
        values |= {"l1", "l2"}
        assert not {name, *cls.aliases} & values, name
    with pytest.raises(UnknownNameError):
        score_units(build_tiny_model("llama", n_layers=1), None, "l1", norm="l2")


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_magnitude(llama, norm):
    model, _ = llama
    s = score_units(model, None, "magnitude", norm=norm)
    w = _weights(model)
    for layer, kind, u in UNITS:
        e = torch.cat(_llama_entries(model, layer, kind, u, w))
        expected = e.abs().sum() if norm == "l1" else e.pow(2).sum().sqrt()
        assert s.values[(layer, kind)][u].item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("variant", ["absolute", "signed"])
def test_taylor(llama, variant):
    model, windows = llama
    s = score_units(model, windows, "taylor", variant=variant, batch_size=2)
    g = _mean_grads(model, windows, _ce, 2)
    w = _weights(model)
    prod = {n: w[n] * g[n] for n in w}
    for layer, kind, u in UNITS:
        e = torch.cat(_llama_entries(model, layer, kind, u, prod))
        expected = e.abs().sum() if variant == "absolute" else -e.sum()
        assert s.values[(layer, kind)][u].item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("output", ["seqmax", "vocabmax", "loss"])
def test_ntk(llama, output):
    model, windows = llama

    def f(logits, b):
        if output == "seqmax":  # the reference code: max over the sequence, mean over batch and vocabulary
            return logits.max(dim=1).values.mean()
        if output == "vocabmax":
            return logits.max(dim=-1).values.mean()
        return _ce(logits, b)

    s = score_units(model, windows, "ntk", output=output, batch_size=2)
    g = _mean_grads(model, windows, f, 2)
    w = _weights(model)
    sal = {n: (w[n] * g[n]).abs() for n in w}
    for layer, kind, u in UNITS:
        expected = torch.cat(_llama_entries(model, layer, kind, u, sal)).sum()
        assert s.values[(layer, kind)][u].item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-7)


def _input_norms(model, windows, names) -> dict:
    """``‖x‖₂`` of every input feature of the modules owning ``names`` (own hooks, one pass per window batch)."""
    sq, handles = {}, []
    for n in names:
        mod = model.get_submodule(n.rsplit(".", 1)[0])
        handles.append(
            mod.register_forward_pre_hook(
                lambda m, a, n=n: sq.__setitem__(
                    n, sq.get(n, 0) + a[0].detach().reshape(-1, a[0].shape[-1]).pow(2).sum(0)
                )
            )
        )
    with torch.no_grad():
        for i in range(0, len(windows), 2):
            model(input_ids=windows[i : i + 2])
    for h in handles:
        h.remove()
    return {n: v.sqrt() for n, v in sq.items()}


def _zscore(x):
    return (x - x.mean()) / x.std(ddof=1)


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"power": False},
        {"clip": False},
        {"aggregation": "signed"},
        {"aggregation": "absolute"},
        {"standardize": "scale"},
        {"companion": "none", "p": 0.5},
        {"p": 0.3, "clip_percentiles": (5.0, 90.0), "clip_scope": "matrix"},
        {
            "companion": "none",
            "p": 0.5,
            "standardize": "none",
            "clip_scope": "matrix",
            "clip_percentiles": (1.0, 99.0),
            "aggregation": "signed",
        },
    ],
)
def test_afr(llama, opts):
    """score_units("afr") against the recipe computed here in numpy (float64), option by option."""
    model, windows = llama
    lo, hi = opts.get("clip_percentiles", (2.0, 98.0))
    s = score_units(model, windows, "afr", batch_size=2, **opts)
    g = _mean_grads(model, windows, _ce, 2)
    w = {n: t for n, t in _weights(model).items() if n.startswith("model.layers.") and "norm" not in n}
    norms = _input_norms(model, windows, w)
    how = opts.get("standardize", "zscore")
    combined = {}
    for n in w:
        grad = (-w[n] * g[n]).double().numpy()
        act = (w[n].abs() * norms[n][None, :]).double().numpy()
        if opts.get("power", True):
            p = opts.get("p", "match")
            if p == "match":
                p = np.log(act[act > 0]).std(ddof=1) / np.log(np.abs(grad[grad != 0])).std(ddof=1)
                assert s.info["p"][n[len("model.layers.") :]] == pytest.approx(p, rel=1e-4)
            grad = np.sign(grad) * np.abs(grad) ** p
        parts = [grad] + ([act] if opts.get("companion", "wanda") == "wanda" else [])
        if how == "zscore":
            parts = [_zscore(x) for x in parts]
        elif how == "scale":
            parts = [x / x.std(ddof=1) for x in parts]
        x = sum(parts)
        if opts.get("clip", True) and opts.get("clip_scope") == "matrix":
            x = np.clip(x, np.percentile(x, lo), np.percentile(x, hi))
        combined[n] = torch.from_numpy(x)
    for layer, kind, u in UNITS:
        e = torch.cat(_llama_entries(model, layer, kind, u, combined)).numpy()
        if opts.get("clip", True) and opts.get("clip_scope", "structure") == "structure":
            e = np.clip(e, np.percentile(e, lo), np.percentile(e, hi))
        aggregation = opts.get("aggregation", "published")
        expected = {"published": abs(e.mean()), "signed": e.mean(), "absolute": np.abs(e).mean()}[aggregation]
        assert s.values[(layer, kind)][u].item() == pytest.approx(expected, rel=1e-3, abs=1e-6)


@pytest.mark.parametrize("head_norm", ["l2", "l1"])
def test_amp(llama, head_norm):
    model, windows = llama
    s = score_units(model, windows, "amp", head_norm=head_norm, batch_size=3)
    seen: dict[str, list] = {}
    handles = []
    for i, layer in enumerate(model.model.layers):
        for name, mod in (("o", layer.self_attn.o_proj), ("down", layer.mlp.down_proj)):
            handles.append(
                mod.register_forward_hook(lambda m, a, o, k=f"{i}.{name}": seen.setdefault(k, []).append(a[0]))
            )
    with torch.no_grad():
        model(input_ids=windows)
    for h in handles:
        h.remove()
    for layer, kind, u in UNITS:
        if kind == "mlp":
            a = torch.cat(seen[f"{layer}.down"]).reshape(-1, 64)
            expected = a[:, u].abs().mean()
        else:
            o = torch.cat(seen[f"{layer}.o"]).reshape(-1, 4, D)
            per_head = o.norm(dim=-1) if head_norm == "l2" else o.abs().mean(-1)
            expected = per_head[:, u * G : (u + 1) * G].mean(0).sum()
        assert s.values[(layer, kind)][u].item() == pytest.approx(expected.item(), rel=1e-5)


def test_query_mode_units(llama):
    model, windows = llama
    group = score_units(model, windows, "amp", gqa="group")
    query = score_units(model, windows, "amp", gqa="query")
    assert query.values[(0, "attention")].shape == (4,)
    torch.testing.assert_close(group.values[(0, "attention")], query.values[(0, "attention")].reshape(2, 2).sum(1))


def test_gpt2_transposed_layout_by_hand():
    model = build_tiny_model("gpt2", n_layers=1)  # 4 heads of 8, MLP width 128, Conv1D weights (in, out)
    s = score_units(model, None, "magnitude")
    blk = model.transformer.h[0]
    h, H = 2, 32
    c_attn, c_proj = blk.attn.c_attn.weight, blk.attn.c_proj.weight
    cols = [slice(off + h * D, off + (h + 1) * D) for off in (0, H, 2 * H)]
    expected = sum(c_attn[:, c].abs().sum() for c in cols) + c_proj[h * D : (h + 1) * D].abs().sum()
    assert s.values[(0, "attention")][h].item() == pytest.approx(expected.item(), rel=1e-5)
    u = 77
    expected = blk.mlp.c_fc.weight[:, u].abs().sum() + blk.mlp.c_proj.weight[u].abs().sum()
    assert s.values[(0, "mlp")][u].item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("score", ["taylor", "ntk", "amp", "afr"])
def test_hooks_and_gradient_switches_are_undone_even_on_error(score):
    model = build_tiny_model("llama", n_layers=2)
    model.model.embed_tokens.weight.requires_grad_(False)  # a user setting that must survive
    bad = torch.full((2, 6), 10_000)  # token ids beyond the vocabulary: the forward pass fails
    with pytest.raises((IndexError, RuntimeError)):
        score_units(model, bad, score)
    for m in model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    assert flags.pop("model.embed_tokens.weight") is False
    assert all(flags.values())
    assert all(p.grad is None for p in model.parameters())
    windows = random_token_windows(model, n=2, seq_len=6)
    score_units(model, windows, score)  # and it still works afterwards
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_bad_inputs(llama):
    model, windows = llama
    with pytest.raises(DataError, match="needs calibration token windows"):
        score_units(model, None, "ntk")
    with pytest.raises(InvalidOptionError, match="no option"):
        score_units(model, windows, "ntk", p=2)
    with pytest.raises(InvalidOptionError, match="NTK output"):
        score_units(model, windows, "ntk", output="mean")
    with pytest.raises(InvalidOptionError, match="clip percentiles"):
        score_units(model, windows, "afr", clip_percentiles=(99.0, 1.0))


def test_variants_share_the_calibration_passes(llama):
    from cbo.width.scores import score_variants

    model, windows = llama
    variants = [{}, {"power": False}, {"clip": False}, {"aggregation": "signed"}, {"companion": "none", "p": 0.5}]
    together = score_variants(model, windows, "afr", variants, batch_size=2)
    for v, got in zip(variants, together):
        alone = score_units(model, windows, "afr", batch_size=2, **v)
        for key in alone.values:
            torch.testing.assert_close(got.values[key], alone.values[key])
        assert got.options == alone.options
    with pytest.raises(InvalidOptionError, match="change the calibration passes"):
        score_variants(model, windows, "ntk", [{}, {"output": "loss"}])
