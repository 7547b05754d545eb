"""Calibration losses of a gated model, per sequence, accumulated in float32 whatever the model dtype.

* ``kl``: KL(original ‖ gated) of the next-token distributions, mean over the T positions of a
  sequence. The original's log-probabilities (the teacher) come from a pass with every gate at 1.
  At a = 1 the loss and its gradient are exactly 0.
* ``ce``: next-token cross-entropy of the text, mean over the T − 1 predicted positions.

A sequence's loss depends only on its own activations, so the per-sequence losses of a batch can be
summed for one backward pass that yields every sequence's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cbo.errors import CBOError, InvalidOptionError

LOSSES = ("kl", "ce")


def check_loss(loss: str) -> str:
    if loss not in LOSSES:
        raise InvalidOptionError(
            f"unknown loss {loss!r}; valid: {list(LOSSES)} (kl = KL to the original, ce = cross-entropy)."
        )
    return loss


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 models: never accumulate in half precision."""
    return torch.promote_types(dtype, torch.float32)


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Next-token log-probabilities in float32 (float64 for float64 models)."""
    return torch.log_softmax(logits.to(accumulation_dtype(logits.dtype)), dim=-1)


def kl_per_sequence(logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """(B,) mean over positions of KL(teacher ‖ model); ``teacher_logprobs`` are float32 log-probs."""
    logq = log_probs(logits)
    p = teacher_logprobs.exp()
    kl = (p * (teacher_logprobs - logq)).sum(-1)
    return kl.mean(-1)


def ce_per_sequence(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(B,) mean next-token cross-entropy over the T − 1 predicted positions."""
    logq = log_probs(logits[:, :-1])
    nll = -logq.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return nll.mean(-1)


def nll_of_labels(logprobs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B,) mean negative log-likelihood of ``labels`` (B, T') under ``logprobs`` (B, T', V)."""
    return -logprobs.gather(-1, labels.unsqueeze(-1)).squeeze(-1).mean(-1)


def predicted_positions(loss: str, seq_len: int) -> int:
    """Number of positions a sequence's loss averages over (T for KL, T − 1 for CE)."""
    return seq_len if loss == "kl" else seq_len - 1


@dataclass
class LossFn:
    """A loss bound to one batch: ``per_sequence(logits)`` -> (B,) float32 losses."""

    name: str
    tokens: torch.Tensor
    teacher: torch.Tensor | None = None

    def per_sequence(self, logits: torch.Tensor) -> torch.Tensor:
        if self.name == "kl":
            if self.teacher is None:
                raise CBOError("the KL loss needs the original model's log-probabilities (teacher) for this batch.")
            return kl_per_sequence(logits, self.teacher)
        return ce_per_sequence(logits, self.tokens)
