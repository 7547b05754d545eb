"""NIRVANA's NTK saliency ``|∂f/∂W · W|`` with ``f`` a scalar summary of the model output.

The method scores weights by their first-order effect on the *output*, not on the loss. Its reference
code backpropagates ``f = mean(max over the sequence of the logits)``: for every vocabulary entry the
largest logit over the positions of a window, averaged over vocabulary and batch (``output="seqmax"``,
the default). ``output="vocabmax"`` takes the max over the vocabulary at each position and averages over
positions; ``output="loss"`` uses the LM cross-entropy instead. A unit's saliency is the sum of its
weights' saliencies (L1 over the unit, as in the reference), with gradients averaged over batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbo.checks import check_choice
from cbo.errors import InvalidOptionError
from cbo.model.structures import gather_units
from cbo.width.scores.base import GradientScore, Key, lm_loss, register

OUTPUTS = ("seqmax", "vocabmax", "loss")


def output_summary(logits, output: str = "seqmax"):
    """The scalar ``f`` that NTK saliency differentiates, from logits ``(B, T, V)``."""
    if output == "seqmax":
        return logits.float().max(dim=1).values.mean()
    if output == "vocabmax":
        return logits.float().max(dim=-1).values.mean()
    raise InvalidOptionError(f"NTK output summary must be 'seqmax' or 'vocabmax', got {output!r}")


@register
class NTKScore(GradientScore):
    """``Σ_unit |∂f/∂W · W|`` (NIRVANA)."""

    name = "ntk"
    aliases = ("nirvana",)
    description = "NIRVANA: |df/dW * W| of the output summary f, summed per unit"

    @dataclass
    class Options:
        output: str = "seqmax"

        def validate(self) -> None:
            check_choice("NTK output", self.output, OUTPUTS)

    def objective(self, batch):
        if self.options.output == "loss":
            return lm_loss(self.model, batch)
        return output_summary(self.model(input_ids=batch).logits, self.options.output)

    def finalize(self) -> dict[Key, object]:
        out = {}
        for key, units in self.units.items():
            sal = self.per_weight(key, lambda w, g: (w * g).abs())
            rows = gather_units(self.structure(key), units, sal)
            out[key] = sum(r.sum(1) for _, r in rows).float()
        return out
