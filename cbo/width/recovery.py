"""A short recovery fine-tune after pruning: a few optimizer steps of next-token loss on calibration windows.

``method="lora"`` trains LoRA adapters on the attention and MLP projections and merges them back (needs
``peft``); ``"full"`` updates every weight with AdamW. Shapes never change, so a recovered model saves and
loads like the pruned one.

Example:
    >>> model = recover(model, splits.calibration, steps=10, lr=1e-4)   # doctest: +SKIP
    >>> model.config.cbo_recovery                                       # doctest: +SKIP
    {'method': 'lora', 'steps': 10, 'lr': 0.0001}
"""

from __future__ import annotations

from typing import Any

from cbo.errors import InvalidOptionError
from cbo.extras import has_module, require
from cbo.structures import model_structures
from cbo.width.scores.base import lm_loss

torch = require("torch", "recovery fine-tuning")

RECOVERY = ("lora", "full")


@torch.no_grad()
def lm_loss_of(model: Any, windows: Any, batch_size: int = 4) -> float:
    """Mean next-token loss of ``model`` on ``windows`` (eval mode)."""
    device = next(model.parameters()).device
    losses = [
        float(lm_loss(model, windows[i : i + batch_size].to(device))) for i in range(0, windows.shape[0], batch_size)
    ]
    return sum(losses) / len(losses)


def lora_targets(model: Any) -> list[str]:
    """Names (last component) of the modules that hold the prunable attention and MLP weights."""
    owners = {id(slot.module) for s in model_structures(model).all() for slot in s.slots}
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if id(module) in owners})


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

    ``method="lora"`` falls back to ``"full"`` when ``peft`` is missing; the method used is recorded in
    ``model.config.cbo_recovery``.
    """
    if method not in RECOVERY:
        raise InvalidOptionError(f"unknown recovery method {method!r}; use one of {list(RECOVERY)}")
    if steps <= 0:
        return model
    torch.manual_seed(seed)
    used = method if (method != "lora" or has_module("peft")) else "full"
    target = model
    if used == "lora":
        peft = require("peft", "LoRA recovery")
        config = peft.LoraConfig(
            r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0, target_modules=lora_targets(model)
        )
        target = peft.get_peft_model(model, config)
    params = [p for p in target.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    target.train()
    n = windows.shape[0]
    device = next(model.parameters()).device
    try:
        for i in range(steps):
            start = (i * batch_size) % n
            loss = lm_loss(target, windows[start : start + batch_size].to(device))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        target.eval()
    if used == "lora":
        model = target.merge_and_unload()
    model.eval()
    model.config.cbo_recovery = {"method": used, "steps": steps, "lr": lr}
    return model
