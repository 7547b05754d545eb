"""``fisher``: Gauss-Newton / Fisher matrix of the gates from per-sequence gate gradients.

One forward and one backward pass per batch give the gate gradient of every sequence: the gate
hooks save each branch output and the gradient at the gated output, whose dot product is the
sequence's gate gradient (see ``gates.py``). Gradients reach the gates only; weight gradients are
never formed.

Scaling. Let ``ĝ_s`` be the gradient of sequence s's mean loss over its T' predicted positions
(T' = T for KL, T − 1 for CE) with labels ``y_st``. The Hessian of the mean KL at a = 1 is the
Gauss-Newton matrix ``(1/(S T')) Σ_{s,t} J_stᵀ F_st J_st`` (F_st: the softmax Fisher at position t).
With labels sampled from the original model, the per-position score vectors have mean zero and are
independent across positions, so ``E[(T' ĝ_s)(T' ĝ_s)ᵀ] = Σ_t J_stᵀ F_st J_st`` and

    H = T' · mean_s ĝ_s ĝ_sᵀ

is an unbiased estimate of the Hessian of the mean loss (for CE: of its Gauss-Newton part). The
``empirical`` variant uses the true next tokens instead of sampled ones (the empirical Fisher,
biased but label-noise free) with the same scaling. ``g`` is 0 for KL (exact at a = 1) and the
mean gradient of the true cross-entropy for CE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from cbo.checks import check_int
from cbo.errors import InvalidOptionError
from cbo.hessian.base import Estimator, register
from cbo.hessian.gram import add_gram, gram_state
from cbo.measure.losses import ce_per_sequence, log_probs, nll_of_labels, predicted_positions


@register
class FisherEstimator(Estimator):
    name = "fisher"
    description = "Gauss-Newton/Fisher from per-sequence gate gradients (sampled or empirical labels)"
    cost = "1 forward + `samples` backward passes per batch (+1 backward for CE with sampled labels)"

    @dataclass
    class Options:
        labels: str = "sampled"  # "sampled" (from the original model) or "empirical" (true next tokens)
        samples: int = 1  # label draws per batch for "sampled"; each draw is one more backward pass

        def validate(self) -> None:
            if self.labels not in ("sampled", "empirical"):
                raise InvalidOptionError(f"fisher labels must be 'sampled' or 'empirical', got {self.labels!r}.")
            check_int("fisher samples", self.samples, 1)

    def init_state(self) -> dict[str, np.ndarray]:
        n = len(self.run.blocks)
        return {
            **gram_state(n),
            "grad_sum": np.zeros(n),
            "grad_count": np.zeros(()),
            "loss_sum": np.zeros(()),
        }

    def _backward(self, rec: Any, scalar: torch.Tensor, retain: bool) -> np.ndarray:
        """Per-sequence gate gradients (B, N) of the per-sequence losses summed in ``scalar``."""
        G = rec.backward(scalar, self.run.gates.a, retain=retain)
        self.run.count_backward()
        return G.numpy()

    def accumulate(
        self, state: dict[str, np.ndarray], batch_index: int, tokens: torch.Tensor, tick: Callable[[], None]
    ) -> None:
        run, opts = self.run, self.options
        with torch.enable_grad(), run.gates.recording() as rec:
            logits = run.forward(tokens)
            run.check_finite(logits, batch_index, "logits")
            logp = log_probs(logits)
            ce = ce_per_sequence(logits, tokens) if run.loss == "ce" else None
            if opts.labels == "sampled":
                lp = logp if run.loss == "kl" else logp[:, :-1]
                probs = lp.detach().exp().reshape(-1, lp.shape[-1])
                for draw in range(opts.samples):
                    gen = run.generator(batch_index, draw)
                    labels = torch.multinomial(probs, 1, generator=gen).reshape(lp.shape[:2])
                    nll = nll_of_labels(lp, labels)
                    run.check_finite(nll, batch_index)
                    last = draw == opts.samples - 1 and ce is None
                    G = self._backward(rec, nll.sum(), retain=not last)
                    add_gram(state, G)
                    state["loss_sum"] += float(nll.detach().sum())
                if ce is not None:
                    run.check_finite(ce, batch_index)
                    G = self._backward(rec, ce.sum(), retain=False)
                    state["grad_sum"] += G.sum(0)
                    state["grad_count"] += G.shape[0]
            else:
                true_nll = ce if ce is not None else ce_per_sequence(logits, tokens)
                run.check_finite(true_nll, batch_index)
                G = self._backward(rec, true_nll.sum(), retain=False)
                add_gram(state, G)
                state["loss_sum"] += float(true_nll.detach().sum())
                state["grad_sum"] += G.sum(0)
                state["grad_count"] += G.shape[0]
        tick()

    def finalize(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        run, opts = self.run, self.options
        positions = (
            predicted_positions(run.loss, run.seq_len)
            if opts.labels == "sampled"
            else predicted_positions("ce", run.seq_len)
        )
        count = float(state["outer_count"])
        H = positions * state["outer"] / count
        if run.loss == "ce":
            g = state["grad_sum"] / float(state["grad_count"])
        else:
            g = np.zeros(len(run.blocks))
        extra = {
            "fisher_scale": positions,
            "fisher_gradient_samples": int(count),
            "label_nll": float(state["loss_sum"]) / count,
        }
        return H, g, extra
