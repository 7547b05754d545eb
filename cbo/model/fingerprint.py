"""The model fingerprint that keys every cache of measured or estimated quantities (Hessians, removal losses).

Two loads of the same weights must give the same fingerprint in any process, whatever torch's thread count,
device or the folder the model was loaded from; any change of a weight must change it. It hashes:

* the configuration without the keys that describe where the model came from or how it runs
  (``_name_or_path``, ``transformers_version``, ``use_cache``, ...), which do not change what it computes;
* per parameter: its name, shape and dtype, a strided sample of about 1024 values, and the sum modulo 2**32
  of all its raw bit patterns read as integers. That integer sum is exact and order-independent, so unlike
  a float sum (whose rounding depends on how a parallel reduction splits the tensor, so on the thread
  count: on the default model a float32 sum of one weight differs in its sixth digit between one and two
  threads) it is the same in every process, and it still changes when any single weight changes.

Weights that accelerate offloaded (the parameter is on the meta device) are read from its weight map.
"""

from __future__ import annotations

import hashlib
import json

import torch

# configuration keys that say where a model came from or how it is run, not what it computes
RUNTIME_CONFIG_KEYS = frozenset(
    {
        "transformers_version",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
    }
)
_SAMPLE = 1024
_INT_VIEW = {8: torch.int32, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def model_fingerprint(model: torch.nn.Module) -> str:
    """A cheap hash of a model's configuration and weights (16 hex digits; see the module docstring)."""
    h = hashlib.sha256()
    h.update(type(model).__name__.encode())
    h.update(config_digest(getattr(model, "config", None)).encode())
    offloaded = _offloaded_weights(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.device.type == "meta" and name in offloaded:
                p = torch.as_tensor(offloaded[name])
            flat = p.detach().reshape(-1)
            step = max(1, flat.numel() // _SAMPLE)
            h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
            h.update(flat[::step].to(torch.float32).cpu().numpy().tobytes())
            h.update(str(bit_sum(flat)).encode())
    return h.hexdigest()[:16]


def config_digest(config: object) -> str:
    """The configuration as canonical JSON, without private keys (``_name_or_path``, ...) and runtime flags."""
    if config is None:
        return ""
    try:
        data = json.loads(config.to_json_string(use_diff=False))  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return repr(config)
    kept = {k: v for k, v in data.items() if not k.startswith("_") and k not in RUNTIME_CONFIG_KEYS}
    return json.dumps(kept, sort_keys=True, default=str)


def bit_sum(flat: torch.Tensor) -> int:
    """The sum, modulo 2**32, of a tensor's raw bit patterns read as integers (32-bit words, or the element's
    own width when narrower). Integer addition modulo 2**32 is exact and associative, so the result does not
    depend on how a reduction is split (threads, devices), and changing any one word changes it."""
    flat = flat.contiguous().reshape(-1)
    ints = flat.view(_INT_VIEW.get(flat.element_size(), torch.uint8))
    return int(torch.sum(ints, dtype=torch.int32).item()) % (1 << 32)


def _offloaded_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights that accelerate offloaded (to CPU or disk; the parameter itself is on "meta"), by name."""
    out: dict[str, torch.Tensor] = {}
    for mod_name, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        for h in getattr(hook, "hooks", None) or ([hook] if hook is not None else []):
            wmap = getattr(h, "weights_map", None)
            if wmap is None:
                continue
            prefix = f"{mod_name}." if mod_name else ""
            for pname, p in module.named_parameters():
                if p.device.type == "meta" and prefix + pname not in out:
                    try:
                        out[prefix + pname] = wmap[pname]
                    except KeyError:
                        continue
    return out


def cache_mismatch(metadata: dict, names: list[str], identity: dict, key: str) -> str | None:
    """Why a cached QUBO is not the result of the run ``identity`` describes (None when it is).

    A file at a cache path claims to be the run of that key; it is trusted only when its own record agrees:
    the run key (files written since it was recorded), and the model fingerprint, data hash, estimator, loss,
    block names, options, batch size and seed.
    """
    if "cache_key" in metadata and metadata["cache_key"] != key:
        return "its run key differs"
    expected = {
        "model_fingerprint": identity["model"],
        "data_hash": identity["data"],
        "estimator": identity["estimator"],
        "loss": identity["loss"],
        "options": identity["options"],
        "batch_size": identity["batch_size"],
        "seed": identity["seed"],
    }
    if list(names) != list(identity["blocks"]):
        return f"its blocks are {_short(list(names))}, not {_short(list(identity['blocks']))}"
    for field, want in expected.items():
        have = metadata.get(field)
        if _canonical(have) != _canonical(want):
            return f"its {field} is {_short(have)}, not {_short(want)}"
    return None


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _short(value: object) -> str:
    text = _canonical(value)
    return text if len(text) <= 80 else text[:77] + "..."
