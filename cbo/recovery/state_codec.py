"""Training state as data: nested dicts, lists, numbers, strings and tensors to bytes and back, without pickle.

The tensors go into a safetensors file; everything else is a JSON tree in its header metadata, where each tensor
is a reference ``{"$tensor": "t3"}``. Decoding parses JSON and raw tensor bytes only, so a file someone handed
over (a heal checkpoint in a shared ``--out`` folder) can be damaged or crafted, but loading it never runs code.

Example:
    >>> data = encode_state({"step": 3, "w": torch.ones(2)})            # doctest: +SKIP
    >>> decode_state(data)["step"]                                       # doctest: +SKIP
    3
"""

from __future__ import annotations

import json
from typing import Any

from cbo.extras import require

torch = require("torch", "recovery fine-tuning")
META_KEY = "cbo_state"  # the safetensors metadata entry that holds the JSON tree
MAX_HEADER = 100 * 2**20  # a safetensors header longer than this is not one CBO wrote


class StateFormatError(ValueError):
    """The bytes are not a state :func:`encode_state` wrote (callers turn it into CorruptFileError)."""


def encode_state(state: dict[str, Any]) -> bytes:
    """``state`` as safetensors bytes (tensors) with the rest as JSON metadata; tuples and non-string keys kept.

    Raises:
        TypeError: a value that is none of dict, list, tuple, str, int, float, bool, None or a tensor.
    """
    safetensors_torch = require("safetensors.torch", "heal checkpoints")
    tensors: dict[str, Any] = {}

    def enc(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = f"t{len(tensors)}"
            tensors[key] = value.detach().cpu().contiguous()
            return {"$tensor": key}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in value):
                return {k: enc(v) for k, v in value.items()}
            return {"$dict": [[enc(k), enc(v)] for k, v in value.items()]}
        if isinstance(value, tuple):
            return {"$tuple": [enc(v) for v in value]}
        if isinstance(value, list):
            return [enc(v) for v in value]
        if value is None or isinstance(value, (str, bool, int, float)):
            return value
        raise TypeError(f"cannot store a {type(value).__name__} in a training state file")

    tree = enc(state)
    return safetensors_torch.save(tensors, metadata={META_KEY: json.dumps(tree)})


def decode_state(data: bytes) -> dict[str, Any]:
    """The state :func:`encode_state` wrote into ``data``; parsing only, no code runs.

    Raises:
        StateFormatError: truncated, damaged or foreign bytes.
    """
    safetensors_torch = require("safetensors.torch", "heal checkpoints")
    if len(data) < 8:
        raise StateFormatError(f"{len(data)} bytes is too short for a safetensors file")
    size = int.from_bytes(data[:8], "little")
    if size > min(MAX_HEADER, len(data) - 8):
        raise StateFormatError("its header length is larger than the file (truncated, or not a safetensors file)")
    try:
        header = json.loads(data[8 : 8 + size].decode("utf-8"))
        tree = json.loads(header["__metadata__"][META_KEY])
        tensors = safetensors_torch.load(data)
    except Exception as exc:  # JSON, UTF-8, missing keys, safetensors' own errors: all mean "not this format"
        raise StateFormatError(f"not a CBO state file ({type(exc).__name__}: {exc})") from exc

    def dec(value: Any) -> Any:
        if isinstance(value, list):
            return [dec(v) for v in value]
        if not isinstance(value, dict):
            return value
        if set(value) == {"$tensor"}:
            if value["$tensor"] not in tensors:
                raise StateFormatError(f"it refers to a tensor {str(value['$tensor'])[:40]!r} it does not hold")
            return tensors[value["$tensor"]]
        if set(value) == {"$tuple"} and isinstance(value["$tuple"], list):
            return tuple(dec(v) for v in value["$tuple"])
        if set(value) == {"$dict"} and isinstance(value["$dict"], list):
            if not all(isinstance(p, list) and len(p) == 2 for p in value["$dict"]):
                raise StateFormatError("a $dict entry is not a list of [key, value] pairs")
            try:
                return {dec(k): dec(v) for k, v in value["$dict"]}
            except TypeError as exc:  # an unhashable key
                raise StateFormatError(f"a $dict key is not hashable ({exc})") from exc
        return {k: dec(v) for k, v in value.items()}

    state = dec(tree)
    if not isinstance(state, dict):
        raise StateFormatError(f"its state is a {type(state).__name__}, not a dict")
    return state
