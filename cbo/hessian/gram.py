"""The running Gram matrix of per-sequence gate gradients, ``Σ_s g_s g_sᵀ`` and the number of sequences, as the
Fisher-type estimators (``fisher``, ``hybrid``) keep it in their state under ``outer`` / ``outer_count``."""

from __future__ import annotations

import numpy as np


def gram_state(n: int) -> dict[str, np.ndarray]:
    """The empty Gram entries of an estimator state over ``n`` blocks."""
    return {"outer": np.zeros((n, n)), "outer_count": np.zeros(())}


def add_gram(state: dict[str, np.ndarray], G: np.ndarray) -> None:
    """Add the (B, N) per-sequence gate gradients ``G`` of one backward pass to the state's Gram entries."""
    state["outer"] += G.T @ G
    state["outer_count"] += G.shape[0]
