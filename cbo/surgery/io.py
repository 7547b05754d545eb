"""The one save route and the one load route of every pruned model: removed layers, zeroed sublayers, widths.

:func:`save_pruned` writes an ordinary Hugging Face folder (``save_pretrained``: safetensors + config.json).
The config records what surgery did: ``cbo_removed_layers`` / ``cbo_original_layers`` /
``cbo_zeroed_sublayers`` (depth, see :mod:`cbo.surgery.depth`) and ``cbo_layer_widths``, one
``{"heads", "kv_heads", "head_dim", "intermediate"}`` per current layer (width). :func:`load_pruned`
rebuilds the modules with those shapes before the weights are loaded, so the logits are identical.

Loading routes:

* ``cbo.load_pruned(path)`` — always works (removed layers, zeroed sublayers, widths, any mix).
* Plain transformers, layer removal and zeroed sublayers: ``AutoModelForCausalLM.from_pretrained(path)``. A zeroed
  half is saved as zeros of all its weights (:func:`zeroed_half_weights`): plain transformers rebuilds the half,
  silently, and its output is exactly zero, so the logits equal the pruned model's; ``load_pruned`` replaces the
  half by a zero module again. ``save_pruned(..., plain_weights="outputs")`` saves the output projections only.
* Plain transformers, per-layer widths: ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``.
  The folder carries ``modeling_cbo_pruned.py`` (registered in ``auto_map``), a self-contained file (torch and
  transformers only, no ``cbo``) that subclasses the model's own class and reshapes its modules on construction
  from ``config.cbo_remote_layout`` (:func:`remote_layout`: stand-ins, parameter shapes, attributes), so the
  folder can be shared or pushed to a hub. Stock transformers configs have one head count and one MLP width for
  all layers, so no route without extra code exists for models whose layers differ.

Example:
    >>> save_pruned(pruned, "out/pruned", tokenizer)     # doctest: +SKIP
    >>> same = load_pruned("out/pruned")                 # doctest: +SKIP
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

from cbo.checks import is_int
from cbo.errors import CorruptFileError, InvalidOptionError, ModelError
from cbo.extras import require
from cbo.files import PRUNED_FORMAT_KEY
from cbo.surgery.depth import ORIGINAL_KEY, REMOVED_KEY, ZEROED_KEY, restore_zeroed_sublayers, text_config_of
from cbo.surgery.record import CONFIG_CHECKSUM_KEY, check_record_checksum, record_checksum

WIDTHS_KEY = "cbo_layer_widths"
FORMAT_KEY = PRUNED_FORMAT_KEY
FORMAT_VERSION = 1
REMOTE_FILE = "modeling_cbo_pruned.py"
REMOTE_CLASS = "CBOPrunedForCausalLM"

LAYOUT_KEY = "cbo_remote_layout"

# The file written beside the weights of a model whose layers differ in width. It imports only torch and
# transformers: everything it needs (which modules are zero stand-ins, the shapes of the sliced parameters and the
# attributes their forward reads) is in config.json under LAYOUT_KEY, so the folder loads wherever transformers does.
REMOTE_TEMPLATE = '''"""A model pruned by CBO (per-layer head counts / MLP widths), loadable with plain transformers.

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

Self-contained (torch and transformers only): the class is the architecture's own, whose modules are reshaped on
construction from config.{layout_key} (zero stand-ins for removed halves, the shapes of sliced parameters, the
attributes their forward reads), before the weights load.
"""

import torch
from {module} import {base} as _Base


def _find_cache(kwargs):
    for key in ("cache", "past_key_values", "past_key_value", "layer_past"):
        cache = kwargs.get(key)
        if cache is not None:
            return getattr(cache, "self_attention_cache", cache)
    return None


class ZeroAttention(torch.nn.Module):
    """A removed attention half: zeros, and one tiny cache entry per token so the cache length stays right."""

    def __init__(self, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx

    def forward(self, hidden_states=None, *args, **kwargs):
        if hidden_states is None:
            hidden_states = args[0]
        cache = _find_cache(kwargs)
        if cache is not None and hasattr(cache, "update"):
            stub = hidden_states.new_zeros((hidden_states.shape[0], 1, hidden_states.shape[1], 1))
            cache.update(stub, stub, self.layer_idx)
        return torch.zeros_like(hidden_states), None


class ZeroMLP(torch.nn.Module):
    """A removed MLP half: zeros of the input's shape."""

    def forward(self, hidden_states=None, *args, **kwargs):
        return torch.zeros_like(args[0] if hidden_states is None else hidden_states)


def _stand_in(spec):
    if spec["kind"] == "zero_attention":
        return ZeroAttention(spec["layer_idx"])
    if spec["kind"] == "zero_mlp":
        return ZeroMLP()
    return torch.nn.Identity()


def reshape(model, layout):
    """Swap in the stand-ins, give sliced parameters their saved shapes and set the attributes forward reads."""
    for path, spec in layout.get("swaps", {{}}).items():
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, _stand_in(spec))
    for path, shape in layout.get("shapes", {{}}).items():
        parent, _, name = path.rpartition(".")
        module = model.get_submodule(parent)
        old = getattr(module, name)
        new = torch.empty(tuple(shape), dtype=old.dtype, device=old.device)
        setattr(module, name, torch.nn.Parameter(new, requires_grad=old.requires_grad))
    for path, values in layout.get("attrs", {{}}).items():
        module = model.get_submodule(path)
        for key, value in values.items():
            setattr(module, key, value)


class {base}(_Base):
    """{base} with CBO's per-layer widths (same name: transformers keys checkpoint renamings by class name)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        reshape(self, getattr(config, "{layout_key}", None) or {{}})

    @classmethod
    def is_custom_code(cls):
        # loaded through trust_remote_code, transformers would otherwise skip the base's key renamings
        return _Base.is_custom_code()


{cls} = {base}
'''


def stand_in_spec(module: Any) -> dict[str, Any] | None:
    """What the remote file builds in place of a zero stand-in or a dropped norm (None: not a stand-in)."""
    from cbo.surgery.depth import ZeroAttention, ZeroMLP

    torch = require("torch", "saving a pruned model")
    if isinstance(module, ZeroAttention):
        return {"kind": "zero_attention", "layer_idx": int(module.layer_idx)}
    if isinstance(module, ZeroMLP):
        return {"kind": "zero_mlp"}
    if isinstance(module, torch.nn.Identity):
        return {"kind": "identity"}
    return None


def remote_layout(model: Any) -> dict[str, Any]:
    """How ``model`` differs from the stock model its config builds: ``{"swaps", "shapes", "attrs"}``.

    The stock model is built on the meta device (no memory, no initialization); the differences are the modules
    replaced by stand-ins, the parameters whose shapes changed, and the integer attributes (head counts, widths,
    ``in_features``...) that changed, keyed by their dotted paths.

    Raises:
        ModelError: a module was replaced by something the self-contained file cannot build.
    """
    torch = require("torch", "saving a pruned model")
    with torch.device("meta"):
        stock = _causal_lm_class(model.config)(copy.deepcopy(model.config))
    stock_modules = dict(stock.named_modules())
    swaps: dict[str, Any] = {}
    shapes: dict[str, list[int]] = {}
    attrs: dict[str, dict[str, int]] = {}
    for path, module in model.named_modules():
        if any(path.startswith(f"{s}.") for s in swaps):
            continue
        ref = stock_modules.get(path)
        if ref is None:
            raise ModelError(f"module {path!r} of the pruned model has no counterpart in its architecture")
        if type(ref) is not type(module) and not isinstance(module, type(ref)):
            spec = stand_in_spec(module)
            if spec is None:
                raise ModelError(
                    f"module {path!r} is a {type(module).__name__} where the architecture has a "
                    f"{type(ref).__name__}; a self-contained loader cannot rebuild it"
                )
            swaps[path] = spec
            continue
        for name, param in module.named_parameters(recurse=False):
            stock_param = getattr(ref, name, None)
            if stock_param is None or tuple(stock_param.shape) != tuple(param.shape):
                shapes[f"{path}.{name}" if path else name] = list(param.shape)
        changed = {
            k: v for k, v in vars(module).items() if is_int(v) and not k.startswith("_") and vars(ref).get(k) != v
        }
        if changed:
            attrs[path] = changed
    return {"swaps": swaps, "shapes": shapes, "attrs": attrs}


def write_remote_code(model: Any, path: Path, data: dict[str, Any]) -> None:
    """Write the self-contained loader beside the weights and point ``auto_map`` (in ``data``) at it."""
    base = _causal_lm_class(model.config)
    data[LAYOUT_KEY] = remote_layout(model)
    (path / REMOTE_FILE).write_text(
        REMOTE_TEMPLATE.format(module=base.__module__, base=base.__name__, cls=REMOTE_CLASS, layout_key=LAYOUT_KEY)
    )
    data["auto_map"] = {"AutoModelForCausalLM": f"{REMOTE_FILE[:-3]}.{REMOTE_CLASS}"}


def recorded_widths(config: Any) -> list[dict[str, int]] | None:
    """The per-layer widths a pruned model's config records (None if it records none)."""
    for c in (config, text_config_of(config)):
        widths = getattr(c, WIDTHS_KEY, None)
        if widths:
            return [dict(w) for w in widths]
    return None


def _uniform_with_config(widths: list[dict[str, int]], config: Any) -> bool:
    """True when every layer has the widths the stock config describes (no reshaping needed)."""
    c = text_config_of(config)
    heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", None)
    kv = getattr(c, "num_key_value_heads", None) or heads
    inter = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None)
    if inter is None and getattr(c, "model_type", "") == "gpt2":
        inter = 4 * c.n_embd
    for w in widths:
        if w.get("heads") and (w["heads"], w["kv_heads"]) != (heads, kv):
            return False
        if w.get("intermediate") and w["intermediate"] != inter:
            return False
    return True


def apply_recorded(model: Any) -> Any:
    """Rebuild what the config records: zeroed sublayers (zero modules) and per-layer widths (resized layers)."""
    from cbo.surgery.width import resize_to

    restore_zeroed_sublayers(model)
    widths = recorded_widths(model.config)
    if widths:
        resize_to(model, widths)
    return model


def pruned_model_class(base: type) -> type:
    """A subclass of a transformers model class that reshapes its layers to the recorded widths on init.

    It keeps the base class's name, so that name-keyed behaviour of transformers (checkpoint key renaming,
    e.g. GPT-NeoX ``embed_out`` -> ``lm_head``) applies unchanged.
    """

    def __init__(self, config, *args, **kwargs):
        base.__init__(self, config, *args, **kwargs)
        apply_recorded(self)

    def is_custom_code(cls) -> bool:
        # loaded through trust_remote_code, transformers would otherwise skip the base's key renamings
        return base.is_custom_code()

    # same name as the base: transformers looks up checkpoint key renamings by class name
    attrs = {
        "__init__": __init__,
        "__module__": base.__module__,
        "is_custom_code": classmethod(is_custom_code),
        "_cbo_pruned": True,
    }
    return type(base.__name__, (base,), attrs)


def _causal_lm_class(config: Any) -> type:
    transformers = require("transformers", "loading a pruned model")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError as exc:
        arch = (getattr(config, "architectures", None) or [None])[0]
        cls = getattr(transformers, arch, None) if arch else None
        if cls is None:
            raise ModelError(
                f"no causal-LM class is known for model_type {getattr(config, 'model_type', '?')!r}"
            ) from exc
        return cls


def save_pruned(
    model: Any,
    path: str | os.PathLike,
    tokenizer: Any = None,
    *,
    plain_weights: str = "all",
    progress: bool = True,
    **kwargs: Any,
) -> Path:
    """Save a model pruned by depth and/or width so that :func:`load_pruned` rebuilds it exactly.

    The folder is written through a staging folder beside it (:func:`cbo.files.output_folder`): files of other
    names already in ``path`` are kept, and an interrupted save leaves ``path`` as it was.

    Args:
        model: a (pruned) Hugging Face causal LM.
        path: output folder (created).
        tokenizer: saved alongside when given.
        plain_weights: for zeroed halves, ``"all"`` (default) saves all their weights as zeros so that plain
            ``from_pretrained`` loads the folder silently (disk: the zeroed halves keep their original size);
            ``"outputs"`` saves only their output projections (smaller; plain transformers warns of the missing
            weights, the logits are the same). See :func:`zeroed_half_weights`.
        progress: transformers' "Writing model shards" bar (False: none, as the CLI's ``-q``).
        **kwargs: passed to ``save_pretrained``.

    Returns:
        The folder.
    """
    from cbo.files import output_folder
    from cbo.model.hf_output import quiet_loading

    with output_folder(path) as staging, quiet_loading(not progress):
        write_pruned_folder(model, staging, tokenizer, plain_weights=plain_weights, **kwargs)
    return Path(path).expanduser()


PLAIN_WEIGHTS = ("all", "outputs")


def zeroed_half_weights(model: Any, plain_weights: str = "all") -> dict[str, Any]:
    """Zero tensors for the weights of every zeroed half, by the state-dict names the unpruned architecture gives
    them, so that plain ``AutoModelForCausalLM.from_pretrained`` computes what the pruned model computes.

    Plain transformers rebuilds a zeroed half as the original module, because no family's config can say that a
    layer has no attention, Mamba mixer or MLP. With ``plain_weights="all"`` every weight of the half (and of the
    norms only it used) is saved as zeros: the plain load is silent, and the half outputs exactly zero (its output
    projection is zero). The cost: the zeroed halves take their original size on disk. ``"outputs"`` saves only
    the output projections (``o_proj``, ``down_proj``, ...): a smaller folder, the same logits, but transformers
    warns that the other weights are missing and initialises them at random. Empty when no half is zeroed or the
    layers are reshaped (that folder loads through the remote-code class, which zeroes the halves itself).
    """
    from cbo.model.blocks import decoder_layers, layer_parts
    from cbo.model.structures import attention_structure, mlp_structure

    if plain_weights not in PLAIN_WEIGHTS:
        raise ModelError(f"plain_weights must be one of {PLAIN_WEIGHTS}, got {plain_weights!r}.")
    zeroed = getattr(text_config_of(model.config), ZEROED_KEY, None) or []
    widths = recorded_widths(model.config)
    if not zeroed or (widths and not _uniform_with_config(widths, model.config)):
        return {}
    torch = require("torch", "saving a pruned model")
    config = copy.deepcopy(model.config)
    with torch.device("meta"):
        reference = type(model)(config)  # the unpruned layout of the current layers, without memory
    layers, layers_path = decoder_layers(reference)
    dtype = next(model.parameters()).dtype
    out: dict[str, Any] = {}
    for layer, part in zeroed:
        layer_module = layers[int(layer)]
        parts = layer_parts(layer_module, reference)
        if not parts[f"{part}_modules"]:  # the "MLP half" of a single-branch layer: nothing there
            continue
        modules = dict(zip(parts[f"{part}_names"], parts[f"{part}_modules"]))
        if plain_weights == "all":
            modules.update({norm: getattr(layer_module, norm) for norm in parts[f"{part}_norms"]})
        else:
            name, half = parts[f"{part}_name"], parts[part]
            try:
                if part == "attn":
                    structure = attention_structure(int(layer), half, reference, prefix=name)
                else:
                    structure = mlp_structure(int(layer), half, prefix=name)
                slot = structure.output_projection()
                modules = {slot.name.rsplit(".", 1)[0]: slot.module}
            except ModelError:  # a layout without a known output projection: all its weights zero give zero too
                pass
        for module_name, module in modules.items():
            prefix = f"{layers_path}.{int(layer)}.{module_name}"
            for key, tensor in module.state_dict().items():
                out[f"{prefix}.{key}"] = torch.zeros(
                    tensor.shape, dtype=dtype if tensor.is_floating_point() else tensor.dtype
                )
    return out


def zeroed_output_projections(model: Any) -> dict[str, Any]:
    """:func:`zeroed_half_weights` with ``plain_weights="outputs"``: the zeroed halves' output projections only."""
    return zeroed_half_weights(model, "outputs")


def save_kwargs_with_zeroed_halves(model: Any, kwargs: dict[str, Any], plain_weights: str = "all") -> dict[str, Any]:
    """``save_pretrained`` keyword arguments whose state dict also holds :func:`zeroed_half_weights`."""
    zeros = zeroed_half_weights(model, plain_weights)
    if not zeros:
        return kwargs
    state = dict(kwargs.get("state_dict") or model.state_dict())
    for name, tensor in zeros.items():
        state.setdefault(name, tensor)
    return {**kwargs, "state_dict": state}


def write_pruned_folder(
    model: Any, path: str | os.PathLike, tokenizer: Any = None, *, plain_weights: str = "all", **kwargs: Any
) -> Path:
    """:func:`save_pruned`'s writing, into ``path`` itself."""
    from cbo.model.structures import layer_widths

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    try:
        widths = layer_widths(model)
    except ModelError:
        widths = None  # a layout width pruning does not handle: nothing width-pruned to record
    model.save_pretrained(path, **save_kwargs_with_zeroed_halves(model, kwargs, plain_weights))
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(path)
    config_file = path / "config.json"
    data = json.loads(config_file.read_text())
    data.pop(WIDTHS_KEY, None)
    data.pop(LAYOUT_KEY, None)
    if REMOTE_CLASS in json.dumps(data.get("auto_map", {})):
        data.pop("auto_map")  # re-saving a model loaded through the remote-code route
    (path / REMOTE_FILE).unlink(missing_ok=True)
    data[FORMAT_KEY] = FORMAT_VERSION
    if widths is not None:
        data[WIDTHS_KEY] = widths
        if not _uniform_with_config(widths, model.config):
            write_remote_code(model, path, data)
    data[CONFIG_CHECKSUM_KEY] = record_checksum(data)
    config_file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def load_pruned(path: str | os.PathLike, **kwargs: Any) -> Any:
    """Load a model saved by :func:`save_pruned` (or any pruned folder with a CBO config), in eval mode.

    Removed layers load as they are; zeroed sublayers are rebuilt as zero modules (the expected warning about
    their missing weights is silenced); per-layer widths are reshaped before the weights load, so the logits
    equal the saved model's.

    Args:
        path: the folder.
        **kwargs: passed to ``from_pretrained`` (e.g. ``dtype=torch.bfloat16``, ``device_map``).

    Raises:
        CorruptFileError: the folder has no readable config.json, its weights file is missing, truncated or
            damaged, or what its config records does not fit the model (a hand-edited config).
        InvalidOptionError: ``path`` is not a path.

    Example:
        >>> model = load_pruned("out/pruned")     # doctest: +SKIP
    """
    from cbo.model.weight_files import check_weight_files

    transformers = require("transformers", "loading a pruned model")
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidOptionError(
            f"load_pruned needs the path of a saved model folder (a str or Path), got {type(path).__name__} "
            f"{str(path)[:60]}."
        )
    path = Path(path)
    if not (path / "config.json").is_file():
        raise CorruptFileError(f"{str(path)!r} is not a saved model folder (no config.json)")
    try:
        config = transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise CorruptFileError(f"cannot read the config in {str(path)!r}: {exc}") from exc
    check_recorded_layout(config, path)
    check_weight_files(path)
    widths = recorded_widths(config)
    reshaped = bool(widths) and not _uniform_with_config(widths, config)
    cls = pruned_model_class(_causal_lm_class(config)) if reshaped else transformers.AutoModelForCausalLM
    zeroed = getattr(config, ZEROED_KEY, None) or getattr(text_config_of(config), ZEROED_KEY, None)
    logging = transformers.utils.logging
    level = logging.get_verbosity()
    if zeroed:  # from_pretrained rebuilds the removed halves and warns that their weights are missing
        logging.set_verbosity_error()
    try:
        model, info = cls.from_pretrained(path, config=config, output_loading_info=True, **kwargs)
    except (ModelError, RuntimeError) as exc:
        raise CorruptFileError(f"the weights in {str(path)!r} do not match its recorded layer widths: {exc}") from exc
    finally:
        logging.set_verbosity(level)
    check_loaded_weights(info, zeroed or [], path)
    check_record_checksum(path)
    if hasattr(model.config, CONFIG_CHECKSUM_KEY):  # a later plain save_pretrained of a changed model must not carry it
        delattr(model.config, CONFIG_CHECKSUM_KEY)
    if not reshaped:
        restore_zeroed_sublayers(model)
    return model.eval()


def _index_list(value: Any, field: str, where: str) -> list[int]:
    if not isinstance(value, (list, tuple)) or not all(is_int(i) for i in value):
        raise CorruptFileError(f"{where}: {field} must be a list of layer indices, not {str(value)[:80]}.")
    if len(set(value)) != len(value) or any(i < 0 for i in value):
        raise CorruptFileError(f"{where}: {field} {list(value)} repeats an index or holds a negative one.")
    return list(value)


def check_recorded_layout(config: Any, path: str | os.PathLike) -> None:
    """CorruptFileError, naming the field, unless what a pruned folder's config records about surgery agrees with
    itself: the original index of each current layer (one per layer, increasing), the removed layers (disjoint from
    them, together every layer of the original model once), the zeroed halves and the per-layer widths (current
    layers only). A hand-edited config would otherwise load and report a wrong removed set."""
    c = text_config_of(config)
    where = f"the config in {str(path)!r} was edited or is damaged"
    n = getattr(c, "num_hidden_layers", None)
    if not is_int(n) or n < 0:
        raise CorruptFileError(f"{where}: num_hidden_layers is {n!r}, not a layer count.")
    original = getattr(c, ORIGINAL_KEY, None)
    removed = getattr(c, REMOVED_KEY, None)
    if original is not None:
        original = _index_list(original, ORIGINAL_KEY, where)
        if len(original) != n:
            raise CorruptFileError(
                f"{where}: {ORIGINAL_KEY} lists {len(original)} layers but num_hidden_layers is {n}."
            )
        if original != sorted(original):
            raise CorruptFileError(f"{where}: {ORIGINAL_KEY} {original} is not increasing.")
    if removed is not None:
        removed = _index_list(removed, REMOVED_KEY, where)
        kept = original if original is not None else list(range(n))
        if set(removed) & set(kept):
            raise CorruptFileError(
                f"{where}: {REMOVED_KEY} {removed} names layers that are kept ({sorted(set(removed) & set(kept))})."
            )
        if original is not None and sorted(kept + removed) != list(range(len(kept) + len(removed))):
            raise CorruptFileError(
                f"{where}: {ORIGINAL_KEY} {kept} and {REMOVED_KEY} {removed} together are not the layers "
                f"0..{len(kept) + len(removed) - 1} of the original model, each once."
            )
    zeroed = getattr(config, ZEROED_KEY, None) or getattr(c, ZEROED_KEY, None) or []
    for entry in zeroed:
        ok = isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], int)
        if not ok or not 0 <= entry[0] < n or entry[1] not in ("attn", "mlp"):
            raise CorruptFileError(
                f"{where}: {ZEROED_KEY} entry {str(entry)[:60]} is not [layer in 0..{n - 1}, 'attn' | 'mlp']."
            )
    widths = recorded_widths(config)
    if widths and len(widths) != n:
        raise CorruptFileError(f"{where}: {WIDTHS_KEY} lists {len(widths)} layers but num_hidden_layers is {n}.")


def check_loaded_weights(info: dict[str, Any], zeroed: list[Any], path: str | os.PathLike) -> None:
    """CorruptFileError when the weights file and the config disagree (weights the config has no place for, or
    places the weights do not fill, other than in zeroed halves): an edited layer count loads otherwise
    with freshly initialised layers."""
    zeroed_layers = {int(entry[0]) for entry in zeroed}

    def layer_of(key: str) -> int | None:  # the first number in a weight's path is its decoder layer
        match = re.search(r"\.(\d+)\.", key)
        return int(match.group(1)) if match else None

    def other(keys: Any) -> list[str]:  # a zeroed half's inputs are missing and its zero output may be unused
        return sorted(k for k in keys or [] if layer_of(k) not in zeroed_layers)

    missing, unexpected = other(info.get("missing_keys")), other(info.get("unexpected_keys"))
    if missing or unexpected:
        raise CorruptFileError(
            f"the weights in {str(path)!r} do not fit its config.json (edited, e.g. num_hidden_layers): "
            f"{len(missing)} weights missing (e.g. {missing[:2]}), {len(unexpected)} not used (e.g. {unexpected[:2]})."
        )


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer saved beside a model (None when the folder has none)."""
    transformers = require("transformers", "loading a tokenizer")
    try:
        return transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return None
