"""Measured per-sequence removal losses on disk, one file per (model, blocks, batch of windows).

Estimators, validation and benchmarks that measure the same sets on the same batches share the work. Each file
maps a removal set to its per-sequence KL, cross-entropy and next-token agreement; files written before the
agreement was recorded give NaN agreement for their entries.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

METRICS = ("kl", "ce", "agree")


class MeasureCache:
    """The folder of measured removal losses of one model and block list.

    Args:
        directory: the folder (created if needed).
        model: the model (its fingerprint and the block names are part of every file's key).
        blocks: the block list.
    """

    def __init__(self, directory: str | Path, model: torch.nn.Module, blocks: Sequence[Any]) -> None:
        from cbo.hessian.checkpoint import ensure_writable_dir
        from cbo.hessian.fingerprint import model_fingerprint

        self.dir = ensure_writable_dir(directory, "measurement cache")
        from cbo.hessian.replay import VERSION

        self.prefix = hashlib.sha256(
            json.dumps([model_fingerprint(model), [b.name for b in blocks], VERSION]).encode()
        ).hexdigest()[:16]

    def batch(self, tokens: torch.Tensor) -> BatchCache:
        from cbo.data import data_hash

        digest = data_hash(tokens.cpu().to(torch.int64))
        return BatchCache(self.dir / f"removal-{self.prefix}-{digest[:16]}.npz")


class BatchCache:
    """The measured sets of one batch: ``key in cache``, ``cache[key]``, ``cache.update({key: values})``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[tuple[int, ...], dict[str, torch.Tensor]] = self._read()

    def _read(self) -> dict[tuple[int, ...], dict[str, torch.Tensor]]:
        if not self.path.exists():
            return {}
        try:
            with np.load(self.path, allow_pickle=False) as z:
                sets = json.loads(bytes(z["sets"]).decode())
                arrays = {m: z[m] for m in METRICS if m in z.files}
        except (OSError, ValueError, KeyError, json.JSONDecodeError):
            return {}
        if "kl" not in arrays or "ce" not in arrays:
            return {}
        out = {}
        for k, s in enumerate(sets):
            entry = {m: torch.from_numpy(a[k].copy()) for m, a in arrays.items()}
            entry.setdefault("agree", torch.full_like(entry["kl"], float("nan")))
            out[tuple(s)] = entry
        return out

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
        from cbo.hessian.checkpoint import atomic_write_bytes

        # merge with what other runs wrote since this file was read
        self.data = {**self._read(), **self.data}
        self.data.update({k: {n: t.detach().float().cpu() for n, t in v.items()} for k, v in values.items()})
        sets = list(self.data)
        buf = io.BytesIO()
        np.savez(
            buf,
            sets=np.frombuffer(json.dumps([list(s) for s in sets]).encode(), dtype=np.uint8),
            **{m: np.stack([self._value(s, m) for s in sets]) for m in METRICS},
        )
        try:
            atomic_write_bytes(self.path, buf.getvalue())
        except OSError:
            pass  # a cache that cannot be written only costs time
