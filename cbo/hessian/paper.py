"""``paper``: the CBO paper's own estimator, the empirical Fisher of per-layer gates.

The recipe of the paper's code:

* one scalar gate per decoder layer that multiplies *both* residual branches of the layer, so the MLP sees the
  gated attention output: ``h = x + a·attn(x)``, ``out = h + a·mlp(h)``;
* per-sequence gate gradients ``A_s = ∂ CE_s / ∂a`` of the plain next-token cross-entropy with the true next
  tokens as labels (``CE_s``: mean over the T − 1 predicted positions of sequence s);
* ``H = AᵀA / n`` over the n calibration sequences, no linear term.

The paper scores a removal set by ``xᵀHx``; the QUBO here holds that same H with ``g = 0``, so its energy
``½xᵀHx`` is half the paper's and ranks every state identically.

The tied gate's gradient is the sum of the gradients of its two uses (chain rule), so the estimator gates the
attention and MLP halves of each layer separately for the pass and sums the two columns of each layer. The
gradient of every sequence comes out of one backward pass per batch (see ``gates.py``); it equals the batch-1
gradient of the paper's code because a sequence's loss depends only on its own activations. With
``granularity="sublayer"`` each half is its own block with its own gate.

This is ``fisher`` with ``labels="empirical"`` and ``loss="ce"`` except for three details: the tied gate (a
``fisher`` layer gate scales the layer's whole output difference, so its MLP sees the ungated attention), the
scale (``fisher`` multiplies by T − 1 so H estimates the Gauss-Newton matrix of the mean loss) and the linear
term (``fisher`` keeps the mean CE gradient as ``g``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from cbo.errors import ModelError
from cbo.hessian.base import Estimator, register
from cbo.measure.losses import ce_per_sequence
from cbo.model.gates import Gates


def paper_gate_layout(model: torch.nn.Module, blocks: list) -> tuple[list, np.ndarray]:
    """The sublayer blocks to gate and the (len(gated), N) 0/1 matrix summing their gradients into each block's.

    A decoder-layer block maps to its attention and MLP halves (one tied gate); a half maps to itself.

    Raises:
        ModelError: a layer's halves cannot be found, or a layer and one of its halves are both blocks.
    """
    halves: dict[int, list] = {}
    if any(b.part == "layer" for b in blocks):
        from cbo.model.blocks import find_blocks

        for sub in find_blocks(model, "sublayer"):
            halves.setdefault(sub.layer, []).append(sub)
    gated: list = []
    columns: list[int] = []
    for j, b in enumerate(blocks):
        parts = halves.get(b.layer, []) if b.part == "layer" else [b]
        if b.part == "layer" and len(parts) != 2:
            raise ModelError(
                f"the paper's gate of {b.name!r} multiplies its attention and MLP branches, but "
                f"{len(parts)} halves were found in that layer; use granularity='sublayer' for this model."
            )
        for part in parts:
            if any(part.module is g.module for g in gated):
                raise ModelError(
                    f"block {part.name!r} is gated twice (a layer and its own half are both blocks); "
                    "pass decoder layers or sublayers, not both for one layer."
                )
            gated.append(part)
            columns.append(j)
    P = np.zeros((len(gated), len(blocks)))
    P[np.arange(len(gated)), columns] = 1.0
    return gated, P


@register
class PaperEstimator(Estimator):
    name = "paper"
    description = (
        "the CBO paper's recipe: H = A^T A / n of per-sequence cross-entropy gate gradients (true labels), "
        "one gate per layer on both branches, no linear term"
    )
    cost = "1 forward + 1 backward pass per batch (per-sequence gradients from one backward)"
    losses = ("ce",)

    def init_state(self) -> dict[str, np.ndarray]:
        n = len(self.run.blocks)
        return {"outer": np.zeros((n, n)), "count": np.zeros(()), "loss_sum": np.zeros(())}

    def accumulate(
        self, state: dict[str, np.ndarray], batch_index: int, tokens: torch.Tensor, tick: Callable[[], None]
    ) -> None:
        run = self.run
        gated, P = paper_gate_layout(run.model, run.blocks)
        # the driver's gates stay at 1 and off the graph while the paper's (tied) gates take the pass
        run.gates.detach()
        try:
            with torch.enable_grad(), Gates(run.model, gated) as gates, gates.recording() as rec:
                logits = run.forward(tokens)
                run.check_finite(logits, batch_index, "logits")
                ce = ce_per_sequence(logits, tokens)
                run.check_finite(ce, batch_index)
                A = rec.backward(ce.sum(), gates.a).numpy() @ P
                run.count_backward()
        finally:
            run.gates.attach()
        state["outer"] += A.T @ A
        state["count"] += A.shape[0]
        state["loss_sum"] += float(ce.detach().sum())
        tick()

    def finalize(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        count = float(state["count"])
        H = state["outer"] / count
        extra = {
            "gradient_samples": int(count),
            "calibration_ce": float(state["loss_sum"]) / count,
            "paper_energy": "x^T H x (twice this QUBO's energy; the same ranking)",
        }
        return H, np.zeros(len(self.run.blocks)), extra
