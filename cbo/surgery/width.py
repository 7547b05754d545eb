"""Slice attention heads and MLP neurons out of a model; every layer may keep a different width.

A :class:`WidthPlan` says, per decoder layer, which query heads, key/value heads and MLP neurons stay.
:func:`prune_width` slices the weights (through the slots of :mod:`cbo.model.structures`) and updates the
attributes the forward pass reads. Llama-family attention in transformers reshapes with ``-1`` heads and
reads only ``head_dim`` and ``num_key_value_groups``, so per-layer head counts work once
``num_key_value_groups`` matches; GPT-2 splits ``c_attn`` by ``split_size`` (set to the kept width);
GPT-NeoX reshapes with ``-1``.

Example:
    >>> plan = WidthPlan(attention={0: ([0, 1, 2], [0])}, mlp={0: list(range(64))})   # doctest: +SKIP
    >>> small = prune_width(model, plan)                                               # doctest: +SKIP
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from cbo.errors import ModelError
from cbo.extras import require
from cbo.model.structures import AttentionStructure, MLPStructure, Slot, is_conv1d, model_structures

torch = require("torch", "width surgery")
nn = torch.nn


def _as_index(values: Any, n: int, what: str) -> Any:
    values = values.detach().cpu() if isinstance(values, torch.Tensor) else list(values)
    idx = torch.as_tensor(values, dtype=torch.long, device="cpu")
    idx = idx.reshape(-1)
    if idx.numel() == 0:
        raise ModelError(f"{what}: keeping nothing would empty the layer; keep at least one")
    if int(idx.min()) < 0 or int(idx.max()) >= n:
        raise ModelError(f"{what}: indices {idx.tolist()} out of range [0, {n})")
    uniq = torch.unique(idx)  # sorted
    if uniq.numel() != idx.numel():
        raise ModelError(f"{what}: repeated indices in {idx.tolist()}")
    return uniq


@dataclass
class WidthPlan:
    """Which units each layer keeps.

    ``attention[layer] = (query_heads, kv_heads)`` and ``mlp[layer] = neurons`` (kept indices of the current
    model); layers not listed keep everything.
    """

    attention: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    mlp: dict[int, Any] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not self.attention and not self.mlp

    def to_dict(self) -> dict[str, Any]:
        return {
            "attention": {
                int(k): [torch.as_tensor(q).tolist(), torch.as_tensor(kv).tolist()]
                for k, (q, kv) in self.attention.items()
            },
            "mlp": {int(k): torch.as_tensor(v).tolist() for k, v in self.mlp.items()},
        }


def _refresh(module: Any) -> None:
    w = module.weight
    if is_conv1d(module):
        module.nx, module.nf = int(w.shape[0]), int(w.shape[1])
    elif isinstance(module, nn.Linear):
        module.out_features, module.in_features = int(w.shape[0]), int(w.shape[1])


def _slice_slots(slots: list[Slot], keep: dict[str, Any], counts: dict[str, int]) -> None:
    """Slice every parameter the slots cover, keeping the units ``keep[role]`` (``counts[role]`` units now)."""
    by_param: dict[tuple[int, str], list[Slot]] = {}
    for s in slots:
        by_param.setdefault((id(s.module), s.param), []).append(s)
    for group in by_param.values():
        group = sorted(group, key=lambda s: s.offsets[0])
        first = group[0]
        old = first.tensor
        # the slots of a parameter must tile its axis, or slicing would silently drop entries
        covered = sum(len(s.offsets) * s.width * counts[s.role] for s in group)
        if covered != old.shape[first.dim]:
            raise ModelError(f"layout error: slots of {first.name} cover {covered} of {old.shape[first.dim]} entries")
        pos = torch.cat([s.select(keep[s.role]) for s in group])
        with torch.no_grad():
            new = old.detach().index_select(first.dim, pos.to(old.device)).clone()
        setattr(first.module, first.param, nn.Parameter(new, requires_grad=old.requires_grad))
    for s in slots:
        _refresh(s.module)


def slice_attention(s: AttentionStructure, heads: Any, kv_heads: Any) -> None:
    """Keep query heads ``heads`` and key/value heads ``kv_heads`` of one attention module (in place).

    Raises:
        ModelError: an index is out of range, the kept heads leave some KV head with a different number of
            query heads than the others (grouped-query layouts must stay uniform), or nothing is kept.
    """
    where = f"layer {s.layer} attention"
    q = _as_index(heads, s.n_heads, f"{where} query heads")
    kv = _as_index(kv_heads, s.n_kv_heads, f"{where} key/value heads")
    g = s.group_size
    owner = q // g
    missing = sorted(set(owner.tolist()) - set(kv.tolist()))
    if missing:
        raise ModelError(f"{where}: kept query heads {q.tolist()} use key/value heads {missing} that are removed")
    counts = torch.bincount(owner, minlength=s.n_kv_heads)[kv]
    if int(counts.min()) != int(counts.max()):
        raise ModelError(
            f"{where}: kept key/value heads {kv.tolist()} would serve {counts.tolist()} query heads; grouped-query "
            "attention needs the same number in every group (prune whole groups, or the same number of query "
            "heads per group)"
        )
    _slice_slots(s.slots, {"q": q, "kv": kv}, {"q": s.n_heads, "kv": s.n_kv_heads})
    n, nkv = int(q.numel()), int(kv.numel())
    m = s.module
    if s.layout == "separate":
        if hasattr(m, "num_key_value_groups"):
            m.num_key_value_groups = n // nkv
        for name in ("num_heads", "num_attention_heads"):
            if isinstance(getattr(m, name, None), int):
                setattr(m, name, n)
        if isinstance(getattr(m, "num_key_value_heads", None), int):
            m.num_key_value_heads = nkv
    elif s.layout == "gpt2":
        m.num_heads = n
        m.split_size = n * s.head_dim
    elif s.layout == "neox":
        if isinstance(getattr(m, "num_attention_heads", None), int):
            m.num_attention_heads = n


def slice_mlp(s: MLPStructure, neurons: Any) -> None:
    """Keep the MLP neurons ``neurons`` of one MLP module (in place)."""
    keep = _as_index(neurons, s.n_units, f"layer {s.layer} MLP neurons")
    _slice_slots(s.slots, {"mlp": keep}, {"mlp": s.n_units})
    if isinstance(getattr(s.module, "intermediate_size", None), int):
        s.module.intermediate_size = int(keep.numel())


def prune_width(model: Any, plan: WidthPlan, *, inplace: bool = False) -> Any:
    """Slice the heads and neurons a plan removes; returns the pruned model.

    Args:
        model: a Hugging Face causal LM (see :mod:`cbo.model.structures` for the layouts).
        plan: kept units per layer, indices of ``model`` as it is now.
        inplace: modify ``model`` itself instead of a deep copy.

    Example:
        >>> pruned = prune_width(model, WidthPlan(mlp={3: range(0, 1536, 2)}))   # doctest: +SKIP
    """
    target = model if inplace else copy.deepcopy(model)
    kinds = tuple(k for k, part in (("attention", plan.attention), ("mlp", plan.mlp)) if part)
    if not kinds:
        return target
    structs = model_structures(target, kinds)
    for layer, (heads, kv) in sorted(plan.attention.items()):
        if layer not in structs.attention:
            raise ModelError(f"the plan prunes attention of layer {layer}, which has none (layers: {structs.n_layers})")
        slice_attention(structs.attention[layer], heads, kv)
    for layer, neurons in sorted(plan.mlp.items()):
        if layer not in structs.mlp:
            raise ModelError(f"the plan prunes the MLP of layer {layer}, which has none (layers: {structs.n_layers})")
        slice_mlp(structs.mlp[layer], neurons)
    return target


def resize_to(model: Any, widths: list[dict[str, int]]) -> Any:
    """Shrink freshly built modules to recorded per-layer widths (keeps the first units; used by loading).

    ``widths[i]`` has ``heads``, ``kv_heads`` and ``intermediate`` (0 = that branch is absent).
    """
    structs = model_structures(model)
    if len(widths) != structs.n_layers:
        raise ModelError(f"recorded widths cover {len(widths)} layers but the model has {structs.n_layers}")
    plan = WidthPlan()
    for i, w in enumerate(widths):
        a, m = structs.attention.get(i), structs.mlp.get(i)
        if a is not None and w.get("heads") and (w["heads"], w["kv_heads"]) != (a.n_heads, a.n_kv_heads):
            if w["heads"] % w["kv_heads"]:
                raise ModelError(f"layer {i}: {w['heads']} query heads do not split into {w['kv_heads']} groups")
            per = w["heads"] // w["kv_heads"]
            q = [kv * a.group_size + j for kv in range(w["kv_heads"]) for j in range(per)]
            plan.attention[i] = (q, list(range(w["kv_heads"])))
        if m is not None and w.get("intermediate") and w["intermediate"] != m.n_units:
            plan.mlp[i] = list(range(w["intermediate"]))
    return prune_width(model, plan, inplace=True)
