"""Running a causal LM on token windows: the device its inputs go to, batches of windows, logits without a
KV cache. Shared by the measurer, the estimators, evaluation and the baselines."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cbo.checks import check_int
from cbo.extras import require

torch = require("torch", "running a model")


def input_device(model: Any) -> Any:
    """The device of the model's first parameter that holds data (accelerate's offloaded ones sit on "meta")."""
    return next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))


def model_logits(model: Any, tokens: Any) -> Any:
    """Logits of a causal LM for (B, T) token windows (no KV cache, no padding), in the model's dtype."""
    out = model(input_ids=tokens, use_cache=False)
    return out.logits if hasattr(out, "logits") else out[0]


def window_batches(windows: Any, batch_size: int) -> Iterator[tuple[int, Any]]:
    """``(start, windows[start : start + batch_size])`` over the rows of ``windows``.

    Raises:
        InvalidOptionError: ``batch_size`` is not an integer >= 1 (checked before the first batch).
    """
    batch_size = check_int("batch_size", batch_size, 1)
    return _slices(windows, batch_size)


def _slices(windows: Any, batch_size: int) -> Iterator[tuple[int, Any]]:
    for start in range(0, windows.shape[0], batch_size):
        yield start, windows[start : start + batch_size]


@contextmanager
def torch_threads_kept() -> Iterator[None]:
    """Restore torch's CPU thread count on exit: numba's OpenMP layer (the enumerator, the swap annealers) can
    change the process-wide OpenMP thread count that torch reads, which slows every later forward pass."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
