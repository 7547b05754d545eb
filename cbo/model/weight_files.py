"""Whether a local model folder's weights files are there and whole: their headers are read, the weights are not
loaded, so a missing, truncated or damaged file is a :class:`CorruptFileError` naming it, before (or instead of)
a raw error from deep inside transformers or safetensors."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cbo.errors import CorruptFileError

WEIGHT_INDEX = "model.safetensors.index.json"
OTHER_WEIGHT_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def check_weight_files(folder: str | os.PathLike) -> None:
    """CorruptFileError naming the file when a local model folder's weights are missing, truncated or damaged
    (their headers are read; the weights are not loaded).

    Example:
        >>> check_weight_files("out/pruned")   # doctest: +SKIP
    """
    folder = Path(folder)
    fix = "copy or save the model folder again (cbo prune --out, save_pruned)"
    index = folder / WEIGHT_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptFileError(f"the weight index {str(index)!r} is not readable ({exc!r}); {fix}.") from exc
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise CorruptFileError(
                f"the model folder {str(folder)!r} lacks the weight file(s) {missing} its {WEIGHT_INDEX} lists; {fix}."
            )
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files and not any((folder / n).is_file() for n in OTHER_WEIGHT_FILES):
        raise CorruptFileError(
            f"the model folder {str(folder)!r} holds no weights file (model.safetensors); it is incomplete: {fix}."
        )
    if not files:
        return
    from cbo.extras import require

    safetensors = require("safetensors", "reading model weights")
    for f in files:
        try:
            with safetensors.safe_open(str(f), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # safetensors' own error type, OSError: either way the file cannot be read
            raise CorruptFileError(f"the weights file {str(f)!r} is truncated or damaged ({exc}); {fix}.") from exc
