"""Where the removable blocks of a Hugging Face causal LM are: decoder layers or their attention/MLP halves.

Every model-touching module asks here. A *block* is a residual branch ``h -> h + f(h)``:

* granularity ``"layer"``: one decoder layer; its branch is ``layer(h) - h``.
* granularity ``"sublayer"``: the mixer half (attention, or a Mamba-style mixer in a hybrid stack) and the MLP
  (or mixture-of-experts) half of each layer; ``Block.module`` is the module whose output *is* the branch added to
  the residual stream (Llama ``self_attn`` / ``mlp``, Gemma 3 ``post_attention_layernorm`` /
  ``post_feedforward_layernorm``, GPT-2 ``attn`` / ``mlp``, Bamba ``mamba`` / ``feed_forward``), and
  ``Block.modules`` all of them when the half has parallel branches (Falcon-H1). Attention modules return a tuple
  whose first element is the branch; use :func:`branch_tensor` and :func:`with_branch_tensor` to read and replace
  it in a forward hook.

Each block has a ``kind`` (what it holds: ``attention``, ``mamba``, ``mlp``, ``moe``, combined ``mamba+mlp``, or
``layer`` for the layers of a uniform stack) and a ``part`` (what removing it deletes: ``layer``, ``attn``,
``mlp``). The family tables live in :mod:`cbo.model.families`.

Example:
    >>> blocks = find_blocks(model)                          # doctest: +SKIP
    >>> [(b.name, b.n_params) for b in blocks][:2]           # doctest: +SKIP
    [('layers.0', 3540096), ('layers.1', 3540096)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cbo.checks import is_int
from cbo.errors import InfeasibleError, ModelError
from cbo.extras import require
from cbo.model.families import ARCHITECTURES, SUPPORTED, ArchSpec, blocks_of_kind, combined_kind, module_kind

torch = require("torch", "model blocks")
nn = torch.nn

GRANULARITIES = ("layer", "sublayer")
PARTS = ("attn", "mlp")


@dataclass(frozen=True)
class Block:
    """One removable residual branch of a model."""

    index: int  # position in the list returned by find_blocks
    name: str  # "layers.3" (layer) or "layers.3.attn" / "layers.3.mamba" / "layers.3.mlp" / "layers.3.moe"
    kind: str  # "layer", or what the block holds: "attention" | "mamba" | "mlp" | "moe" | combined "mamba+moe"
    layer: int  # decoder-layer index
    module: Any  # layer: the decoder layer; sublayer: the module whose output is the branch
    n_params: int  # parameters deleted when the block is removed
    path: str = ""  # dotted path of `module` inside the model
    part: str = ""  # what removing it deletes: "layer" (the decoder layer), "attn" (the mixer half), "mlp"
    modules: tuple = ()  # every module whose output is part of the branch (a Falcon-H1 mixer: Mamba and attention)

    def __post_init__(self) -> None:
        if not self.part:  # blocks built by hand: the kind says the part, as before hybrid kinds
            object.__setattr__(self, "part", {"attention": "attn", "mlp": "mlp"}.get(self.kind, "layer"))
        if not self.modules:
            object.__setattr__(self, "modules", (self.module,))


def _get(root: Any, dotted: str) -> Any:
    obj = root
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _n_params(*modules: Any) -> int:
    seen: set[int] = set()
    total = 0
    for m in modules:
        if m is None:
            continue
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total


def _model_type(model: Any) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", "") or ""


def _spec(model: Any) -> ArchSpec | None:
    spec = ARCHITECTURES.get(_model_type(model))
    if spec is not None and isinstance(_get(model, spec.layers), nn.ModuleList):
        return spec
    return None


def _largest_block_list(model: Any) -> tuple[nn.ModuleList, str] | None:
    """The largest ModuleList of identical-class modules that hold parameters (the generic fallback)."""
    best: tuple[int, nn.ModuleList, str] | None = None
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        classes = {type(child) for child in module}
        if len(classes) != 1 or _n_params(module) == 0:
            continue
        # a decoder layer holds submodules; a list of bare Linear layers is not a residual block list
        if not any(True for _ in module[0].children()):
            continue
        score = _n_params(module)
        if best is None or score > best[0]:
            best = (score, module, path)
    return None if best is None else (best[1], best[2])


def decoder_layers(model: Any) -> tuple[nn.ModuleList, str]:
    """The ModuleList of decoder layers and its dotted path (e.g. ``"model.layers"``).

    Raises:
        ModelError: no list of repeated residual blocks exists in the model.
    """
    spec = _spec(model)
    if spec is not None:
        return _get(model, spec.layers), spec.layers
    found = _largest_block_list(model) if isinstance(model, nn.Module) else None
    if found is None:
        raise ModelError(
            f"cannot find the decoder layers of {type(model).__name__} (model_type={_model_type(model)!r}): "
            f"no nn.ModuleList of repeated blocks. Supported architectures: {', '.join(SUPPORTED)}, "
            "or any model whose decoder layers are one nn.ModuleList of identical modules."
        )
    return found


def _first_attr(layer: Any, names: tuple[str, ...]) -> tuple[str, Any] | tuple[None, None]:
    for n in names:
        m = getattr(layer, n, None)
        if isinstance(m, nn.Module):
            return n, m
    return None, None


def _layer_spec(model: Any, layer: Any) -> ArchSpec:
    spec = _spec(model)
    if spec is not None:
        return spec
    # generic fallback: guess the halves from common attribute names
    attn_name, _ = _first_attr(layer, ("self_attn", "attn", "attention", "self_attention", "mixer"))
    mlp_name, _ = _first_attr(layer, ("mlp", "feed_forward", "ffn", "block_sparse_moe"))
    if attn_name is None or mlp_name is None:
        names = [n for n, _ in layer.named_children()]
        raise ModelError(
            f"cannot split the layer {type(layer).__name__} of {type(model).__name__} into attention and MLP "
            f"halves (children: {names}). Use granularity='layer', or one of: {', '.join(SUPPORTED)}."
        )
    if isinstance(getattr(layer, "post_feedforward_layernorm", None), nn.Module):
        return ArchSpec("", attn_name, mlp_name, "post_attention_layernorm", "post_feedforward_layernorm", (), ())
    return ArchSpec("", attn_name, mlp_name)


def _half(layer: Any, spec: ArchSpec, part: str) -> dict[str, Any]:
    """The modules of one half present in ``layer``, their branch modules, dead norms and kind."""
    names = tuple(n for n in spec.names(part) if isinstance(getattr(layer, n, None), nn.Module))
    modules = tuple(getattr(layer, n) for n in names)
    branch_name = spec.attn_branch if part == "attn" else spec.mlp_branch
    branch_names = (branch_name,) if branch_name else names
    branches = tuple(getattr(layer, n) for n in branch_names)
    default = "attention" if part == "attn" else "mlp"
    kinds = {module_kind(m, default) for m in modules}
    if "moe" in kinds:  # a shared expert beside the routed ones is part of the mixture
        kinds.discard("mlp")
    norms = spec.attn_norms if part == "attn" else spec.mlp_norms
    return {
        part: modules[0] if modules else None,
        f"{part}_branch": branches[0] if branches else None,
        f"{part}_name": names[0] if names else None,
        f"{part}_branch_name": branch_names[0] if branch_names else None,
        f"{part}_names": names,
        f"{part}_modules": modules,
        f"{part}_branch_names": branch_names,
        f"{part}_branches": branches,
        f"{part}_norms": tuple(n for n in norms if isinstance(getattr(layer, n, None), nn.Module)),
        f"{part}_kind": combined_kind(sorted(kinds)) if kinds else "",
    }


def layer_parts(layer: Any, model: Any | None = None) -> dict[str, Any]:
    """The token-mixer ("attn") and channel-mixer ("mlp") halves of a decoder layer.

    Returns a dict with ``attn``, ``mlp`` (the first module of each half; ``mlp`` is None in a single-branch layer
    such as Nemotron-H's), ``attn_branch``, ``mlp_branch`` (the modules whose outputs are the residual-branch
    contributions), their attribute names (``attn_name``, ``mlp_name``, ``attn_branch_name``, ``mlp_branch_name``),
    ``attn_norms`` / ``mlp_norms`` (attribute names of the norms used only by that half), ``attn_kind`` /
    ``mlp_kind`` (``"attention"``, ``"mamba"``, ``"mlp"``, ``"moe"``, or combined), and the tuples ``attn_names``,
    ``attn_modules``, ``attn_branch_names``, ``attn_branches`` (likewise for ``mlp``) of a half made of parallel
    branches (Falcon-H1's Mamba and attention). Pass ``model`` to use its architecture table instead of name
    guessing.
    """
    spec = _layer_spec(model, layer) if model is not None else None
    if spec is None:
        for candidate in dict.fromkeys(ARCHITECTURES.values()):
            present = [
                any(isinstance(getattr(layer, n, None), nn.Module) for n in names) or not names
                for names in (candidate.names("attn"), candidate.names("mlp"))
            ]
            if all(present):
                gemma_like = isinstance(getattr(layer, "post_feedforward_layernorm", None), nn.Module)
                if gemma_like == (candidate.mlp_branch == "post_feedforward_layernorm"):
                    spec = candidate
                    break
        if spec is None:
            spec = _layer_spec(object(), layer)
    out = {**_half(layer, spec, "attn"), **_half(layer, spec, "mlp")}
    if out["attn"] is None:
        names = [n for n, _ in layer.named_children()]
        raise ModelError(f"the layer {type(layer).__name__} has none of the mixers {spec.names('attn')} ({names}).")
    return out


SUFFIX = {"attention": "attn", "mamba": "mamba", "mlp": "mlp", "moe": "moe"}


def find_blocks(model: Any, granularity: str = "layer") -> list[Block]:
    """The removable blocks of ``model`` in forward order.

    Kinds: ``"layer"`` for the layers of a uniform stack; the kind of what a block holds otherwise
    (``attention``, ``mamba``, ``mlp``, ``moe``, or combined such as ``"mamba+mlp"`` for a hybrid layer). Sublayer
    names say the kind: ``layers.3.attn``, ``layers.3.mamba``, ``layers.3.mlp``, ``layers.3.moe``.

    Args:
        model: a Hugging Face causal LM of a known family (:data:`cbo.model.families.ARCHITECTURES`: Llama, Mistral,
            Qwen2/3, Gemma 1/2/3, Phi-3, OLMo 2, GPT-2, GPT-NeoX, the MoE and the hybrid families) or any model
            whose decoder layers are one ``nn.ModuleList`` of identical residual blocks.
        granularity: ``"layer"`` (one block per decoder layer) or ``"sublayer"`` (the mixer and the MLP half of
            each layer, ordered ``layers.0.attn, layers.0.mlp, layers.1.attn, ...``; a single-branch layer, such as
            Nemotron-H's, is one block either way).

    Example:
        >>> names = [b.name for b in find_blocks(model, "sublayer")]   # doctest: +SKIP
    """
    if granularity not in GRANULARITIES:
        raise ModelError(f"unknown granularity {granularity!r}; use one of {GRANULARITIES}")
    layers, path = decoder_layers(model)
    spec = _spec(model)
    hybrid = spec is not None and spec.hybrid
    blocks: list[Block] = []
    for i, layer in enumerate(layers):
        parts = layer_parts(layer, model) if hybrid or granularity == "sublayer" else None
        single = parts is not None and parts["mlp"] is None
        if granularity == "layer" or single:
            kind = "layer"
            if parts is not None:
                kind = combined_kind([k for k in (parts["attn_kind"], parts["mlp_kind"]) if k])
            blocks.append(
                Block(len(blocks), f"layers.{i}", kind, i, layer, _n_params(layer), f"{path}.{i}", part="layer")
            )
            continue
        for part in ("attn", "mlp"):
            dead = [*parts[f"{part}_modules"]] + [getattr(layer, n) for n in parts[f"{part}_norms"]]
            kind = parts[f"{part}_kind"]
            suffix = SUFFIX.get(kind, "mixer" if part == "attn" else "ffn")
            branch_name = parts[f"{part}_branch_name"]
            blocks.append(
                Block(
                    len(blocks),
                    f"layers.{i}.{suffix}",
                    kind,
                    i,
                    parts[f"{part}_branch"],
                    _n_params(*dead),
                    f"{path}.{i}.{branch_name}",
                    part=part,
                    modules=parts[f"{part}_branches"],
                )
            )
    return blocks


def prunable_parameters(model: Any) -> int:
    """Parameters of the decoder layers: what depth and width pruning can remove (embeddings, the head and the
    final norm stay). The denominator of a pruning ratio ``of="blocks"``."""
    return sum(b.n_params for b in find_blocks(model, "layer"))


def resolve_keep(keep: Any, blocks: Any) -> list[int]:
    """Sorted indices into ``blocks`` of the blocks never removed.

    Args:
        keep: None, one block or a list of them, each an index, a name (``"layers.0"``; digit strings count as
            indices, as the command line gives them), or a kind (``"mamba"``: every block of that kind, or holding
            it, as ``"mamba+mlp"`` does).
        blocks: the block list (:func:`find_blocks`).

    Raises:
        InfeasibleError: a name that is no block's, or an index out of range.

    Example:
        >>> resolve_keep([0, "layers.29"], find_blocks(model))          # doctest: +SKIP
        [0, 29]
    """
    if keep is None:
        return []
    names = [b.name for b in blocks]
    out = []
    for k in [keep] if isinstance(keep, (int, str)) else keep:
        if isinstance(k, str) and not k.strip().lstrip("-").isdigit():
            of_kind = blocks_of_kind(k, [b.kind for b in blocks]) if k not in names else []
            if k not in names and not of_kind:
                kinds = sorted({b.kind for b in blocks})
                raise InfeasibleError(
                    f"keep names unknown block or kind {k!r}; blocks are {names[0]}..{names[-1]}, kinds {kinds}."
                )
            out += of_kind or [names.index(k)]
            continue
        if not isinstance(k, str) and not is_int(k):
            raise InfeasibleError(f"keep lists blocks by index or name, got {k!r} of type {type(k).__name__}.")
        i = int(k)
        if not 0 <= i < len(blocks):
            raise InfeasibleError(f"keep index {i} is out of range; valid: 0..{len(blocks) - 1}.")
        out.append(i)
    return sorted(set(out))


def block_names(model: Any, granularity: str = "layer") -> list[str]:
    """Names of the blocks, as used for QUBO variables."""
    return [b.name for b in find_blocks(model, granularity)]


def branch_tensor(output: Any) -> Any:
    """The hidden-state tensor inside a module output (a tensor, or a tuple whose first element it is)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise ModelError(f"cannot find the hidden states in a module output of type {type(output).__name__}")


def with_branch_tensor(output: Any, tensor: Any) -> Any:
    """``output`` with its hidden-state tensor replaced by ``tensor`` (same container type)."""
    if isinstance(output, torch.Tensor):
        return tensor
    if isinstance(output, tuple):
        return (tensor, *output[1:])
    if isinstance(output, list):
        return [tensor, *output[1:]]
    raise ModelError(f"cannot replace the hidden states in a module output of type {type(output).__name__}")
