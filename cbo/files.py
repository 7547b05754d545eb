"""Files the project writes: atomic writes with unique temporary names, and checksummed zip archives.

Two processes that save the same path never share a temporary file (each write gets its own name in the target
folder, then one atomic rename), and a reader sees either the old file or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cbo.errors import CorruptFileError

# what a damaged zip member or .npy header can raise while being read
_READ_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    NotImplementedError,  # a damaged header names an unknown compression method
    KeyError,
    ValueError,  # JSON, UTF-8 and .npy header errors
    TypeError,
    OSError,
    EOFError,
    RuntimeError,
    OverflowError,
    MemoryError,  # a damaged .npy header can claim an absurd shape
)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a uniquely named temporary file in the same folder and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def archive_checksum(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> str:
    """SHA-256 over the arrays (dtype, shape, bytes) and the metadata without its ``sha256`` entry."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(key.encode())
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    h.update(json.dumps({k: v for k, v in meta.items() if k != "sha256"}, sort_keys=True).encode())
    return h.hexdigest()


def write_archive(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Path:
    """One zip file: ``meta.json`` (with the checksum) and one ``.npy`` member per array, written atomically."""
    meta = {**meta, "sha256": archive_checksum(arrays, meta)}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("meta.json", json.dumps(meta, indent=1, sort_keys=True))
        for key, arr in arrays.items():
            b = io.BytesIO()
            np.save(b, arr, allow_pickle=False)
            zf.writestr(f"{key}.npy", b.getvalue())
    return atomic_write_bytes(path, buf.getvalue())


def read_archive(path: Path, keys: Sequence[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The metadata and arrays of an archive written by :func:`write_archive`; any damage raises CorruptFileError.

    The checksum is not verified here: the caller checks the format first, to give the clearer message.
    """
    label = repr(str(path))
    try:
        with zipfile.ZipFile(path) as zf:
            meta = json.loads(zf.read("meta.json").decode("utf-8"))
            arrays = {k: np.load(io.BytesIO(zf.read(f"{k}.npy")), allow_pickle=False) for k in keys}
    except _READ_ERRORS as exc:
        raise CorruptFileError(
            f"{label} is not a readable CBO file (truncated, damaged or not written by CBO): {exc}"
        ) from exc
    if not isinstance(meta, dict):
        raise CorruptFileError(f"{label} has metadata of type {type(meta).__name__}; expected a JSON object.")
    return meta, arrays
