"""The one save route and the one load route of every pruned model: removed layers, zeroed sublayers, widths.

:func:`save_pruned` writes an ordinary Hugging Face folder (``save_pretrained``: safetensors + config.json).
The config records what surgery did: ``cbo_removed_layers`` / ``cbo_original_layers`` /
``cbo_zeroed_sublayers`` (depth, see :mod:`cbo.surgery.depth`) and ``cbo_layer_widths``, one
``{"heads", "kv_heads", "head_dim", "intermediate"}`` per current layer (width). :func:`load_pruned`
rebuilds the modules with those shapes before the weights are loaded, so the logits are identical.

Loading routes:

* ``cbo.load_pruned(path)`` — always works (removed layers, zeroed sublayers, widths, any mix).
* Plain transformers, layer removal only: ``AutoModelForCausalLM.from_pretrained(path)``; with zeroed sublayers
  it rebuilds the removed halves with missing weights, which ``load_pruned`` replaces by zero modules.
* Plain transformers, per-layer widths: ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``.
  The folder carries a three-line ``modeling_cbo_pruned.py`` (registered in ``auto_map``) that subclasses the
  model's own class and reshapes its layers from the config; it imports ``cbo``, so the cbo package must be
  installed where the model is loaded. Stock transformers configs have one head count and one MLP width for
  all layers, so no route without extra code exists for models whose layers differ.

Example:
    >>> save_pruned(pruned, "out/pruned", tokenizer)     # doctest: +SKIP
    >>> same = load_pruned("out/pruned")                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cbo.errors import CorruptFileError, ModelError
from cbo.extras import require
from cbo.surgery.depth import ZEROED_KEY, restore_zeroed_sublayers, text_config_of

WIDTHS_KEY = "cbo_layer_widths"
FORMAT_KEY = "cbo_pruned_format"
FORMAT_VERSION = 1
REMOTE_FILE = "modeling_cbo_pruned.py"
REMOTE_CLASS = "CBOPrunedForCausalLM"

_REMOTE_TEMPLATE = '''"""Loads a model pruned by CBO (per-layer head counts / MLP widths) with plain transformers.

Use AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True); needs the `cbo` package installed.
"""

from cbo.surgery.io import pruned_model_class
from {module} import {base} as _Base

{cls} = pruned_model_class(_Base)
'''


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


def save_pruned(model: Any, path: str | os.PathLike, tokenizer: Any = None, **kwargs: Any) -> Path:
    """Save a model pruned by depth and/or width so that :func:`load_pruned` rebuilds it exactly.

    Args:
        model: a (pruned) Hugging Face causal LM.
        path: output folder (created).
        tokenizer: saved alongside when given.
        **kwargs: passed to ``save_pretrained``.

    Returns:
        The folder.
    """
    from cbo.structures import layer_widths

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    try:
        widths = layer_widths(model)
    except ModelError:
        widths = None  # a layout width pruning does not handle: nothing width-pruned to record
    model.save_pretrained(path, **kwargs)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(path)
    config_file = path / "config.json"
    data = json.loads(config_file.read_text())
    data.pop(WIDTHS_KEY, None)
    if REMOTE_CLASS in json.dumps(data.get("auto_map", {})):
        data.pop("auto_map")  # re-saving a model loaded through the remote-code route
    (path / REMOTE_FILE).unlink(missing_ok=True)
    data[FORMAT_KEY] = FORMAT_VERSION
    if widths is not None:
        data[WIDTHS_KEY] = widths
        if not _uniform_with_config(widths, model.config):
            base = _causal_lm_class(model.config)
            (path / REMOTE_FILE).write_text(
                _REMOTE_TEMPLATE.format(module=base.__module__, base=base.__name__, cls=REMOTE_CLASS)
            )
            data["auto_map"] = {"AutoModelForCausalLM": f"{REMOTE_FILE[:-3]}.{REMOTE_CLASS}"}
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
        CorruptFileError: the folder has no readable config.json, or its recorded widths do not fit the
            model (a hand-edited config).

    Example:
        >>> model = load_pruned("out/pruned")     # doctest: +SKIP
    """
    transformers = require("transformers", "loading a pruned model")
    path = Path(path)
    if not (path / "config.json").is_file():
        raise CorruptFileError(f"{str(path)!r} is not a saved model folder (no config.json)")
    try:
        config = transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise CorruptFileError(f"cannot read the config in {str(path)!r}: {exc}") from exc
    widths = recorded_widths(config)
    reshaped = bool(widths) and not _uniform_with_config(widths, config)
    cls = pruned_model_class(_causal_lm_class(config)) if reshaped else transformers.AutoModelForCausalLM
    zeroed = getattr(config, ZEROED_KEY, None) or getattr(text_config_of(config), ZEROED_KEY, None)
    logging = transformers.utils.logging
    level = logging.get_verbosity()
    if zeroed:  # from_pretrained rebuilds the removed halves and warns that their weights are missing
        logging.set_verbosity_error()
    try:
        model = cls.from_pretrained(path, config=config, **kwargs)
    except (ModelError, RuntimeError) as exc:
        raise CorruptFileError(f"the weights in {str(path)!r} do not match its recorded layer widths: {exc}") from exc
    finally:
        logging.set_verbosity(level)
    if not reshaped:
        restore_zeroed_sublayers(model)
    return model.eval()


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer saved beside a model (None when the folder has none)."""
    transformers = require("transformers", "loading a tokenizer")
    try:
        return transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return None
