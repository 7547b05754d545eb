"""Depth surgery: delete decoder layers, or replace the attention / MLP half of a layer by zeros.

The result is an ordinary Hugging Face model: ``save_pretrained`` writes a config that says what it is (the
layer count, the per-layer lists such as ``layer_types``, and which original layers were removed), plain
``AutoModelForCausalLM.from_pretrained`` rebuilds it with identical outputs, and generation with the KV cache
works because the remaining attention modules are renumbered.

Example:
    >>> pruned = remove_blocks(model, [3, 7, 12])          # doctest: +SKIP
    >>> pruned.save_pretrained("pruned/")                  # doctest: +SKIP
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from cbo.checks import is_int
from cbo.errors import ModelError
from cbo.extras import require
from cbo.model.blocks import Block, decoder_layers, layer_parts
from cbo.model.families import ARCHITECTURES, INDEX_LISTS, NOT_PER_LAYER, can_delete_layers, module_kind

torch = require("torch", "model surgery")
nn = torch.nn

ZEROED_KEY = "cbo_zeroed_sublayers"  # [[layer, "attn" | "mlp"], ...] in current layer numbering
ORIGINAL_KEY = "cbo_original_layers"  # original index of each current layer
REMOVED_KEY = "cbo_removed_layers"  # original indices of the removed layers
PART_ALIASES = {
    "attn": "attn", "attention": "attn", "self_attn": "attn", "mixer": "attn", "mamba": "attn",
    "mlp": "mlp", "ffn": "mlp", "moe": "mlp",
}  # fmt: skip


def text_config(model: Any) -> Any:
    """The config that holds the decoder's layer count (the text config of multimodal models)."""
    return text_config_of(model.config)


def text_config_of(config: Any) -> Any:
    """The text (decoder) part of a config: itself, or ``get_text_config`` of a multimodal one."""
    if hasattr(config, "get_text_config"):
        try:
            return config.get_text_config(decoder=True)
        except TypeError:
            return config.get_text_config()
    return config


def _layer_indices(blocks: Iterable[Any], n_layers: int) -> list[int]:
    out = []
    for b in blocks:
        if isinstance(b, Block):
            if b.part != "layer":
                raise ModelError(f"block {b.name!r} is a {b.kind} half; use remove_sublayers for sublayer blocks")
            b = b.layer
        if not is_int(b):
            raise ModelError(f"layer index {b!r} is not an integer")
        i = int(b)
        if not 0 <= i < n_layers:
            raise ModelError(f"layer index {i} is out of range; the model has layers 0..{n_layers - 1}")
        out.append(i)
    return sorted(set(out))


def _renumber(layers: Any) -> None:
    """Set every ``layer_idx`` inside layer k to k (the KV cache is indexed by it)."""
    for k, layer in enumerate(layers):
        for module in layer.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = k


def _update_config(config: Any, n_old: int, keep: list[int], removed: list[int]) -> None:
    new_index = {old: new for new, old in enumerate(keep)}
    spec = ARCHITECTURES.get(getattr(config, "model_type", "") or "")
    handled = set(NOT_PER_LAYER)
    if spec is not None and spec.rewrite is not None:
        written = spec.rewrite(config, keep)
        if written is None:
            raise ModelError(f"the {spec.name or config.model_type} config cannot describe the layers {keep} alone")
        handled |= set(written)
    original = list(getattr(config, ORIGINAL_KEY, None) or range(n_old))
    if len(original) != n_old:
        original = list(range(n_old))
    setattr(
        config, REMOVED_KEY, sorted(list(getattr(config, REMOVED_KEY, None) or []) + [original[i] for i in removed])
    )
    setattr(config, ORIGINAL_KEY, [original[i] for i in keep])
    zeroed = getattr(config, ZEROED_KEY, None)
    if zeroed:
        setattr(config, ZEROED_KEY, [[new_index[int(l)], p] for l, p in zeroed if int(l) in new_index])
    for name, value in list(vars(config).items()):
        if name in (ORIGINAL_KEY, REMOVED_KEY, ZEROED_KEY) or name in handled or not isinstance(value, (list, tuple)):
            continue
        if name in INDEX_LISTS:
            setattr(config, name, type(value)(new_index[int(i)] for i in value if int(i) in new_index))
        elif "layer" in name and len(value) == n_old:
            setattr(config, name, type(value)(value[i] for i in keep))
    config.num_hidden_layers = len(keep)


def deletable_layers(config: Any, n_layers: int, removed: list[int]) -> list[int]:
    """The layers of ``removed`` that can be deleted so that the family's config still describes a model that runs
    (:func:`cbo.model.families.can_delete_layers`: all of them, but for Jamba's periodic patterns and a hybrid stack's
    last attention layer), chosen greedily in order."""
    deleted: list[int] = []
    for i in removed:
        trial = set(deleted) | {i}
        if can_delete_layers(config, [k for k in range(n_layers) if k not in trial]):
            deleted.append(i)
    return deleted


def remove_blocks(model: Any, blocks: Iterable[Any], *, inplace: bool = False) -> Any:
    """Delete decoder layers.

    Deletes from the end first, renumbers ``layer_idx`` of the remaining attention modules, updates
    ``num_hidden_layers`` and per-layer config lists (``layer_types`` and the like; a family's own fields through
    :data:`cbo.model.families.ARCHITECTURES`), and records the original indices of the removed layers in
    ``config.cbo_removed_layers``. A layer whose deletion the family's config cannot describe (Jamba states its
    layer pattern as periods only) or that is a hybrid stack's last attention layer (transformers' hybrid caches
    need one) has both of its halves zeroed instead (:func:`remove_sublayers`): the same outputs, one layer more.

    Args:
        model: a Hugging Face causal LM (see :func:`cbo.model.blocks.find_blocks`).
        blocks: layer indices (or layer :class:`~cbo.model.blocks.Block` objects) to delete.
        inplace: modify ``model`` itself instead of a deep copy.

    Returns:
        The pruned model (``model`` itself when ``inplace``).

    Example:
        >>> pruned = remove_blocks(model, [28, 29])      # doctest: +SKIP
    """
    layers, path = decoder_layers(model)
    n_old = len(layers)
    removed = _layer_indices(blocks, n_old)
    if len(removed) >= n_old:
        raise ModelError(f"cannot remove all {n_old} layers; at least one must remain")
    config = text_config(model)
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        raise ModelError(
            "this GPT-2 model scales attention by 1/(layer_idx+1); renumbered layers would change their scaling"
        )
    if not removed:
        return model if inplace else copy.deepcopy(model)
    if not inplace:
        model = copy.deepcopy(model)
        layers, _ = decoder_layers(model)
        config = text_config(model)
    deleted = deletable_layers(config, n_old, removed)
    if len(deleted) < len(removed):  # the config cannot describe the rest without these: zero them instead
        zeroed = [i for i in removed if i not in deleted]
        remove_sublayers(model, [(i, p) for i in zeroed for p in ("attn", "mlp")], inplace=True, delete=False)
        removed = deleted
        if not removed:
            return model
    for i in sorted(removed, reverse=True):
        del layers[i]
    _renumber(layers)
    keep = [i for i in range(n_old) if i not in set(removed)]
    _update_config(config, n_old, keep, removed)
    if config is not model.config and hasattr(model.config, "num_hidden_layers"):
        if getattr(model.config, "num_hidden_layers", None) == n_old:
            model.config.num_hidden_layers = len(keep)
    return model


# ---------------------------------------------------------------------------------------- sublayers


def _find_cache(kwargs: dict) -> Any:
    for key in ("cache", "past_key_values", "past_key_value", "layer_past"):
        cache = kwargs.get(key)
        if cache is not None:
            return getattr(cache, "self_attention_cache", cache)
    return None


class ZeroAttention(nn.Module):
    """Stands in for a removed attention module: returns zeros and keeps the KV cache's length in step.

    The cache still receives one tiny entry per token so that the sequence length the model reads from the
    cache (``get_seq_length``, position ids, masks) stays right even when layer 0's attention is removed.
    """

    def __init__(self, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx

    def forward(self, hidden_states: Any = None, *args: Any, **kwargs: Any) -> tuple[Any, None]:
        if hidden_states is None:
            hidden_states = args[0]
        cache = _find_cache(kwargs)
        if cache is not None and hasattr(cache, "update"):
            b, t = hidden_states.shape[0], hidden_states.shape[1]
            stub = hidden_states.new_zeros((b, 1, t, 1))
            cache.update(stub, stub, self.layer_idx)
        return torch.zeros_like(hidden_states), None

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}"


class ZeroMLP(nn.Module):
    """Stands in for a removed MLP, mixture of experts or Mamba-style mixer: returns zeros of the input's shape.

    ``kind`` is the kind of what it replaced (``cbo.model.families.module_kind`` reads it), so that the blocks of a pruned
    model keep their kinds.
    """

    def __init__(self, kind: str = "mlp"):
        super().__init__()
        self.stand_in_kind = kind

    def forward(self, hidden_states: Any = None, *args: Any, **kwargs: Any) -> Any:
        if hidden_states is None:
            hidden_states = args[0]
        return torch.zeros_like(hidden_states)

    def extra_repr(self) -> str:
        return f"kind={self.stand_in_kind}"


def _zero_half(model: Any, layer: Any, index: int, part: str) -> None:
    parts = layer_parts(layer, model)
    for name, module in zip(parts[f"{part}_names"], parts[f"{part}_modules"]):
        if isinstance(module, (ZeroAttention, ZeroMLP)):
            continue
        kind = module_kind(module, "attention" if part == "attn" else "mlp")
        # an attention module keeps the KV cache's length in step; any other branch returns a tensor of zeros
        setattr(layer, name, ZeroAttention(index) if kind == "attention" else ZeroMLP(kind))
    for norm in parts[f"{part}_norms"]:  # norms that only served this half carry no signal any more
        setattr(layer, norm, nn.Identity())


def _parse_parts(parts: Iterable[Any]) -> list[tuple[int, str]]:
    out = []
    for item in parts:
        if isinstance(item, Block):
            if item.part == "layer":
                out += [(item.layer, "attn"), (item.layer, "mlp")]
                continue
            item = (item.layer, item.part)
        if isinstance(item, str) and item.count(".") == 2:  # "layers.3.attn"
            _, layer, part = item.split(".")
            item = (int(layer), part)
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ModelError(f"sublayer {item!r} must be (layer, 'attn' | 'mlp'), 'layers.L.attn' or a Block")
        layer, part = item
        if part not in PART_ALIASES:
            raise ModelError(f"unknown sublayer part {part!r}; use one of {sorted(PART_ALIASES)}")
        out.append((int(layer), PART_ALIASES[part]))
    return out


def zeroed_sublayers(model: Any) -> list[tuple[int, str]]:
    """The (layer, part) halves replaced by zeros, from the model's config."""
    return [(int(l), str(p)) for l, p in (getattr(text_config(model), ZEROED_KEY, None) or [])]


def remove_sublayers(model: Any, parts: Iterable[Any], *, inplace: bool = False, delete: bool = True) -> Any:
    """Remove mixer (attention, Mamba...) and/or MLP (or MoE) halves of decoder layers.

    A removed half is replaced by a module returning zeros of the right shape (its weights and the norms that
    only fed it are dropped) and recorded in ``config.cbo_zeroed_sublayers`` so that
    :func:`restore_zeroed_sublayers` rebuilds it after loading: no family's config can say that one layer has
    no mixer or no MLP. A layer whose two halves are both removed (or the one mixer of a single-branch layer,
    Nemotron-H's) is deleted with :func:`remove_blocks`.

    Args:
        parts: ``(layer, "attn" | "mlp")`` pairs (``"mamba"``, ``"mixer"``, ``"moe"`` are aliases), names such as
            ``"layers.3.attn"`` / ``"layers.3.mamba"``, or sublayer Blocks.
        delete: False zeroes both halves of such layers instead of deleting them.

    Example:
        >>> pruned = remove_sublayers(model, [(3, "attn"), (5, "mlp"), (7, "attn"), (7, "mlp")])  # doctest: +SKIP
    """
    layers, _ = decoder_layers(model)
    n = len(layers)
    requested = _parse_parts(parts)
    for layer, _part in requested:
        if not 0 <= layer < n:
            raise ModelError(f"layer index {layer} is out of range; the model has layers 0..{n - 1}")
    gone: dict[int, set[str]] = {}
    for layer, part in zeroed_sublayers(model) + requested:
        gone.setdefault(layer, set()).add(part)
    for layer, ps in gone.items():
        if layer_parts(layers[layer], model)["mlp"] is None:  # a single-branch layer: its mixer is the layer
            ps.add("mlp")
    whole = sorted(l for l, p in gone.items() if p == {"attn", "mlp"})
    if len(whole) >= n:
        raise ModelError(f"cannot remove both halves of all {n} layers; at least one layer must remain")
    if not inplace:
        model = copy.deepcopy(model)
        layers, _ = decoder_layers(model)
    if not delete:
        whole = []
    half = sorted((l, p) for l, ps in gone.items() if l not in whole for p in ps)
    for layer, part in half:
        _zero_half(model, layers[layer], layer, part)
    setattr(text_config(model), ZEROED_KEY, [[l, p] for l, p in half])
    if whole:
        remove_blocks(model, whole, inplace=True)
    return model


def restore_zeroed_sublayers(model: Any) -> Any:
    """Re-apply the zeroed halves recorded in the config (after ``from_pretrained`` of a saved model).

    ``from_pretrained`` rebuilds the original modules for the removed halves (and warns that their weights are
    missing); this swaps them back to zero modules, so outputs match the saved model exactly.
    """
    layers, _ = decoder_layers(model)
    for layer, part in zeroed_sublayers(model):
        if not 0 <= layer < len(layers):
            raise ModelError(f"config lists zeroed sublayer ({layer}, {part!r}) but the model has {len(layers)} layers")
        _zero_half(model, layers[layer], layer, part)
    return model
