"""JSON records: conversion of results to JSON types (numpy scalars and arrays to Python numbers and lists,
non-finite floats to the strings ``"inf"`` / ``"nan"``, which JSON has no numbers for, anything else to its repr),
and the checksums of the records CBO saves.

Checksums (ranked states files, ``report.json``, a pruned model's surgery record in ``config.json``): a SHA-256 of
the record's canonical JSON without the checksum field, written with the record and compared when it is loaded, so
an edit or damage after saving is caught instead of loading as a wrong result. A checksum, not a signature: it
catches a changed value, not someone who recomputes it. A record without one (saved by an older CBO) loads with
its other checks only.

Example:
    >>> record = with_checksum({"removed": [[1, 2]], "energies": [0.5]})
    >>> checksum_mismatch(record), checksum_mismatch({**record, "energies": [0.4]})
    (False, True)
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def json_number(value: Any) -> Any:
    """``value`` as a float, or its string when it is not finite; None stays None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else str(value)


def jsonable(obj: Any) -> Any:
    """``obj`` with every nested value converted to a JSON type."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return json_number(obj)
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


CHECKSUM_KEY = "sha256"


def json_checksum(record: Mapping[str, Any], key: str = CHECKSUM_KEY) -> str:
    """SHA-256 (hex) of ``record`` without its ``key`` entry, as canonical JSON (sorted keys, no spaces)."""
    body = {k: v for k, v in record.items() if k != key}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def with_checksum(record: Mapping[str, Any], key: str = CHECKSUM_KEY) -> dict[str, Any]:
    """``record`` with its checksum under ``key`` (any old one replaced)."""
    body = {k: v for k, v in record.items() if k != key}
    return {**body, key: json_checksum(body, key)}


def checksum_mismatch(record: Mapping[str, Any], key: str = CHECKSUM_KEY) -> bool:
    """True when ``record`` carries a checksum under ``key`` that its content does not match (False without one)."""
    stored = record.get(key)
    return stored is not None and stored != json_checksum(record, key)
