"""The model families CBO knows by name: where their decoder layers and layer halves are, what kind each block is,
and which config fields removing layers must rewrite.

One table row per ``config.model_type`` (:data:`ARCHITECTURES`). A row says, relative to one decoder layer:

* ``attn``: the token-mixer half. A tuple lists alternatives (a hybrid layer holds a ``self_attn`` *or* a
  ``mamba``); every one present in a layer is a parallel branch of that half (a Falcon-H1 layer adds its Mamba and
  its attention output on the same residual step, so both form its mixer half).
* ``mlp``: the channel-mixer half (an MLP, or a mixture of experts with its router and shared experts); empty for
  single-branch layers (Nemotron-H: each layer is one mixer ``M``, ``*``, ``-`` or ``E``, and is a block as a whole).
* ``attn_branch`` / ``mlp_branch``: the module whose output *is* the branch added to the residual, when that is not
  the half itself (Gemma's post-norms); ``attn_norms`` / ``mlp_norms``: norms that only serve that half.
* ``hybrid``: layers differ in kind, so a layer-granularity block carries the kind of what it holds.
* ``fields``: how the config describes the layers, for :func:`rewrite_layer_config`.

Block kinds: ``attention``; ``mamba`` (any state-space or linear-attention mixer: Mamba/Mamba2, gated DeltaNet,
LFM2's short convolutions); ``mlp``; ``moe`` (a router and its experts); and combined kinds ``"mamba+moe"`` for a
layer (or half) that holds two of them. Plain dense and MoE families keep the kind ``"layer"`` at layer granularity.

This module imports neither torch nor transformers: it reads module class names and config attributes only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from cbo.errors import InfeasibleError

KINDS = ("attention", "mamba", "mlp", "moe")
JOIN = "+"


@dataclass(frozen=True)
class ArchSpec:
    """Attribute names of one decoder-layer family (relative to the decoder layer)."""

    layers: str  # dotted path of the ModuleList, relative to the model
    attn: str | tuple[str, ...]  # token-mixer module(s); a tuple: alternatives, every present one a parallel branch
    mlp: str | tuple[str, ...]  # channel-mixer module(s); () for single-branch layers
    attn_branch: str | None = None  # module whose output is the mixer branch, when not the mixer itself
    mlp_branch: str | None = None
    attn_norms: tuple[str, ...] = ()  # norms that only feed (or only follow) the mixer: dead once it goes
    mlp_norms: tuple[str, ...] = ()
    hybrid: bool = False  # layers differ in kind: layer blocks carry the kind of what they hold
    name: str = ""  # display name (README table, error messages)
    fields: str = ""  # the config fields that describe the layers, as the README's table states them
    # writes the config fields for the kept layers (old indices) and returns their names, before the generic
    # slicing of per-layer lists; None: the config cannot describe those layers
    rewrite: Callable[[Any, list[int]], tuple[str, ...] | None] | None = field(default=None, compare=False)

    def names(self, part: str) -> tuple[str, ...]:
        value = self.attn if part == "attn" else self.mlp
        return (value,) if isinstance(value, str) else tuple(value)


# ------------------------------------------------------------------------------ config rewrites of special families


def sparse_step_rewrite(config: Any, keep: list[int]) -> tuple[str, ...]:
    """Qwen-MoE families: which layers hold experts follows ``decoder_sparse_step`` and ``mlp_only_layers``; after
    removal the kept layers' own pattern is written out as ``decoder_sparse_step = 1`` and the dense layers' list."""
    step = int(getattr(config, "decoder_sparse_step", 1) or 1)
    dense_old = {int(i) for i in getattr(config, "mlp_only_layers", None) or []}
    experts = int(getattr(config, "num_experts", 0) or 0)
    moe = [old not in dense_old and experts > 0 and (old + 1) % step == 0 for old in keep]
    config.decoder_sparse_step = 1
    config.mlp_only_layers = [new for new, is_moe in enumerate(moe) if not is_moe]
    return ("decoder_sparse_step", "mlp_only_layers")


def periodic(flags: Sequence[bool]) -> tuple[int, int] | None:
    """``(period, offset)`` with ``flags[i] == (i % period == offset)`` for every i (the smallest period), or None."""
    n = len(flags)
    for period in range(1, n + 2):
        for offset in range(period):
            if all(f == (i % period == offset) for i, f in enumerate(flags)):
                return period, offset
    return None


def jamba_pattern(config: Any, keep: list[int]) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The (attention, expert) ``(period, offset)`` pairs that describe the kept layers of a Jamba config, or None
    when the kept layers' pattern is not periodic (Jamba's config has no per-layer list)."""
    attn = [i % config.attn_layer_period == config.attn_layer_offset for i in keep]
    moe = [i % config.expert_layer_period == config.expert_layer_offset for i in keep]
    a, e = periodic(attn), periodic(moe)
    return None if a is None or e is None else (a, e)


def jamba_rewrite(config: Any, keep: list[int]) -> tuple[str, ...] | None:
    found = jamba_pattern(config, keep)
    if found is None:
        return None
    (config.attn_layer_period, config.attn_layer_offset), (config.expert_layer_period, config.expert_layer_offset) = (
        found
    )
    return ("attn_layer_period", "attn_layer_offset", "expert_layer_period", "expert_layer_offset")


ATTENTION_TYPES = ("full_attention", "attention", "sliding_attention")


def can_delete_layers(config: Any, keep: list[int]) -> bool:
    """Whether the family's config can describe a model that runs with only the layers ``keep`` (old indices).

    Jamba's config states its layer pattern as periods only. And a hybrid stack must keep one attention layer:
    transformers' hybrid caches and masks need one (``get_mask_sizes`` fails on a cache of linear-attention
    layers only).
    """
    spec = ARCHITECTURES.get(getattr(config, "model_type", "") or "")
    if spec is None or not spec.hybrid:
        return True
    if spec.rewrite is jamba_rewrite and jamba_pattern(config, keep) is None:
        return False
    types = list(getattr(config, "layer_types", None) or [])
    attention = [i for i, t in enumerate(types) if t in ATTENTION_TYPES]
    return not attention or any(i in keep for i in attention)


# ------------------------------------------------------------------------------------------------- the table

_LLAMA = ArchSpec("model.layers", "self_attn", "mlp", None, None, ("input_layernorm",), ("post_attention_layernorm",))
_GEMMA = ArchSpec(
    "model.layers",
    "self_attn",
    "mlp",
    "post_attention_layernorm",
    "post_feedforward_layernorm",
    ("input_layernorm", "post_attention_layernorm"),
    ("pre_feedforward_layernorm", "post_feedforward_layernorm"),
)
_QWEN_MOE = ArchSpec(
    "model.layers", "self_attn", "mlp", None, None, ("input_layernorm",), ("post_attention_layernorm",),
    rewrite=sparse_step_rewrite, fields="`decoder_sparse_step`, `mlp_only_layers`",
)  # fmt: skip
# hybrid layers: a Mamba-style mixer or attention, then an MLP or a mixture of experts
_MAMBA_ATTN = ("self_attn", "mamba")
_PRE_FF = (("input_layernorm",), ("pre_ff_layernorm",))


def _hybrid(name: str, attn: tuple[str, ...], mlp: tuple[str, ...], norms: tuple, fields: str, **kw: Any) -> ArchSpec:
    return ArchSpec("model.layers", attn, mlp, None, None, *norms, hybrid=True, name=name, fields=fields, **kw)


# keyed by config.model_type
ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gemma": _LLAMA,
    "phi3": _LLAMA,
    # mixture of experts: the router and all its experts (and a shared expert) form the MLP half, one block
    "mixtral": _LLAMA,
    "qwen2_moe": _QWEN_MOE,
    "qwen3_moe": _QWEN_MOE,
    "olmoe": _LLAMA,
    "gemma2": _GEMMA,
    "gemma3_text": _GEMMA,
    "gemma3": ArchSpec(
        "model.language_model.layers",
        "self_attn",
        "mlp",
        "post_attention_layernorm",
        "post_feedforward_layernorm",
        _GEMMA.attn_norms,
        _GEMMA.mlp_norms,
    ),  # fmt: skip
    "olmo2": ArchSpec(
        "model.layers",
        "self_attn",
        "mlp",
        "post_attention_layernorm",
        "post_feedforward_layernorm",
        ("post_attention_layernorm",),
        ("post_feedforward_layernorm",),
    ),  # fmt: skip
    "gpt2": ArchSpec("transformer.h", "attn", "mlp", None, None, ("ln_1",), ("ln_2",)),
    "gpt_neox": ArchSpec(
        "gpt_neox.layers", "attention", "mlp", None, None, ("input_layernorm",), ("post_attention_layernorm",)
    ),
    # hybrids
    # one mixer per layer; its norm stays when a layer is zeroed instead of deleted (the forward reads its dtype)
    "nemotron_h": _hybrid("Nemotron-H", ("mixer",), (), ((), ()), "`layers_block_type` (`M`/`*`/`-`/`E`)"),
    "jamba": _hybrid(
        "Jamba",
        _MAMBA_ATTN,
        ("feed_forward",),
        _PRE_FF,
        "`attn_layer_period/offset`, `expert_layer_period/offset`",
        rewrite=jamba_rewrite,
    ),  # fmt: skip
    "bamba": _hybrid("Bamba", _MAMBA_ATTN, ("feed_forward",), _PRE_FF, "`attn_layer_indices`"),
    "falcon_h1": _hybrid("Falcon-H1", ("mamba", "self_attn"), ("feed_forward",), _PRE_FF, "(none per layer)"),
    "granitemoehybrid": _hybrid(
        "GraniteMoeHybrid",
        _MAMBA_ATTN,
        ("block_sparse_moe", "shared_mlp"),
        (("input_layernorm",), ("post_attention_layernorm",)),
        "`layer_types`",
    ),  # fmt: skip
    "qwen3_next": _hybrid(
        "Qwen3-Next",
        ("self_attn", "linear_attn"),
        ("mlp",),
        (("input_layernorm",), ("post_attention_layernorm",)),
        "`layer_types`, `decoder_sparse_step`, `mlp_only_layers`",
        rewrite=sparse_step_rewrite,
    ),  # fmt: skip
    "lfm2": _hybrid(
        "LFM2",
        ("self_attn", "conv"),
        ("feed_forward",),
        (("operator_norm",), ("ffn_norm",)),
        "`layer_types`, `full_attn_idxs`",
    ),  # fmt: skip
}

SUPPORTED = (
    "Llama", "Mistral", "Qwen2", "Qwen3", "Gemma", "Gemma 2", "Gemma 3", "Phi-3", "Mixtral", "Qwen2-MoE",
    "Qwen3-MoE", "OLMoE", "OLMo 2", "GPT-2", "GPT-NeoX", "Bamba", "Jamba", "Falcon-H1", "GraniteMoeHybrid",
    "Qwen3-Next", "LFM2", "Nemotron-H",
)  # fmt: skip

# config lists that hold layer *indices* (remapped on removal) rather than one entry per layer (sliced)
INDEX_LISTS = (
    "mlp_only_layers", "full_attention_layers", "sliding_window_layers", "attn_layer_indices", "full_attn_idxs",
)  # fmt: skip
# config lists that are not one entry per decoder layer even when their length happens to equal the layer count
NOT_PER_LAYER = ("mtp_layers_block_type", "time_step_limit", "mlp_multipliers", "ssm_multipliers")


# ------------------------------------------------------------------------------------------------- kinds


def module_kind(module: Any, default: str) -> str:
    """The kind of one branch module, from what it is: ``moe`` (it holds experts), ``mamba`` (a state-space,
    linear-attention or short-convolution mixer), ``attention``, or ``default``; a zero stand-in says the kind of
    what it replaced."""
    if isinstance(getattr(module, "stand_in_kind", None), str):
        return module.stand_in_kind
    if getattr(module, "experts", None) is not None:
        return "moe"
    cls = type(module).__name__
    if any(word in cls for word in ("Mamba", "Mixer", "DeltaNet", "ShortConv", "LinearAttention")):
        return "mamba"
    if "Attention" in cls:
        return "attention"
    return default


def combined_kind(kinds: Sequence[str]) -> str:
    """One kind for a block holding several: the distinct kinds in :data:`KINDS` order, joined by ``+``."""
    distinct = {part for kind in kinds for part in kind.split(JOIN) if part}
    return JOIN.join([k for k in KINDS if k in distinct] + sorted(distinct - set(KINDS)))


def kind_parts(kind: str) -> set[str]:
    """The kinds a (possibly combined) kind holds: ``"mamba+moe"`` -> ``{"mamba", "moe"}``."""
    return set(kind.split(JOIN))


def check_caps_shape(caps: Any) -> dict[str, int] | None:
    """``caps`` as ``{kind: count}`` (None stays None); InvalidOptionError naming the bad value otherwise.

    Example:
        >>> check_caps_shape({"attention": 4})
        {'attention': 4}
    """
    from collections.abc import Mapping

    from cbo.checks import describe, is_int
    from cbo.errors import InvalidOptionError

    if caps is None:
        return None
    if not isinstance(caps, Mapping):
        raise InvalidOptionError(
            f"caps must map block kinds to the most blocks of that kind removed, e.g. {{'attention': 4, 'mlp': 2}}; "
            f"got {describe(caps)}."
        )
    for kind, cap in caps.items():
        if not isinstance(kind, str) or not is_int(cap) or cap < 0:
            raise InvalidOptionError(
                f"caps[{kind!r}] = {describe(cap)}: caps map a block kind (a str) to a count >= 0, e.g. "
                "{'attention': 4}."
            )
    return {kind: int(cap) for kind, cap in caps.items()}


def resolve_caps(caps: dict[str, int] | None, kinds: Sequence[str]) -> dict[str, int]:
    """Per-kind caps over the block kinds of a model, where a cap may also name a kind that combined kinds hold.

    A cap on a kind the blocks have applies as it is. A cap on ``"mamba"`` when the blocks are layers of kinds
    ``"mamba+mlp"`` and ``"attention+mlp"`` applies to every block holding a Mamba mixer: a cap of 0 caps each such
    kind at 0; a positive cap needs exactly one such kind (caps count blocks of one kind each).

    Raises:
        InfeasibleError: a cap names a kind no block holds, or a positive cap spans several combined kinds.

    Example:
        >>> resolve_caps({"attention": 1, "mamba": 0}, ["mamba+mlp", "attention+mlp", "mamba+mlp"])
        {'attention+mlp': 1, 'mamba+mlp': 0}
    """
    present = sorted(set(kinds))
    out: dict[str, int] = {}
    for kind, cap in (check_caps_shape(caps) or {}).items():
        if kind in present:
            targets = [kind]
        else:
            targets = [k for k in present if kind in kind_parts(k)]
            if not targets:
                raise InfeasibleError(
                    f"caps name block kinds [{kind!r}] this model does not have; its kinds: {present}."
                )
            if len(targets) > 1 and int(cap) > 0:
                raise InfeasibleError(
                    f"a cap of {cap} on {kind!r} spans the block kinds {targets}; cap each of them, use granularity "
                    f"'sublayer' (one kind per block), or cap {kind!r} at 0."
                )
        for t in targets:
            out[t] = min(int(cap), out.get(t, int(cap)))
    return out


def blocks_of_kind(kind: str, kinds: Sequence[str]) -> list[int]:
    """Indices of the blocks whose kind is ``kind`` or holds it (``"mamba"`` matches ``"mamba+mlp"``)."""
    return [i for i, k in enumerate(kinds) if k == kind or kind in kind_parts(k)]


def hybrid_families() -> list[tuple[str, str, str]]:
    """``(family, model_type, config fields)`` of the hybrid families, in table order."""
    rows = []
    for model_type, spec in ARCHITECTURES.items():
        if spec.hybrid:
            rows.append((spec.name, model_type, spec.fields))
    return rows
