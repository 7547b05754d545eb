"""Baselines read from the residual stream in one pass: block influence (ShortGPT) and angular distance.

* ``block_influence`` (ShortGPT, Men et al. 2024): ``BI_i = 1 − mean_t cos(h_i[t], h_{i+1}[t])`` over every
  token of the calibration windows, ``h_i`` the residual stream entering block ``i``; remove the M lowest.
* ``angular`` (Gromov et al., "The Unreasonable Ineffectiveness of the Deeper Layers"):
  ``d(ℓ, n) = arccos(cos(h_ℓ[T], h_{ℓ+n}[T])) / π`` on the last token, averaged over the calibration windows;
  remove the contiguous run ``ℓ*, …, ℓ*+n−1`` with ``n = M`` and ``ℓ* = argmin_ℓ d(ℓ, n)``.

The residual states are read with forward hooks on the decoder layers (and on the attention branch for
sublayers), not from ``output_hidden_states``: Hugging Face models return the last layer's output *after*
the final norm there.
"""

from __future__ import annotations

import itertools
import math
from abc import abstractmethod
from typing import Any

import numpy as np

from cbo.baselines.base import BASELINES, Baseline, RankContext
from cbo.baselines.ranking import Ranking
from cbo.errors import ModelError
from cbo.extras import require
from cbo.model.forward import input_device, window_batches

torch = require("torch", "depth baselines")


class _ResidualStates:
    """Forward hooks that read the residual stream at every block boundary; removed on exit, also on error.

    For each forward pass, ``states()`` gives ``N + 1`` tensors ``(B, T, d)``: the stream entering block 0, 1,
    …, and the last block's output. Layer granularity: layer inputs and the last layer's output. Sublayer
    granularity: layer input, layer input + attention branch, layer output, for every layer.
    """

    def __init__(self, model: Any, granularity: str) -> None:
        from cbo.model.blocks import decoder_layers, layer_parts

        self.layers, _ = decoder_layers(model)
        self.parts = [layer_parts(layer, model) for layer in self.layers] if granularity == "sublayer" else None
        self._handles: list[Any] = []
        self.inputs: dict[int, Any] = {}
        self.outputs: dict[int, Any] = {}
        self.attn: dict[int, Any] = {}

    def __enter__(self) -> _ResidualStates:
        from cbo.model.blocks import branch_tensor

        def pre(k: int):
            def hook(module: Any, args: tuple, kwargs: dict) -> None:
                h = args[0] if args else kwargs.get("hidden_states")
                if not isinstance(h, torch.Tensor):
                    raise ModelError(f"decoder layer {k} was not called with the hidden states first")
                self.inputs[k] = h.detach()

            return hook

        def post(k: int, store: dict[int, Any], add: bool = False):
            def hook(module: Any, args: tuple, output: Any) -> None:
                branch = branch_tensor(output).detach()
                store[k] = store[k] + branch if add and k in store else branch

            return hook

        try:
            for k, layer in enumerate(self.layers):
                self._handles.append(layer.register_forward_pre_hook(pre(k), with_kwargs=True))
                self._handles.append(layer.register_forward_hook(post(k, self.outputs)))
                if self.parts is not None and self.parts[k]["mlp"] is not None:  # a single-branch layer: one block
                    for branch in self.parts[k]["attn_branches"]:  # parallel branches (Falcon-H1) add up
                        self._handles.append(branch.register_forward_hook(post(k, self.attn, add=True)))
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def states(self) -> list[Any]:
        n = len(self.layers)
        missing = [k for k in range(n) if k not in self.inputs or k not in self.outputs]
        if missing:
            raise ModelError(f"decoder layers {missing[:5]} were not run in the forward pass")
        out = []
        for k in range(n):
            out.append(self.inputs[k])
            if self.parts is not None and self.parts[k]["mlp"] is not None:
                out.append(self.inputs[k] + self.attn[k])
        out.append(self.outputs[n - 1])
        for store in (self.inputs, self.outputs, self.attn):
            store.clear()  # the hooks hold these dicts
        return out


def residual_statistics(model: Any, windows: Any, granularity: str = "layer", *, batch_size: int = 8) -> dict:
    """One pass over the windows: mean token cosine between consecutive block boundaries, and last-token states.

    Returns:
        ``{"cos": (N,) mean over all tokens of cos(h_i, h_{i+1}), "last": (B, N+1, d) float64 last-token states,
        "forward": passes}``.

    Example:
        >>> stats = residual_statistics(model, windows)            # doctest: +SKIP
        >>> 1.0 - stats["cos"]                                     # block influence per layer  # doctest: +SKIP
    """
    model.eval()
    cos_sum, n_tok, last, passes = None, 0, [], 0
    device = input_device(model)
    with torch.no_grad(), _ResidualStates(model, granularity) as rec:
        for _, batch in window_batches(windows, batch_size):
            model(input_ids=batch.to(device), use_cache=False)
            passes += 1
            states = [s.to(torch.float64) for s in rec.states()]
            cos = torch.stack(
                [torch.nn.functional.cosine_similarity(a, b, dim=-1).sum() for a, b in itertools.pairwise(states)]
            )
            cos_sum = cos if cos_sum is None else cos_sum + cos
            n_tok += batch.numel()
            last.append(torch.stack([s[:, -1] for s in states], dim=1).cpu())
    assert cos_sum is not None
    return {"cos": (cos_sum / n_tok).cpu().numpy(), "last": torch.cat(last).numpy(), "forward": passes}


def angular_distances(last_states: np.ndarray) -> np.ndarray:
    """``D[a, b]`` = mean over windows of ``arccos(cos(h_a, h_b)) / π`` of the last-token states ``(B, N+1, d)``."""
    x = np.asarray(last_states, dtype=np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-300)
    cos = np.einsum("bid,bjd->bij", x, x)
    return (np.arccos(np.clip(cos, -1.0, 1.0)) / math.pi).mean(axis=0)


class ResidualBaseline(Baseline):
    """A baseline computed from one pass of :func:`residual_statistics`; subclasses define ``from_statistics``."""

    def rank(self, ctx: RankContext) -> Ranking:
        stats = residual_statistics(ctx.model, ctx.windows, ctx.granularity, batch_size=ctx.batch_size)
        r = self.from_statistics(ctx, stats)
        r.passes["forward"] = stats["forward"]
        return r

    @abstractmethod
    def from_statistics(self, ctx: RankContext, stats: dict) -> Ranking:
        """The ranking from the statistics of :func:`residual_statistics`."""


@BASELINES.register
class BlockInfluence(ResidualBaseline):
    """ShortGPT's block influence: one pass, remove the blocks that change the residual stream least."""

    name = "block_influence"
    description = "ShortGPT: remove the M blocks with the lowest 1 − mean cos(input, output)"

    def from_statistics(self, ctx: RankContext, stats: dict) -> Ranking:
        bi = 1.0 - stats["cos"]
        r = ctx.ranking(scores=ctx.masked(bi))
        r.info["block_influence"] = [float(v) for v in bi]
        return r


@BASELINES.register
class Angular(ResidualBaseline):
    """Gromov et al.'s angular distance: remove the contiguous run across which the last token turns least."""

    name = "angular"
    description = "Gromov et al.: remove the contiguous run whose last-token angular distance is smallest"

    def from_statistics(self, ctx: RankContext, stats: dict) -> Ranking:
        return ctx.ranking(distances=angular_distances(stats["last"]))
