"""``exact``: the autograd Hessian of the calibration loss with respect to the gate vector.

Per batch: one forward pass with the gates at 1, the gradient with ``create_graph=True``, then one
Hessian-vector product (a double backward) per gate. The batch Hessians and gradients are averaged
with weights equal to the batch's share of sequences, which gives the Hessian of the mean loss.

Sign convention. ``x = 1 − a`` and ``L(1 − x) ≈ L(1) − ∇_a L·x + ½ xᵀ H x``, so the QUBO's ``g`` is
``∇_a L`` itself and the energy ``E(x) = ½xᵀHx − g·x`` is the predicted loss increase. For KL,
``g`` is 0 up to rounding (the gradient of a divergence at its minimum) and ``H`` is the exact
Gauss-Newton matrix.

Attention runs through PyTorch's math SDPA kernel during this estimator: the fused CPU kernel has
no double backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from cbo.checks import check_bool
from cbo.hessian.base import Estimator, register
from cbo.measure.losses import LossFn, log_probs


@register
class ExactEstimator(Estimator):
    name = "exact"
    description = "autograd Hessian of the loss w.r.t. the gates (N Hessian-vector products per batch)"
    cost = "1 forward + 1 backward + N double-backward passes per batch"

    @dataclass
    class Options:
        vectorize: bool = False  # all N Hessian-vector products in one batched double backward (more memory)

        def validate(self) -> None:
            check_bool("exact vectorize", self.vectorize)

    def units_per_batch(self) -> int:
        return len(self.run.blocks)

    def init_state(self) -> dict[str, np.ndarray]:
        n = len(self.run.blocks)
        return {"H_sum": np.zeros((n, n)), "g_sum": np.zeros(n), "loss_sum": np.zeros(()), "count": np.zeros(())}

    def accumulate(
        self, state: dict[str, np.ndarray], batch_index: int, tokens: torch.Tensor, tick: Callable[[], None]
    ) -> None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        run = self.run
        a = run.gates.a
        n = a.shape[0]
        with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
            logits = run.forward(tokens)
            run.check_finite(logits, batch_index, "logits")
            teacher = log_probs(logits).detach() if run.loss == "kl" else None
            loss = LossFn(run.loss, tokens, teacher).per_sequence(logits).mean()
            run.check_finite(loss, batch_index)
            (grad,) = torch.autograd.grad(loss, a, create_graph=True)
            run.count_backward()
            H = torch.zeros(n, n, dtype=torch.float64)
            if not grad.requires_grad:
                tick_n = n
            elif self.options.vectorize:
                rows = torch.autograd.grad(grad, a, grad_outputs=torch.eye(n), is_grads_batched=True)[0]
                H = rows.to(torch.float64)
                run.count_backward(n)
                tick_n = n
            else:
                tick_n = 0
                for i in range(n):
                    (row,) = torch.autograd.grad(grad[i], a, retain_graph=i < n - 1, allow_unused=True)
                    if row is not None:
                        H[i] = row.to(torch.float64)
                    run.count_backward()
                    tick()
            for _ in range(tick_n):
                tick()
        B = tokens.shape[0]
        state["H_sum"] += B * H.numpy()
        state["g_sum"] += B * grad.detach().to(torch.float64).numpy()
        state["loss_sum"] += B * float(loss.detach())
        state["count"] += B

    def finalize(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        count = float(state["count"])
        H = state["H_sum"] / count
        H = 0.5 * (H + H.T)
        g = state["g_sum"] / count
        return H, g, {"calibration_loss": float(state["loss_sum"]) / count}
