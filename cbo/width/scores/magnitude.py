"""Weight magnitude: the norm of a unit's weights (no data needed)."""

from __future__ import annotations

from dataclasses import dataclass

from cbo.checks import check_choice
from cbo.model.structures import gather_units
from cbo.width.scores.base import Key, WidthScore, register


@register
class MagnitudeScore(WidthScore):
    """``Σ|w|`` (``norm="l1"``) or ``sqrt(Σ w²)`` (``norm="l2"``) over a unit's weights (biases excluded)."""

    name = "magnitude"
    aliases = ("mag",)  # no "l1": a name that promised one norm while norm="l2" computed the other
    description = "norm of the unit's weights; data-free baseline"
    finalize_options = ("norm",)
    needs_data = False

    @dataclass
    class Options:
        norm: str = "l1"

        def validate(self) -> None:
            check_choice("magnitude norm", self.norm, ("l1", "l2"))

    def finalize(self) -> dict[Key, object]:
        out = {}
        for key, units in self.units.items():
            s = self.structure(key)
            weights = {slot.name: slot.tensor.detach() for slot in s.slots if not slot.is_bias}
            rows = gather_units(s, units, weights)
            if self.options.norm == "l1":
                out[key] = sum(r.abs().sum(1) for _, r in rows).float()
            else:
                out[key] = sum(r.pow(2).sum(1) for _, r in rows).float().sqrt()
        return out
