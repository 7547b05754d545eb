"""Measured per-sequence removal losses on disk, one file per (model, blocks, batch of windows).

Estimators, validation and benchmarks that measure the same sets on the same batches share the work. Each file
maps a removal set to its per-sequence KL, cross-entropy and next-token agreement; files written before the
agreement was recorded give NaN agreement for their entries.

A file is trusted only when it fits the run that reads it: it records its key (model fingerprint, block names,
measurer version and data hash; files written before the key was recorded are read without it), every set lists
blocks of this model, and every value has one entry per window of the batch. A file that does not fit is ignored
with a warning naming it, and replaced by the next write.
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from cbo.checks import is_int

METRICS = ("kl", "ce", "agree")


class MeasureCache:
    """The folder of measured removal losses of one model and block list.

    Args:
        directory: the folder (created if needed).
        model: the model (its fingerprint and the block names are part of every file's key).
        blocks: the block list.
    """

    def __init__(self, directory: str | Path, model: torch.nn.Module, blocks: Sequence[Any]) -> None:
        from cbo.model.fingerprint import model_fingerprint
        from cbo.model.loading import writable_dir as ensure_writable_dir

        self.dir = ensure_writable_dir(directory, "measurement cache")
        from cbo.measure.replay import VERSION

        self.n_blocks = len(blocks)
        self.prefix = hashlib.sha256(
            json.dumps([model_fingerprint(model), [b.name for b in blocks], VERSION]).encode()
        ).hexdigest()[:16]

    def batch(self, tokens: torch.Tensor) -> BatchCache:
        from cbo.data.windows import data_hash

        digest = data_hash(tokens.cpu().to(torch.int64))
        key = f"{self.prefix}-{digest[:16]}"
        return BatchCache(self.dir / f"removal-{key}.npz", key, self.n_blocks, int(tokens.shape[0]))


class BatchCache:
    """The measured sets of one batch: ``key in cache``, ``cache[key]``, ``cache.update({key: values})``."""

    def __init__(self, path: Path, key: str | None = None, n_blocks: int | None = None, n_rows: int | None = None):
        self.path, self.key, self.n_blocks, self.n_rows = path, key, n_blocks, n_rows
        self.data: dict[tuple[int, ...], dict[str, torch.Tensor]] = self._read()

    def _read(self) -> dict[tuple[int, ...], dict[str, torch.Tensor]]:
        if not self.path.exists():
            return {}
        from cbo.files import READ_ERRORS

        try:
            with np.load(self.path, allow_pickle=False) as z:
                sets = json.loads(bytes(z["sets"]).decode())
                arrays = {m: z[m] for m in METRICS if m in z.files}
                stored_key = bytes(z["key"]).decode() if "key" in z.files else None
        except READ_ERRORS as exc:  # truncated or flipped bytes: a bad zip, a bad deflate stream, a bad header
            return self._ignore(f"it is not readable ({exc})")
        if "kl" not in arrays or "ce" not in arrays:
            return self._ignore("it holds no KL and cross-entropy values")
        why = self._mismatch(stored_key, sets, arrays)
        if why is not None:
            return self._ignore(why)
        out = {}
        for k, s in enumerate(sets):
            entry = {m: torch.from_numpy(a[k].copy()) for m, a in arrays.items()}
            entry.setdefault("agree", torch.full_like(entry["kl"], float("nan")))
            out[tuple(s)] = entry
        return out

    def _mismatch(self, stored_key: str | None, sets: Any, arrays: dict[str, np.ndarray]) -> str | None:
        """Why the file's content is not this batch's measurements (None when it fits)."""
        if stored_key is not None and self.key is not None and stored_key != self.key:
            return f"it records the key {stored_key!r}, not {self.key!r}"
        if not isinstance(sets, list) or not all(isinstance(s, list) for s in sets):
            return "its list of removal sets is malformed"
        flat = [b for s in sets for b in s]
        if not all(is_int(b) for b in flat):
            return "its removal sets hold non-integer blocks"
        if self.n_blocks is not None and any(not 0 <= b < self.n_blocks for b in flat):
            return f"its removal sets name blocks outside 0..{self.n_blocks - 1}"
        for metric, a in arrays.items():
            rows = self.n_rows if self.n_rows is not None else (a.shape[1] if a.ndim == 2 else -1)
            if a.ndim != 2 or a.shape != (len(sets), rows):
                return f"its {metric} values have shape {a.shape}, not {(len(sets), rows)}"
        return None

    def _ignore(self, why: str) -> dict[tuple[int, ...], dict[str, torch.Tensor]]:
        warnings.warn(f"ignoring the measurement cache file {str(self.path)!r}: {why}; measuring again.", stacklevel=4)
        return {}

    def __contains__(self, key: tuple[int, ...]) -> bool:
        return key in self.data

    def __getitem__(self, key: tuple[int, ...]) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.data[key].items()}

    def _value(self, key: tuple[int, ...], metric: str) -> np.ndarray:
        entry = self.data[key]
        if metric in entry:
            return entry[metric].numpy()
        return np.full(entry["kl"].shape, np.nan, dtype=np.float32)

    def update(self, values: dict[tuple[int, ...], dict[str, torch.Tensor]]) -> None:
        from cbo.files import atomic_write_bytes

        # merge with what other runs wrote since this file was read
        self.data = {**self._read(), **self.data}
        self.data.update({k: {n: t.detach().float().cpu() for n, t in v.items()} for k, v in values.items()})
        sets = list(self.data)
        buf = io.BytesIO()
        extra = {"key": np.frombuffer(self.key.encode(), dtype=np.uint8)} if self.key is not None else {}
        np.savez(
            buf,
            **extra,
            sets=np.frombuffer(json.dumps([list(s) for s in sets]).encode(), dtype=np.uint8),
            **{m: np.stack([self._value(s, m) for s in sets]) for m in METRICS},
        )
        try:
            atomic_write_bytes(self.path, buf.getvalue())
        except OSError:
            pass  # a cache that cannot be written only costs time
