"""The surgery record of a pruned model folder's ``config.json`` (every ``cbo_*`` entry, at the top level and in
nested sections such as ``text_config``, with the layer counts) and its checksum ``cbo_sha256``, written by
:func:`cbo.surgery.io.save_pruned` and compared by :func:`cbo.surgery.io.load_pruned`: a config edited consistently
(``cbo_removed_layers`` and ``cbo_original_layers`` changed together) would otherwise load with a wrong record.

A folder without the checksum (saved by an older CBO, or re-saved by plain ``save_pretrained`` after a load through
``load_pruned``, which drops it) loads with the record's own consistency checks only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cbo.errors import CorruptFileError
from cbo.jsonable import json_checksum

CONFIG_CHECKSUM_KEY = "cbo_sha256"


def surgery_record(config: dict[str, Any]) -> dict[str, Any]:
    """The entries of a ``config.json`` dict the checksum covers: ``cbo_*`` and ``num_hidden_layers``, at the top
    level and in nested sections (``"text_config.cbo_removed_layers"``)."""
    sections = [("", config)] + [(f"{k}.", v) for k, v in config.items() if isinstance(v, dict)]
    out: dict[str, Any] = {}
    for prefix, section in sections:
        for key, value in section.items():
            if (key.startswith("cbo_") and key != CONFIG_CHECKSUM_KEY) or key == "num_hidden_layers":
                out[prefix + key] = value
    return json.loads(json.dumps(out))  # as it reads back from the file (tuples as lists)


def record_checksum(config: dict[str, Any]) -> str:
    """The checksum of ``config``'s surgery record (what ``cbo_sha256`` holds)."""
    return json_checksum(surgery_record(config), key=CONFIG_CHECKSUM_KEY)


def check_record_checksum(folder: str | os.PathLike) -> None:
    """CorruptFileError when the folder's ``config.json`` carries a ``cbo_sha256`` its surgery record does not match
    (nothing to check without one)."""
    file = Path(folder) / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise CorruptFileError(f"cannot read the config in {str(folder)!r}: {exc}") from exc
    stored = config.get(CONFIG_CHECKSUM_KEY) if isinstance(config, dict) else None
    if stored is not None and stored != record_checksum(config):
        raise CorruptFileError(
            f"the config in {str(file)!r} was edited after CBO saved it: its surgery record (cbo_* entries such as "
            f"cbo_removed_layers, num_hidden_layers) does not match its {CONFIG_CHECKSUM_KEY}. Use the folder as saved; "
            f"if the change was made on purpose, delete {CONFIG_CHECKSUM_KEY} from config.json to load it unchecked."
        )
