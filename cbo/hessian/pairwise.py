"""``pairwise``: the measured loss increase with every single block and every pair removed.

``D(S) = L(gates of S at 0) − L(all gates 1)`` is measured by forward passes (no Taylor error):
1 + N + N(N − 1)/2 passes per batch. The QUBO is

    E(x) = Σ_i D({i}) x_i + Σ_{i<j} b_ij x_i x_j,   b_ij = D({i,j}) − D({i}) − D({j}),

stored as ``H_ii = 2 D({i})``, ``H_ij = b_ij``, ``g = 0``, so that with ``couplings="raw"`` and
``coupling_scale=1`` the energy of every single and every pair equals its measured loss increase.

Measured couplings are mostly negative (two removals hurt less than the sum of each): damage
saturates, and a quadratic model extrapolates that sub-additivity to large sets, rewarding sets full
of individually destructive blocks. ``couplings="positive"`` keeps only the penalizing couplings
(``max(b_ij, 0)``), which predicted much better removal sets on the default model; ``coupling_scale``
multiplies the couplings kept (0 gives the one-at-a-time ranking).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from cbo.errors import CBOError
from cbo.hessian.base import Estimator, register
from cbo.hessian.losses import LossFn, log_probs


@register
class PairwiseEstimator(Estimator):
    name = "pairwise"
    description = "measured loss with every single and pair of blocks removed (no Taylor error)"
    cost = "1 + N + N(N-1)/2 forward passes per batch, no backward"
    needs_grad = False

    @dataclass
    class Options:
        couplings: str = "positive"  # "raw" (exact on singles and pairs) or "positive" (max(b_ij, 0))
        coupling_scale: float = 1.0  # multiplies the kept couplings

        def validate(self) -> None:
            if self.couplings not in ("raw", "positive"):
                raise CBOError(f"pairwise couplings must be 'raw' or 'positive', got {self.couplings!r}.")
            if isinstance(self.coupling_scale, bool) or not isinstance(self.coupling_scale, (int, float)):
                raise CBOError(f"pairwise coupling_scale must be a number, got {self.coupling_scale!r}.")
            if not np.isfinite(self.coupling_scale) or self.coupling_scale < 0:
                raise CBOError(f"pairwise coupling_scale must be finite and >= 0, got {self.coupling_scale!r}.")

    def sets(self) -> list[tuple[int, ...]]:
        n = len(self.run.blocks)
        return [(i,) for i in range(n)] + list(itertools.combinations(range(n), 2))

    def units_per_batch(self) -> int:
        return 1 + len(self.sets())

    def init_state(self) -> dict[str, np.ndarray]:
        n = len(self.run.blocks)
        # cursor: sets of the current batch already measured, so that a run interrupted inside a batch
        # (one batch is 1 + N(N+1)/2 forward passes) resumes from the checkpoint where it stopped
        return {
            "base": np.zeros(()),
            "single": np.zeros(n),
            "pair": np.zeros((n, n)),
            "count": np.zeros(()),
            "cursor": np.zeros(()),
        }

    def accumulate(
        self, state: dict[str, np.ndarray], batch_index: int, tokens: torch.Tensor, tick: Callable[[], None]
    ) -> None:
        run = self.run
        gates = run.gates
        with torch.no_grad():
            gates.set()
            logits = run.forward(tokens)
            run.check_finite(logits, batch_index, "logits")
            loss = LossFn(run.loss, tokens, log_probs(logits) if run.loss == "kl" else None)
            base = loss.per_sequence(logits)
            del logits
            cursor = int(state["cursor"])
            if cursor == 0:
                state["base"] += float(base.sum())
            tick()
            try:
                for index, s in enumerate(self.sets()):
                    if index < cursor:  # measured before the interruption this run resumes from
                        tick()
                        continue
                    gates.set(removed=s)
                    value = loss.per_sequence(run.forward(tokens)).sum()
                    run.check_finite(value, batch_index, f"loss with blocks {list(s)} removed")
                    if len(s) == 1:
                        state["single"][s[0]] += float(value)
                    else:
                        state["pair"][s[0], s[1]] += float(value)
                    state["cursor"] = np.asarray(float(index + 1))
                    tick()
                    run.save_partial(state, batch_index)
            finally:
                gates.set()
        state["cursor"] = np.zeros(())
        state["count"] += tokens.shape[0]

    def finalize(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        n = len(self.run.blocks)
        count = float(state["count"])
        base = float(state["base"]) / count
        single = state["single"] / count - base
        pair = np.zeros((n, n))
        iu = np.triu_indices(n, 1)
        pair[iu] = state["pair"][iu] / count - base
        pair = pair + pair.T
        b = pair - single[:, None] - single[None, :]
        np.fill_diagonal(b, 0.0)
        if self.options.couplings == "positive":
            b = np.maximum(b, 0.0)
        b = float(self.options.coupling_scale) * b
        H = b.copy()
        np.fill_diagonal(H, 2.0 * single)
        extra = {
            "calibration_loss": base,
            "measured": {
                "base_loss": base,
                "single": [float(v) for v in single],
                "pair": [[float(v) for v in row] for row in pair],
            },
        }
        return H, np.zeros(n), extra
