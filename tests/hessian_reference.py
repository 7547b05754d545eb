"""Independent references for the Hessian tests: losses written with torch.nn.functional, gate values set
without gradients, and finite differences."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cbo.model.gates import Gates

ARCHS = ("llama", "qwen2", "gemma3", "gpt2")


def logits_of(model, windows):
    return model(input_ids=windows, use_cache=False).logits


def teacher_logprobs(model, windows):
    with torch.no_grad():
        return F.log_softmax(logits_of(model, windows).double(), -1)


def ref_loss_per_sequence(logits, windows, loss, teacher=None):
    """(B,) per-sequence mean loss: KL(teacher || model) over all positions, or CE over T-1 positions."""
    logits = logits.double()
    if loss == "kl":
        logq = F.log_softmax(logits, -1)
        kl = F.kl_div(logq, teacher, log_target=True, reduction="none").sum(-1)
        return kl.mean(-1)
    B, T, V = logits.shape
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, V), windows[:, 1:].reshape(-1), reduction="none")
    return ce.reshape(B, T - 1).mean(-1)


def mean_loss_at(model, blocks, windows, values, loss, teacher=None):
    """Mean loss over all windows with the gates set to ``values`` (no gradients)."""
    with Gates(model, blocks, requires_grad=False) as gates, torch.no_grad():
        gates.set(torch.as_tensor(values, dtype=torch.float32))
        return float(ref_loss_per_sequence(logits_of(model, windows), windows, loss, teacher).mean())
