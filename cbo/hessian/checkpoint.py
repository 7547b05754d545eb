"""Resumable accumulators: the estimator state is written after each batch, atomically.

A checkpoint is one ``.npz`` file named by the run's key (model, data, estimator, loss, options):
the accumulator arrays plus a JSON header with the key and the next batch to process. A run that
finds a checkpoint with its own key continues from there; a finished run deletes it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from cbo.files import READ_ERRORS, CheckpointFile

_FORMAT = "cbo.hessian-checkpoint"


def ensure_writable_dir(path: str | Path, purpose: str) -> Path:
    """Create ``path`` if needed and check that files can be written there (CacheDirError otherwise)."""
    from cbo.model.loading import writable_dir

    return writable_dir(path, purpose)


class Checkpoint(CheckpointFile):
    """The checkpoint file of one estimation run."""

    def __init__(self, directory: str | Path, key: str) -> None:
        self.dir = ensure_writable_dir(directory, "checkpoint")
        self.key = key
        super().__init__(self.dir / f"hessian-{key[:24]}.ckpt.npz")
        if self.path.exists() and not self.path.is_file():
            from cbo.model.loading import CacheDirError

            raise CacheDirError(
                f"{str(self.path)!r} is a folder (or another non-file), so this run's checkpoint could not be "
                "written there. Move or delete it, or run without the cache (--no-cache; checkpoint=None in Python)."
            )

    def save(self, state: dict[str, np.ndarray], next_batch: int, info: dict[str, Any]) -> None:
        header = {"format": _FORMAT, "key": self.key, "next_batch": int(next_batch), "info": info}
        buf = io.BytesIO()
        arrays = {f"state__{k}": np.asarray(v) for k, v in state.items()}
        np.savez(buf, __header__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **arrays)
        self.write(buf.getvalue())

    def load(self) -> tuple[dict[str, np.ndarray], int] | None:
        """(state, next batch) of an unfinished run with this key, or None."""
        data = self.read()
        if data is None:
            return None
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                header = json.loads(bytes(z["__header__"]).decode())
                state = {k[len("state__") :]: z[k].copy() for k in z.files if k.startswith("state__")}
        except READ_ERRORS as exc:  # truncated or flipped after a Ctrl-C: a bad zip, deflate stream or header
            self.starting_over("unreadable", exc)
            return None
        if not isinstance(header, dict) or header.get("format") != _FORMAT or header.get("key") != self.key:
            self.starting_over("another run's")
            return None
        return state, int(header["next_batch"])
