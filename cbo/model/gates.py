"""Scalar gates on the residual branches of a model's blocks, attached through forward hooks.

Gate ``a_i`` scales the residual branch of block ``i``: for a decoder layer
``out = in + a_i·(layer(in) − in)``; for a sublayer (an attention, Mamba, MLP or mixture-of-experts half) the
branch module's output, which *is* the residual contribution, becomes ``a_i·branch`` (a half of parallel
branches, Falcon-H1's Mamba and attention, has each of them scaled by the same ``a_i``). All gates = 1 is the original
model and ``a_i = 0`` is the model with block ``i`` removed. No model code is edited: the hooks are
removed when the context exits, also on error.

The gates can also record per-sequence gate gradients. The gradient of ``a_i`` is the dot product of
the branch output with the gradient at the gated output, so saving the branch in the forward hook and
registering a gradient hook on the gated output gives, from one backward pass of a summed loss, the
gradient of every sequence's own loss (a sequence's loss depends only on its own activations).

Example:
    >>> with gate_blocks(model, "layer") as a:          # doctest: +SKIP
    ...     set_gates(a, removed=[3, 5])                 # the model now acts as if 3 and 5 were gone
    ...     logits = model(tokens).logits
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch

from cbo.errors import CBOError, ModelError


def resolve_blocks(model: torch.nn.Module, blocks: Any = "layer") -> list:
    """A block list: ``blocks`` itself, or ``find_blocks(model, blocks)`` when given a granularity."""
    if isinstance(blocks, str):
        from cbo.model.blocks import find_blocks

        return list(find_blocks(model, blocks))
    blocks = list(blocks)
    if not blocks:
        raise ModelError("the block list is empty; pass granularity 'layer' or 'sublayer', or the blocks to gate.")
    return blocks


class _PerSequenceGrads:
    """Collects ``(B, N)`` per-sequence gate gradients from the gradient hooks of one backward pass."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.value: torch.Tensor | None = None
        self.seen: set[int] = set()

    def reset(self) -> None:
        self.value = None
        self.seen = set()

    def add(self, i: int, per_sequence: torch.Tensor) -> None:
        v = per_sequence.detach().to(torch.float64).cpu()
        if self.value is None or self.value.shape[0] != v.shape[0]:
            self.value = torch.zeros(v.shape[0], self.n, dtype=torch.float64)
        self.value[:, i] += v
        self.seen.add(i)

    def backward(
        self, scalar: torch.Tensor, a: torch.Tensor, *, retain: bool = False, allow_unused: bool = True
    ) -> torch.Tensor:
        """One backward pass of ``scalar`` (a sum of per-sequence losses) to the gates ``a``: the (B, N) float64
        per-sequence gate gradients it records."""
        self.reset()
        torch.autograd.grad(scalar, a, retain_graph=retain, allow_unused=allow_unused)
        if self.value is None:
            raise CBOError("no gate received a gradient: the blocks are not on the path from the logits to the loss.")
        return self.value


class Gates:
    """Hooks that gate every block's residual branch by one entry of the float32 leaf tensor ``a``.

    Use as a context manager (``with Gates(model, blocks) as gates``); ``gate_blocks`` is the
    functional form that yields the tensor ``a`` alone.

    Args:
        model: a Hugging Face causal LM (or any module containing the blocks).
        blocks: a list of ``cbo.model.blocks.Block``, or a granularity ``"layer"`` / ``"sublayer"``.
        requires_grad: whether ``a`` is a leaf that autograd differentiates.
    """

    def __init__(self, model: torch.nn.Module, blocks: Any = "layer", *, requires_grad: bool = True) -> None:
        self.model = model
        self.blocks = resolve_blocks(model, blocks)
        for b in self.blocks:
            if getattr(b, "part", None) not in ("layer", "attn", "mlp"):
                raise ModelError(f"block {b.name!r} is no layer or layer half; gates need blocks of find_blocks.")
        self.a = torch.ones(len(self.blocks), dtype=torch.float32, requires_grad=requires_grad)
        self._handles: list[Any] = []
        self._recorder: _PerSequenceGrads | None = None

    # ----------------------------------------------------------------- lifecycle
    def attach(self) -> Gates:
        if self._handles:
            return self
        try:
            for i, block in enumerate(self.blocks):
                for module in block.modules:
                    self._handles.append(module.register_forward_hook(self._hook(i, block), with_kwargs=True))
        except Exception:
            self.detach()
            raise
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._recorder = None

    def __enter__(self) -> Gates:
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    @property
    def n(self) -> int:
        return len(self.blocks)

    # ----------------------------------------------------------------- values
    def set(self, values: Any = None, *, removed: Iterable[int] | None = None) -> None:
        """Set the gate values (no gradient is recorded); ``removed`` = indices whose gate is 0, others 1."""
        set_gates(self.a, values, removed=removed)

    @contextmanager
    def recording(self) -> Iterator[_PerSequenceGrads]:
        """Record per-sequence gate gradients during backward passes run inside this context.

        The recorder's ``value`` is a (B, N) float64 tensor after a backward pass; call ``reset()``
        between passes that reuse one forward graph.
        """
        rec = _PerSequenceGrads(self.n)
        self._recorder = rec
        try:
            yield rec
        finally:
            self._recorder = None

    # ----------------------------------------------------------------- the hook
    def _hook(self, i: int, block: Any):
        is_layer = block.part == "layer"
        gates = self

        def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if isinstance(output, torch.Tensor):
                out, rest = output, None
            elif isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
                out, rest = output[0], output[1:]
            else:
                raise ModelError(
                    f"block {block.name!r} returned {type(output).__name__}; gates need a tensor or a tuple "
                    "whose first item is the hidden states."
                )
            if is_layer:
                inp = args[0] if args else kwargs.get("hidden_states")
                if not isinstance(inp, torch.Tensor) or inp.shape != out.shape:
                    raise ModelError(
                        f"block {block.name!r}: cannot find its input hidden states (got "
                        f"{type(inp).__name__}); a decoder layer must take the hidden states first."
                    )
                # a model split over devices (accelerate's device_map) hands a block its input on the
                # previous block's device; the hook sees it before the block's own device move
                inp = inp.to(out.device)
            a = gates.a[i]
            differentiate = torch.is_grad_enabled() and (gates.a.requires_grad or out.requires_grad)
            if not differentiate:
                # value-only passes: exact shortcuts keep a = 1 bit-identical to the original model
                # and a = 0 bit-identical to the model with the block deleted
                v = float(a)
                if v == 1.0:
                    return output
                if v == 0.0:
                    new = inp if is_layer else torch.zeros_like(out)
                else:
                    new = inp + v * (out - inp) if is_layer else v * out
            else:
                branch = out - inp if is_layer else out
                a = a.to(device=out.device, dtype=out.dtype)
                new = (inp + a * branch) if is_layer else a * out
                rec = gates._recorder
                if rec is not None and new.requires_grad:
                    saved = branch.detach()

                    def grad_hook(grad: torch.Tensor) -> None:
                        dims = tuple(range(1, grad.ndim))
                        acc = torch.promote_types(grad.dtype, torch.float32)
                        rec.add(i, (saved.to(acc) * grad.to(acc)).sum(dim=dims))

                    new.register_hook(grad_hook)
            return new if rest is None else (new, *rest)

        return hook


def set_gates(a: torch.Tensor, values: Any = None, *, removed: Iterable[int] | None = None) -> torch.Tensor:
    """Write gate values into ``a`` in place without recording gradients.

    Args:
        a: the gate tensor yielded by :func:`gate_blocks`.
        values: (N,) values, or None for all ones.
        removed: block indices whose gate is set to 0 (the others to the given values or 1).
    """
    n = a.shape[0]
    with torch.no_grad():
        if values is None:
            a.fill_(1.0)
        else:
            v = torch.as_tensor(values, dtype=torch.float32)
            if v.shape != (n,):
                raise ModelError(f"gate values have shape {tuple(v.shape)}; expected ({n},).")
            a.copy_(v)
        if removed is not None:
            idx = [int(i) for i in removed]
            bad = [i for i in idx if not 0 <= i < n]
            if bad:
                raise ModelError(f"block indices {bad} are out of range; valid: 0..{n - 1}.")
            if idx:
                a[idx] = 0.0
    return a


@contextmanager
def gate_blocks(model: torch.nn.Module, blocks: Any = "layer", *, requires_grad: bool = True) -> Iterator[torch.Tensor]:
    """Gate the residual branch of each block; yields the (N,) float32 gate tensor (all ones).

    The hooks are removed on exit, also when the body raises.
    """
    with Gates(model, blocks, requires_grad=requires_grad) as gates:
        yield gates.a
