"""Taylor+ (Shortened LLaMA, Kim et al. 2024): remove the blocks whose weights matter least to first order.

``I_i = Σ_{w in block i} |w · ∂L/∂w|`` with L the mean next-token cross-entropy of the calibration windows;
remove the M smallest. The "+" keeps the first four and the last two blocks (``protect=(4, 2)``);
``protect=(0, 0)`` (or None) is plain Taylor. At sublayer granularity a block is an attention or MLP half with
the norms only it uses, and the protected blocks are the halves of the protected layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cbo.baselines.base import BASELINES, Baseline, RankContext
from cbo.baselines.ranking import Ranking
from cbo.checks import is_int
from cbo.errors import InvalidOptionError
from cbo.extras import require
from cbo.model.forward import input_device, window_batches

torch = require("torch", "depth baselines")

TAYLOR_PROTECT = (4, 2)  # Taylor+: the first four and the last two blocks are never removed


def block_param_modules(model: Any, block: Any) -> list[Any]:
    """The modules whose parameters a block's removal deletes (a layer; or a half and the norms only it uses)."""
    from cbo.model.blocks import decoder_layers, layer_parts

    if block.part == "layer":
        return [block.module]
    layer = decoder_layers(model)[0][block.layer]
    parts = layer_parts(layer, model)
    part = block.part
    return [*parts[f"{part}_modules"]] + [getattr(layer, n) for n in parts[f"{part}_norms"]]


def taylor_importance(
    model: Any, windows: Any, blocks: Sequence[Any], *, batch_size: int = 8
) -> tuple[np.ndarray, int]:
    """``Σ_{w in block} |w · ∂L/∂w|`` per block, L the mean next-token cross-entropy of the windows.

    Returns:
        ``(importance (N,), backward passes)``. Parameter gradients, ``requires_grad`` flags and the training
        mode are restored to their previous state, also on error.

    Example:
        >>> importance, passes = taylor_importance(model, windows, find_blocks(model))   # doctest: +SKIP
    """
    from cbo.model.forward import model_logits

    params = list(model.parameters())
    saved = [(p, p.requires_grad, p.grad) for p in params]
    n_pred = windows.shape[0] * (windows.shape[1] - 1)
    device = input_device(model)
    passes = 0
    was_training = model.training
    model.eval()
    try:
        for p in params:
            p.requires_grad_(True)
            p.grad = None
        with torch.enable_grad():
            for _, batch in window_batches(windows, batch_size):
                batch = batch.to(device)
                logits = model_logits(model, batch).float()
                target = batch[:, 1:]
                nll = torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum"
                )
                (nll / n_pred).backward()
                passes += 1
        out = np.zeros(len(blocks))
        for k, block in enumerate(blocks):
            seen: set[int] = set()
            total = torch.zeros((), dtype=torch.float64)
            for module in block_param_modules(model, block):
                for p in module.parameters():
                    if id(p) in seen or p.grad is None:
                        continue
                    seen.add(id(p))
                    total += (p.detach().to(torch.float64) * p.grad.to(torch.float64)).abs().sum().cpu()
            out[k] = float(total)
    finally:
        for p, flag, grad in saved:
            p.grad = grad
            p.requires_grad_(flag)
        model.train(was_training)
    return out, passes


def protected_blocks(blocks: Sequence[Any], protect: tuple[int, int] | None) -> set[int]:
    """Indices of the blocks in the first ``protect[0]`` and the last ``protect[1]`` decoder layers."""
    if protect is None:
        return set()
    first, last = protect
    n_layers = 1 + max(b.layer for b in blocks)
    layers = set(range(min(first, n_layers))) | set(range(max(0, n_layers - last), n_layers))
    return {i for i, b in enumerate(blocks) if b.layer in layers}


@BASELINES.register
class Taylor(Baseline):
    """Taylor+ importance from one backward pass per batch; the first and last blocks protected."""

    name = "taylor"
    description = "Taylor+ (Shortened LLaMA): remove the M blocks with the smallest Σ|w·∂L/∂w|"

    @dataclass
    class Options:
        protect: Any = TAYLOR_PROTECT  # (first, last) layers never removed; None or (0, 0): plain Taylor

        def validate(self) -> None:
            if self.protect is None:
                return
            try:
                first, last = self.protect
                ok = all(is_int(v) and v >= 0 for v in (first, last))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise InvalidOptionError(
                    f"taylor: protect must be two integers >= 0 (first, last layers kept) or None, got {self.protect!r}."
                )
            self.protect = (int(first), int(last))

    def rank(self, ctx: RankContext) -> Ranking:
        protect = self.options.protect
        importance, backward = taylor_importance(ctx.model, ctx.windows, ctx.blocks, batch_size=ctx.batch_size)
        r = ctx.ranking(scores=ctx.masked(importance, protected_blocks(ctx.blocks, protect)))
        r.passes.update({"forward": backward, "backward": backward})
        r.info.update({"importance": [float(v) for v in importance], "protect": list(protect or (0, 0))})
        return r
