"""MoP's short recovery fine-tune: a few optimizer steps of next-token loss on calibration windows.

A thin layer over :func:`cbo.recovery.healing` (``loss="lm"``, a constant learning rate, no gradient clipping, as
MoP's recovery is a plain LoRA fine-tune): ``method="lora"`` trains LoRA adapters on the attention and MLP
projections and merges them back (needs ``peft``; falls back to ``"full"`` without it); ``"full"`` updates
every weight. Shapes never change, so a recovered model saves and loads like the pruned one.

Example:
    >>> model = recover(model, splits.calibration, steps=10, lr=1e-4)   # doctest: +SKIP
    >>> model.config.cbo_recovery["steps"]                              # doctest: +SKIP
    10
"""

from __future__ import annotations

from typing import Any

from cbo.errors import InvalidOptionError
from cbo.extras import has_module, require
from cbo.model.forward import input_device, window_batches
from cbo.recovery.healing import heal
from cbo.width.scores.base import lm_loss

torch = require("torch", "recovery fine-tuning")

RECOVERY = ("lora", "full")


@torch.no_grad()
def lm_loss_of(model: Any, windows: Any, batch_size: int = 4) -> float:
    """Mean next-token loss of ``model`` on ``windows`` (eval mode)."""
    device = input_device(model)
    losses = [float(lm_loss(model, batch.to(device))) for _, batch in window_batches(windows, batch_size)]
    return sum(losses) / len(losses)


def recover(
    model: Any,
    windows: Any,
    *,
    steps: int = 10,
    lr: float = 1e-4,
    method: str = "lora",
    batch_size: int = 4,
    seed: int = 0,
    lora_rank: int = 8,
) -> Any:
    """A short recovery fine-tune on ``windows`` (next-token loss); returns the model (same shapes, eval mode).

    ``method="lora"`` falls back to ``"full"`` when ``peft`` is missing; ``model.config.cbo_recovery`` records
    what was done (see :meth:`cbo.recovery.healing.HealResult.record`).
    """
    if method not in RECOVERY:
        raise InvalidOptionError(f"unknown recovery method {method!r}; use one of {list(RECOVERY)}")
    if steps <= 0:
        return model
    used = method if (method != "lora" or has_module("peft")) else "full"
    batch = max(1, min(int(batch_size), int(windows.shape[0])))
    result = heal(
        model,
        None,
        windows,
        steps=steps,
        method=used,
        loss="lm",
        lr=lr,
        batch_size=batch,
        schedule="constant",
        grad_clip=0.0,
        lora_rank=lora_rank,
        seed=seed,
    )
    return result.model
