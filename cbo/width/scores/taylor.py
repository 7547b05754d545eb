"""First-order Taylor importance ``w · ∂L/∂w`` of the language-model loss, signed or absolute.

Removing a weight changes the loss by ``ΔL ≈ -w · ∂L/∂w`` (first order), so the *signed* importance of a
unit is ``-Σ w·∂L/∂w`` over its weights (positive: removing it raises the loss). The *absolute* variant
sums ``|w·∂L/∂w|`` (LLM-Pruner's element-wise first-order score). Gradients are averaged over the
calibration batches before the product.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbo.checks import check_choice
from cbo.model.structures import gather_units
from cbo.width.scores.base import GradientScore, Key, lm_loss, register


@register
class TaylorScore(GradientScore):
    """Taylor importance of the LM cross-entropy: ``variant="absolute"`` (default) or ``"signed"``."""

    name = "taylor"
    aliases = ("taylor1",)
    description = "first-order Taylor w·dL/dw of the LM loss, summed per unit (absolute or signed)"
    finalize_options = ("variant",)

    @dataclass
    class Options:
        variant: str = "absolute"

        def validate(self) -> None:
            check_choice("taylor variant", self.variant, ("absolute", "signed"))

    def objective(self, batch):
        return lm_loss(self.model, batch)

    def finalize(self) -> dict[Key, object]:
        out = {}
        for key, units in self.units.items():
            products = self.per_weight(key, lambda w, g: w * g)
            rows = gather_units(self.structure(key), units, products)
            if self.options.variant == "absolute":
                out[key] = sum(r.abs().sum(1) for _, r in rows).float()
            else:
                out[key] = -sum(r.sum(1) for _, r in rows).float()
        return out
