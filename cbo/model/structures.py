"""Which weights form one MLP neuron, attention head or key/value group, per architecture.

A *structure* is the unit that width pruning removes whole. Every structure is described by
:class:`Slot` objects: a parameter, the axis along which the structure's entries lie (in torch layout)
and where along that axis each unit's entries are. Scores gather a unit's entries through the slots;
surgery slices the parameters through the same slots, so the two can never disagree.

Supported layouts:

* attention ``"separate"``: ``q_proj``/``k_proj``/``v_proj`` rows and ``o_proj`` columns (Llama, Mistral,
  Qwen2/3, Gemma 1/2/3); grouped-query attention (``n_kv_heads < n_heads``) is handled per KV group.
* attention ``"gpt2"``: the fused ``c_attn`` Conv1D (q | k | v along its output axis, columns in torch
  layout because Conv1D stores ``(in, out)``) and ``c_proj`` rows.
* attention ``"neox"``: GPT-NeoX ``query_key_value`` rows, interleaved per head as ``[q_h k_h v_h]``, and
  ``dense`` columns.
* MLP ``"gated"`` (``gate_proj``/``up_proj`` rows, ``down_proj`` column), ``"gpt2"`` (``c_fc`` Conv1D
  column, ``c_proj`` row) and ``"neox"`` (``dense_h_to_4h`` row, ``dense_4h_to_h`` column).

Units of attention depend on the grouped-query mode (see :func:`attention_units`): ``"group"`` removes
whole KV groups (a KV head with all its query heads), ``"query"`` removes single query heads, the same
number in every group of a layer, and keeps every KV head.

Example:
    >>> s = model_structures(model)                    # doctest: +SKIP
    >>> s.attention[0].n_heads, s.mlp[0].n_units       # doctest: +SKIP
    (9, 1536)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cbo.errors import ModelError
from cbo.extras import require

torch = require("torch", "width pruning")
nn = torch.nn

KINDS = ("attention", "mlp")
GQA_MODES = ("group", "query")

ATTENTION_LAYOUTS = {
    "separate": "q_proj/k_proj/v_proj/o_proj (Llama, Mistral, Qwen2, Qwen3, Gemma)",
    "gpt2": "c_attn/c_proj Conv1D (GPT-2)",
    "neox": "query_key_value/dense (GPT-NeoX)",
}
MLP_LAYOUTS = {
    "gated": "gate_proj/up_proj/down_proj (Llama family)",
    "gpt2": "c_fc/c_proj Conv1D (GPT-2)",
    "neox": "dense_h_to_4h/dense_4h_to_h (GPT-NeoX)",
}


def is_conv1d(module: Any) -> bool:
    """True for transformers' Conv1D (GPT-2), which stores its weight as ``(in, out)``."""
    # duck-typed to avoid importing transformers here
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


def out_axis(module: Any) -> int:
    """The weight axis that indexes a projection's outputs (0 for nn.Linear, 1 for Conv1D)."""
    return 1 if is_conv1d(module) else 0


def in_axis(module: Any) -> int:
    """The weight axis that indexes a projection's inputs."""
    return 0 if is_conv1d(module) else 1


@dataclass(frozen=True)
class Slot:
    """Where the units of one role sit inside one parameter.

    Unit ``u`` of the slot occupies, along axis ``dim`` of ``module.<param>``, the entries
    ``offset + u * width + [0, width)`` for every ``offset`` in ``offsets``.
    """

    name: str  # dotted name of the parameter inside the decoder layer, e.g. "self_attn.q_proj.weight"
    module: Any
    param: str  # "weight" | "bias"
    dim: int
    offsets: tuple[int, ...]
    width: int
    role: str  # "q" (indexed by query head), "kv" (by key/value head), "mlp" (by neuron)

    @property
    def tensor(self) -> Any:
        return getattr(self.module, self.param)

    @property
    def is_bias(self) -> bool:
        return self.param == "bias"

    @property
    def inner(self) -> int:
        """Entries of the parameter per position along ``dim``."""
        t = self.tensor
        return t.numel() // t.shape[self.dim]

    def select(self, units: Any) -> Any:
        """Positions along ``dim`` of the given units, segment-major (the order slicing must keep)."""
        units = torch.as_tensor(units, dtype=torch.long, device="cpu").reshape(-1)
        ar = torch.arange(self.width, device="cpu")
        return torch.cat([(off + units[:, None] * self.width + ar).reshape(-1) for off in self.offsets])

    def unit_positions(self, units: Any) -> Any:
        """Positions grouped by row of ``units``: ``(n_rows, k * len(offsets) * width)`` for units ``(n_rows, k)``."""
        units = torch.as_tensor(units, dtype=torch.long, device="cpu")
        if units.ndim == 1:
            units = units[:, None]
        ar = torch.arange(self.width, device="cpu")
        parts = [(off + units[..., None] * self.width + ar).reshape(units.shape[0], -1) for off in self.offsets]
        return torch.cat(parts, dim=1)

    def gather(self, values: Any, units: Any) -> Any:
        """Entries of ``values`` (shaped like the parameter) per row of ``units``: ``(n_rows, m)``."""
        pos = self.unit_positions(units)
        moved = values.movedim(self.dim, 0)
        return moved[pos.reshape(-1).to(moved.device)].reshape(pos.shape[0], -1)


@dataclass
class Structure:
    """What every structure has: its decoder layer, its module and the layout of its weights."""

    layer: int
    module: Any
    layout: str

    def output_projection(self) -> Slot:
        """The weight slot of the output projection (``o_proj``, ``down_proj``, ...): units along its input axis."""
        for slot in self.slots:
            if not slot.is_bias and slot.dim == in_axis(slot.module):
                return slot
        raise ModelError(f"layer {self.layer} {self.kind}: no output projection among {[s.name for s in self.slots]}")

    def slot_params(self, role: str | None = None) -> int:
        """Parameters of one unit of ``role`` (all roles: None) over the slots, biases included."""
        return sum(len(s.offsets) * s.width * s.inner for s in self.slots if role is None or s.role == role)


@dataclass
class AttentionStructure(Structure):
    """One attention module: its head counts and slots."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    slots: list[Slot] = field(default_factory=list)
    kind: str = "attention"

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def is_gqa(self) -> bool:
        return self.n_kv_heads < self.n_heads

    def params_per(self, role: str) -> int:
        """Parameters of one query head (role "q") or one key/value head (role "kv"), biases included."""
        return self.slot_params(role)

    @property
    def n_params(self) -> int:
        return self.n_heads * self.params_per("q") + self.n_kv_heads * self.params_per("kv")


@dataclass
class MLPStructure(Structure):
    """One MLP module: its width and slots."""

    n_units: int
    slots: list[Slot] = field(default_factory=list)
    kind: str = "mlp"

    @property
    def unit_params(self) -> int:
        return self.slot_params()

    @property
    def n_params(self) -> int:
        return self.n_units * self.unit_params


@dataclass
class Units:
    """The prunable units of one structure under a grouped-query mode.

    Row ``u`` of ``q`` lists the query heads of unit ``u`` and row ``u`` of ``kv`` its key/value heads
    (``kv`` has zero columns in ``"query"`` mode, where KV heads are never removed). For an MLP, ``q``
    holds the neuron of each unit and ``kv`` is empty.
    """

    q: Any
    kv: Any
    params: int  # parameters removed with one unit
    chunk: int = 1  # units per layer that must go together (query mode: one per group)

    @property
    def n(self) -> int:
        return int(self.q.shape[0])


def attention_units(s: AttentionStructure, gqa: str = "group") -> Units:
    """The units of an attention structure.

    Multi-head attention (no grouping): one unit per head (its q/k/v entries and o columns). Grouped-query
    attention: ``gqa="group"`` gives one unit per KV group (its KV head, all its query heads);
    ``gqa="query"`` gives one unit per query head (q entries and o columns only) and the allocator removes
    the same number of query heads from every group.
    """
    if gqa not in GQA_MODES:
        raise ModelError(f"unknown grouped-query mode {gqa!r}; use one of {GQA_MODES}")
    n, g = s.n_heads, s.group_size
    pq, pkv = s.params_per("q"), s.params_per("kv")
    if not s.is_gqa:
        heads = torch.arange(n, device="cpu")[:, None]
        return Units(heads, heads.clone(), pq + pkv)
    if gqa == "group":
        return Units(
            torch.arange(n, device="cpu").reshape(s.n_kv_heads, g),
            torch.arange(s.n_kv_heads, device="cpu")[:, None],
            g * pq + pkv,
        )
    return Units(
        torch.arange(n, device="cpu")[:, None],
        torch.zeros(n, 0, dtype=torch.long, device="cpu"),
        pq,
        chunk=s.n_kv_heads,
    )


def mlp_units(s: MLPStructure) -> Units:
    return Units(
        torch.arange(s.n_units, device="cpu")[:, None],
        torch.zeros(s.n_units, 0, dtype=torch.long, device="cpu"),
        s.unit_params,
    )


def units_of(s: AttentionStructure | MLPStructure, gqa: str = "group") -> Units:
    return attention_units(s, gqa) if s.kind == "attention" else mlp_units(s)


def gather_units(s: AttentionStructure | MLPStructure, units: Units, values: dict[str, Any], *, biases: bool = False):
    """Per-unit entries of per-parameter tensors.

    Args:
        values: tensors shaped like the slot parameters, keyed by slot name (missing names are skipped).
        biases: include bias slots.

    Returns:
        list of ``(slot, (n_units, m) tensor)``, one per slot that has entries for these units.
    """
    out = []
    for slot in s.slots:
        if slot.is_bias and not biases:
            continue
        if slot.name not in values:
            continue
        idx = units.kv if slot.role == "kv" else units.q
        if idx.shape[1] == 0:
            continue
        out.append((slot, slot.gather(values[slot.name], idx)))
    return out


# ---------------------------------------------------------------- layout detection


def _param_slots(prefix: str, module: Any, *, dim_w: int, offsets, width: int, role: str) -> list[Slot]:
    slots = [Slot(f"{prefix}.weight", module, "weight", dim_w, tuple(offsets), width, role)]
    bias = getattr(module, "bias", None)
    if isinstance(bias, torch.Tensor) and bias.ndim == 1 and (dim_w == out_axis(module)):
        slots.append(Slot(f"{prefix}.bias", module, "bias", 0, tuple(offsets), width, role))
    return slots


def _head_dim(attn: Any, model: Any) -> int:
    for name in ("head_dim", "head_size"):
        v = getattr(attn, name, None)
        if isinstance(v, int) and v > 0:
            return v
    config = getattr(model, "config", None)
    hd = getattr(config, "head_dim", None)
    if isinstance(hd, int) and hd > 0:
        return hd
    return config.hidden_size // config.num_attention_heads


def _unsupported_attention(layer: int, attn: Any) -> ModelError:
    children = [n for n, _ in attn.named_children()]
    layouts = "; ".join(ATTENTION_LAYOUTS.values())
    return ModelError(
        f"unsupported attention layout in layer {layer}: {type(attn).__name__} with submodules {children}. "
        f"Width pruning slices attention of these layouts: {layouts}. Fused projections whose split is read "
        "from the shared model config (e.g. Phi-3 qkv_proj) cannot take per-layer head counts; prune this "
        "model by depth only, or width-prune its MLPs only (kinds=('mlp',))."
    )


def _unsupported_mlp(layer: int, mlp: Any) -> ModelError:
    children = [n for n, _ in mlp.named_children()]
    return ModelError(
        f"unsupported MLP layout in layer {layer}: {type(mlp).__name__} with submodules {children}. "
        f"Width pruning slices MLPs of these layouts: {'; '.join(MLP_LAYOUTS.values())}. Mixture-of-experts and "
        "fused gate/up MLPs are not sliced; prune this model by depth only, or its attention only "
        "(kinds=('attention',))."
    )


def attention_structure(layer: int, attn: Any, model: Any = None, prefix: str = "self_attn") -> AttentionStructure:
    """Describe one attention module; raises ModelError for layouts width pruning cannot slice."""
    get = lambda n: getattr(attn, n, None)  # noqa: E731
    if all(isinstance(get(n), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        d = _head_dim(attn, model)
        q, k, v, o = (get(n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        if q.out_features % d or k.out_features % d or k.out_features != v.out_features:
            raise _unsupported_attention(layer, attn)
        n, nkv = q.out_features // d, k.out_features // d
        if nkv == 0 or n % nkv or o.in_features != n * d:
            raise _unsupported_attention(layer, attn)
        slots = (
            _param_slots(f"{prefix}.q_proj", q, dim_w=0, offsets=(0,), width=d, role="q")
            + _param_slots(f"{prefix}.k_proj", k, dim_w=0, offsets=(0,), width=d, role="kv")
            + _param_slots(f"{prefix}.v_proj", v, dim_w=0, offsets=(0,), width=d, role="kv")
            + _param_slots(f"{prefix}.o_proj", o, dim_w=1, offsets=(0,), width=d, role="q")
        )
        return AttentionStructure(layer, attn, "separate", n, nkv, d, slots)
    if is_conv1d(get("c_attn")) and is_conv1d(get("c_proj")) and get("q_attn") is None:
        d = _head_dim(attn, model)
        c_attn, c_proj = get("c_attn"), get("c_proj")
        width3 = c_attn.weight.shape[1]
        if width3 % (3 * d) or c_proj.weight.shape[0] != width3 // 3:
            raise _unsupported_attention(layer, attn)
        n = width3 // (3 * d)
        # q, k and v are three slots on one parameter (offsets 0, n*d, 2*n*d); k and v follow the query head
        slots = (
            _param_slots(f"{prefix}.c_attn", c_attn, dim_w=1, offsets=(0,), width=d, role="q")
            + _param_slots(f"{prefix}.c_attn", c_attn, dim_w=1, offsets=(n * d,), width=d, role="kv")
            + _param_slots(f"{prefix}.c_attn", c_attn, dim_w=1, offsets=(2 * n * d,), width=d, role="kv")
            + _param_slots(f"{prefix}.c_proj", c_proj, dim_w=0, offsets=(0,), width=d, role="q")
        )
        return AttentionStructure(layer, attn, "gpt2", n, n, d, slots)
    if isinstance(get("query_key_value"), nn.Linear) and isinstance(get("dense"), nn.Linear):
        d = _head_dim(attn, model)
        qkv, dense = get("query_key_value"), get("dense")
        if qkv.out_features % (3 * d) or dense.in_features != qkv.out_features // 3:
            raise _unsupported_attention(layer, attn)
        n = qkv.out_features // (3 * d)
        slots = _param_slots(f"{prefix}.query_key_value", qkv, dim_w=0, offsets=(0,), width=3 * d, role="q")
        slots += _param_slots(f"{prefix}.dense", dense, dim_w=1, offsets=(0,), width=d, role="q")
        return AttentionStructure(layer, attn, "neox", n, n, d, slots)
    raise _unsupported_attention(layer, attn)


def mlp_structure(layer: int, mlp: Any, prefix: str = "mlp") -> MLPStructure:
    """Describe one MLP module; raises ModelError for layouts width pruning cannot slice."""
    get = lambda n: getattr(mlp, n, None)  # noqa: E731
    if all(isinstance(get(n), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
        g, u, dn = get("gate_proj"), get("up_proj"), get("down_proj")
        if not (g.out_features == u.out_features == dn.in_features):
            raise _unsupported_mlp(layer, mlp)
        slots = (
            _param_slots(f"{prefix}.gate_proj", g, dim_w=0, offsets=(0,), width=1, role="mlp")
            + _param_slots(f"{prefix}.up_proj", u, dim_w=0, offsets=(0,), width=1, role="mlp")
            + _param_slots(f"{prefix}.down_proj", dn, dim_w=1, offsets=(0,), width=1, role="mlp")
        )
        return MLPStructure(layer, mlp, "gated", g.out_features, slots)
    if is_conv1d(get("c_fc")) and is_conv1d(get("c_proj")):
        fc, proj = get("c_fc"), get("c_proj")
        if fc.weight.shape[1] != proj.weight.shape[0]:
            raise _unsupported_mlp(layer, mlp)
        slots = _param_slots(f"{prefix}.c_fc", fc, dim_w=1, offsets=(0,), width=1, role="mlp")
        slots += _param_slots(f"{prefix}.c_proj", proj, dim_w=0, offsets=(0,), width=1, role="mlp")
        return MLPStructure(layer, mlp, "gpt2", fc.weight.shape[1], slots)
    if isinstance(get("dense_h_to_4h"), nn.Linear) and isinstance(get("dense_4h_to_h"), nn.Linear):
        up, down = get("dense_h_to_4h"), get("dense_4h_to_h")
        if up.out_features != down.in_features:
            raise _unsupported_mlp(layer, mlp)
        slots = _param_slots(f"{prefix}.dense_h_to_4h", up, dim_w=0, offsets=(0,), width=1, role="mlp")
        slots += _param_slots(f"{prefix}.dense_4h_to_h", down, dim_w=1, offsets=(0,), width=1, role="mlp")
        return MLPStructure(layer, mlp, "neox", up.out_features, slots)
    raise _unsupported_mlp(layer, mlp)


def _has_params(module: Any) -> bool:
    return any(True for _ in module.parameters())


@dataclass
class ModelStructures:
    """The attention and MLP structures of a model, keyed by decoder-layer index."""

    model: Any
    attention: dict[int, AttentionStructure]
    mlp: dict[int, MLPStructure]
    layers_path: str
    n_layers: int

    def of_kind(self, kind: str) -> dict[int, AttentionStructure | MLPStructure]:
        if kind not in KINDS:
            raise ModelError(f"unknown structure kind {kind!r}; use one of {KINDS}")
        return self.attention if kind == "attention" else self.mlp

    def all(self, kinds: tuple[str, ...] = KINDS) -> list[AttentionStructure | MLPStructure]:
        out = []
        for i in range(self.n_layers):
            for kind in kinds:
                s = self.of_kind(kind).get(i)
                if s is not None:
                    out.append(s)
        return out


def model_structures(model: Any, kinds: tuple[str, ...] = KINDS) -> ModelStructures:
    """Every prunable attention and MLP structure of ``model``.

    A branch without parameters (one that depth surgery replaced by zeros) is skipped.

    Raises:
        ModelError: a layer's attention or MLP has a layout width pruning cannot slice.
    """
    from cbo.model.blocks import decoder_layers, layer_parts

    for kind in kinds:
        if kind not in KINDS:
            raise ModelError(f"unknown structure kind {kind!r}; use one of {KINDS}")
    layers, path = decoder_layers(model)
    attention: dict[int, AttentionStructure] = {}
    mlp: dict[int, MLPStructure] = {}
    for i, layer in enumerate(layers):
        parts = layer_parts(layer, model)
        if "attention" in kinds and _has_params(parts["attn"]):
            attention[i] = attention_structure(i, parts["attn"], model, prefix=parts["attn_name"])
        if "mlp" in kinds and _has_params(parts["mlp"]):
            mlp[i] = mlp_structure(i, parts["mlp"], prefix=parts["mlp_name"])
    return ModelStructures(model, attention, mlp, path, len(layers))


def layer_widths(model: Any) -> list[dict[str, int]]:
    """Per decoder layer: query heads, key/value heads, head size and MLP width (0 where a branch is gone)."""
    s = model_structures(model)
    out = []
    for i in range(s.n_layers):
        a, m = s.attention.get(i), s.mlp.get(i)
        out.append(
            {
                "heads": a.n_heads if a else 0,
                "kv_heads": a.n_kv_heads if a else 0,
                "head_dim": a.head_dim if a else 0,
                "intermediate": m.n_units if m else 0,
            }
        )
    return out
