"""Activation magnitude (AMP, as in MoP): how large the signals a unit writes into its output projection are.

Forward pre-hooks on the output projections read their inputs: for an MLP neuron the activation that
enters ``down_proj`` (``c_proj`` / ``dense_4h_to_h``), for an attention head its slice of the input of
``o_proj`` (``c_proj`` / ``dense``), i.e. the head's attention output. Per token a head contributes the
L2 norm of its slice (``head_norm="l2"``) or the mean absolute value (``"l1"``), a neuron its absolute
value; tokens are averaged (``token_reduce="mean"``) or root-mean-squared (``"rms"``). A KV-group unit
sums its query heads. Activation scales grow with depth, so :func:`cbo.width.allocate.allocate` spends an
AMP budget uniformly (the same fraction in every layer) unless told otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbo.checks import check_choice
from cbo.errors import ModelError
from cbo.extras import require
from cbo.width.scores.base import Key, WidthScore, register

torch = require("torch", "AMP scores")


@register
class AMPScore(WidthScore):
    """Mean activation magnitude of heads and neurons (forward hooks, no gradients)."""

    name = "amp"
    aliases = ("activation",)
    description = "activation magnitude of each head / neuron at the output projection (MoP)"
    # activation scales grow with depth, so a global ranking would strip the first layers
    default_allocation = "uniform"

    @dataclass
    class Options:
        head_norm: str = "l2"
        token_reduce: str = "mean"

        def validate(self) -> None:
            check_choice("AMP head_norm", self.head_norm, ("l1", "l2"))
            check_choice("AMP token_reduce", self.token_reduce, ("mean", "rms"))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sums: dict[Key, object] = {}
        self._tokens: dict[Key, int] = {}

    def _per_token(self, key: Key, x):
        """``(tokens, n)`` magnitudes of the heads (query heads) or neurons in input ``x``."""
        s = self.structure(key)
        x = x.detach().float().reshape(-1, x.shape[-1])
        if s.kind == "mlp":
            return x.abs()
        heads = x.reshape(x.shape[0], s.n_heads, s.head_dim)
        return heads.norm(dim=-1) if self.options.head_norm == "l2" else heads.abs().mean(-1)

    def attach(self) -> None:
        for key in self.units:
            module = self.structure(key).output_projection().module

            def hook(mod, args, key=key):
                m = self._per_token(key, args[0])
                m = m.pow(2) if self.options.token_reduce == "rms" else m
                self._sums[key] = self._sums.get(key, 0) + m.sum(0)
                self._tokens[key] = self._tokens.get(key, 0) + m.shape[0]

            self.hook(module.register_forward_pre_hook(hook))

    def accumulate(self, batch) -> None:
        with torch.no_grad():
            self.model(input_ids=batch)

    def finalize(self) -> dict[Key, object]:
        out = {}
        for key, units in self.units.items():
            if key not in self._sums:
                raise ModelError(f"AMP saw no activations for layer {key[0]} {key[1]}; was the module called?")
            per = self._sums[key] / max(self._tokens[key], 1)
            if self.options.token_reduce == "rms":
                per = per.sqrt()
            out[key] = per[units.q].sum(1)  # a unit's query heads (or its one neuron)
        return out
