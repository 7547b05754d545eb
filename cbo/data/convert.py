"""GGUF files -> plain Hugging Face model folders (what ``cbo convert`` and the model assets of ``cbo setup`` run).

The weights are dequantized by transformers' GGUF reader into ordinary float tensors; the quantizer it may
attach is detached before ``save_pretrained`` so that the folder holds plain weights and loads with
``AutoModelForCausalLM.from_pretrained(folder)`` anywhere. The folder is written beside the target and renamed
into place at the end, so an interrupted conversion leaves nothing half-written.

Example:
    >>> convert_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2/")      # doctest: +SKIP
    PosixPath('smollm2')
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

from cbo.errors import ModelError
from cbo.extras import require
from cbo.files import CONVERTED_MANIFEST, MODEL_KIND, output_folder
from cbo.model.loading import silenced, writable_dir

GGUF_MAGIC = b"GGUF"
MANIFEST = CONVERTED_MANIFEST


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


def supported_architectures() -> list[str]:
    """GGUF architectures (``general.architecture``) that this transformers installation can convert."""
    require("gguf", "reading GGUF files")
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(GGUF_SUPPORTED_ARCHITECTURES)


def gguf_architecture(path: str | os.PathLike) -> str:
    """The ``general.architecture`` field of a GGUF file (``"llama"``, ``"gemma3"``, ...).

    Raises:
        ModelError: the file does not exist or is not a GGUF file.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelError(f"GGUF file {str(path)!r} does not exist")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise ModelError(f"{str(path)!r} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    gguf = require("gguf", "reading GGUF files")
    try:
        field = gguf.GGUFReader(str(path)).fields.get("general.architecture")
    except (ValueError, OSError, IndexError, KeyError, struct.error) as exc:
        raise ModelError(f"{str(path)!r} is a damaged GGUF file: {exc}") from exc
    if field is None:
        raise ModelError(f"{str(path)!r} has no general.architecture field; it is not a model GGUF")
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def check_gguf(path: str | os.PathLike) -> str:
    """The architecture of a GGUF file that transformers can convert; raises ModelError otherwise."""
    arch = gguf_architecture(path)
    supported = supported_architectures()
    if arch not in supported:
        raise ModelError(
            f"{str(path)!r} holds a {arch!r} model, which this transformers version cannot read from GGUF; "
            f"supported: {', '.join(supported)}. Upgrade transformers or convert the original checkpoint."
        )
    return arch


def detach_quantizer(model: Any) -> None:
    """Make a dequantized GGUF model a plain float model, so that ``save_pretrained`` writes ordinary weights.

    Raises:
        ModelError: some weights are still packed (not floating point).
    """
    bad = {p.dtype for p in model.parameters() if not p.dtype.is_floating_point}
    if bad:
        raise ModelError(f"the GGUF model still holds packed weights ({bad}); cannot convert it to a plain folder")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if getattr(model, "is_quantized", False):
        model.is_quantized = False


def is_converted(folder: str | os.PathLike) -> bool:
    """True when ``folder`` holds a finished conversion (its manifest and config are written)."""
    folder = Path(folder)
    return (folder / MANIFEST).is_file() and (folder / "config.json").is_file()


def _check_output(output: Path, overwrite: bool) -> None:
    if output.exists() and not output.is_dir():
        raise ModelError(f"output {str(output)!r} is a file; give a folder to write the model into")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise ModelError(f"output folder {str(output)!r} is not empty; choose another folder or pass overwrite=True")


def convert_gguf(
    path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    dtype: Any = None,
    overwrite: bool = False,
    progress: bool = True,
    manifest: dict | None = None,
) -> Path:
    """Convert a GGUF file into a Hugging Face folder (dequantized weights, tokenizer, config, manifest).

    Args:
        path: the ``.gguf`` file.
        output: the folder to write; it must not exist or be empty unless ``overwrite``.
        dtype: torch dtype of the saved weights (default float32).
        overwrite: replace a non-empty ``output``.
        progress: print the steps and transformers' progress bars to stderr.
        manifest: extra entries for ``cbo-manifest.json`` (what the folder was made from).

    Returns:
        The output folder.

    Raises:
        ModelError: the file is not a GGUF file, holds an architecture transformers cannot read, or the output
            is not an empty folder. Checked before any weights are read.
    """
    torch = require("torch", "converting GGUF files")
    transformers = require("transformers", "converting GGUF files")
    source = Path(path).expanduser().resolve()
    output = Path(output).expanduser().resolve()
    arch = check_gguf(source)
    _check_output(output, overwrite)
    dtype = torch.float32 if dtype is None else dtype
    writable_dir(output.parent, "output")  # fail on an unwritable place before the long load
    t0 = time.perf_counter()
    dtype_name = str(dtype).replace("torch.", "")
    _say(progress, f"converting {source.name} ({arch}, {source.stat().st_size / 1e6:.0f} MB) to {dtype_name} weights")
    kwargs = {"dtype": dtype}
    if hasattr(transformers, "GgufConfig"):  # transformers versions that keep GGUF blocks packed unless told
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    try:
        with silenced(not progress):
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(source.parent), gguf_file=source.name, **kwargs
            )
            _say(progress, "reading the tokenizer (large vocabularies take a minute)")
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise ModelError(f"transformers could not read the {arch!r} model in {str(source)!r}: {exc}") from exc
    detach_quantizer(model)
    seconds = time.perf_counter() - t0
    with output_folder(output, kind=MODEL_KIND) as tmp, silenced(not progress):
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {
            "source": f"GGUF file {source.name}",
            "gguf_architecture": arch,
            "architecture": type(model).__name__,
            "num_hidden_layers": model.config.num_hidden_layers,
            "vocab_size": model.config.vocab_size,
            "n_params": sum(p.numel() for p in model.parameters()),
            "dtype": dtype_name,
            "conversion_seconds": round(seconds, 1),
            **(manifest or {}),
        }
        (tmp / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
    _say(progress, f"saved {type(model).__name__} to {output} ({time.perf_counter() - t0:.1f} s)")
    return output


__all__ = [
    "MANIFEST",
    "check_gguf",
    "convert_gguf",
    "detach_quantizer",
    "gguf_architecture",
    "is_converted",
    "supported_architectures",
]
