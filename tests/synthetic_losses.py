"""A synthetic executor for the search tests: losses from a known function of the removal set, no model.

``SyntheticExecutor(fn, n_windows)`` answers ``run(requests)`` like ``cbo.measure.executors.InProcessExecutor``: the loss
of set ``s`` on window ``w`` is ``fn(s) * (1 + spread * u_w)`` with a fixed per-window factor (windows differ in
difficulty, as real ones do), CE = KL + 1, and each (set, window) pair costs one FPE. It records every request so
that tests can check what a search asked for.
"""

from __future__ import annotations

import numpy as np


class SyntheticExecutor:
    def __init__(self, fn, n_windows: int = 8, spread: float = 0.2, seed: int = 0) -> None:
        self.fn = fn
        self.n_windows = n_windows
        self.factor = 1.0 + spread * np.random.default_rng(seed).uniform(-1, 1, n_windows)
        self.requests: list[tuple[int, list[tuple[int, ...]]]] = []

    def run(self, requests):
        out = []
        for w, sets in requests:
            self.requests.append((w, list(sets)))
            kl = np.array([self.fn(s) * self.factor[w] for s in sets], dtype=float)
            out.append((kl, kl + 1.0, float(len(sets))))
        return out

    def close(self) -> None:
        pass


def planted_quadratic(n: int, seed: int = 0, coupling: float = 0.3):
    """``(a, B, fn)``: single costs a, pair couplings B (symmetric, zero diagonal), fn(s) = Σ a_i + Σ_{i<j} B_ij."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 2.0, n)
    B = rng.normal(0, coupling, (n, n))
    B = np.triu(B, 1)
    B = B + B.T

    def fn(s):
        s = list(s)
        return float(a[s].sum() + 0.5 * B[np.ix_(s, s)].sum())

    return a, B, fn


class Stop(Exception):
    """Raised by ``interrupt_at``: the stand-in for a Ctrl-C in the resume tests."""


def interrupt_at(key: str, value: int):
    """A progress callback that raises ``Stop`` once ``info[key] == value`` (a run interrupted mid-way)."""

    def interrupt(info: dict) -> None:
        if info[key] == value:
            raise Stop

    return interrupt
