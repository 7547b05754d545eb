"""The final norm and head of a causal LM run on given last-layer streams, a few positions at a time.

A model's logits are ``(B, T, V)``; with a large vocabulary they outweigh the model (Gemma 3: 262k tokens, one
float32 tensor for 8 windows of 128 tokens is 1.07 GB). Every loss CBO computes (KL, cross-entropy, agreement)
is a sum over positions, so it is computed here over chunks of positions whose logits fit in
:data:`CHUNK_BYTES`: the decoder layers run once, their output stream is kept (``(B, T, d)``, small), and the
model's own forward runs the final norm, the head and whatever follows (soft-capping) on one slice of the
stream at a time, with the decoder-layer list swapped for a one-module list that hands back that slice.

Example:
    >>> for start, logits in position_logits(model, tokens):          # doctest: +SKIP
    ...     loss += chunk_loss(logits, tokens[:, start : start + logits.shape[1]])
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from cbo.extras import require
from cbo.model.blocks import decoder_layers
from cbo.model.forward import model_logits

torch = require("torch", "running a model's head")

# the most bytes of float32 logits one chunk of positions holds (at least one position per chunk)
CHUNK_BYTES = 128 * 2**20
# relative tolerance of the check that the head run on a stream reproduces the model's own logits
CHECK_RTOL = 1e-4


def chunk_positions(batch: int, seq_len: int, vocab: int, max_bytes: int | None = None) -> int:
    """Positions per chunk: as many as keep ``batch x positions x vocab`` float32 logits under ``max_bytes``
    (default :data:`CHUNK_BYTES`)."""
    max_bytes = CHUNK_BYTES if max_bytes is None else max_bytes
    return max(1, min(seq_len, int(max_bytes) // max(1, 4 * batch * vocab)))


def first_tensor(output: Any) -> tuple[Any, tuple | None]:
    """A module output's first tensor and the rest of its tuple (None for a bare tensor)."""
    if isinstance(output, torch.Tensor):
        return output, None
    return output[0], tuple(output[1:])


class Inject(torch.nn.Module):
    """Stands in for the whole decoder-layer list: returns a given stream in the last layer's output format.

    ``like``: the layer it stands for, whose plain attributes (``block_type``...) it copies: some models' forward
    reads them from each layer (Nemotron-H picks each layer's mask by its ``block_type``).
    """

    def __init__(self, state: Any, rest: tuple | None, like: Any = None) -> None:
        super().__init__()
        for key, value in vars(like).items() if like is not None else ():
            if not key.startswith("_") and key != "training" and isinstance(value, (str, int, float, bool)):
                setattr(self, key, value)
        self.state = state
        self.rest = rest

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.state if self.rest is None else (self.state, *self.rest)


def keep_last_kwarg(model: Any) -> str | None:
    """The name of the forward argument that limits the head to the last positions, if the model has one."""
    params = inspect.signature(model.forward).parameters
    return next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in params), None)


class Head:
    """Runs the part of a model after its decoder layers on slices of a last-layer stream.

    Args:
        model: the causal LM.
        tokens: the (B, T) windows the stream belongs to (the forward needs them for its shapes and masks).
        rest: the rest of the last decoder layer's output tuple (None when it returns a bare tensor).
    """

    def __init__(self, model: Any, tokens: Any, rest: tuple | None = None) -> None:
        self.model = model
        self.tokens = tokens
        self.rest = rest
        layers, path = decoder_layers(model)
        parent_path, _, self.attr = path.rpartition(".")
        self.parent = model.get_submodule(parent_path) if parent_path else model
        vocab = model.get_output_embeddings().out_features if model.get_output_embeddings() is not None else 1
        self.chunk = chunk_positions(tokens.shape[0], tokens.shape[1], vocab)
        self.sliceable = True

    def logits(self, state: Any, start: int = 0, stop: int | None = None) -> Any:
        """Logits ``(B, stop - start, V)`` of the model whose last decoder layer outputs ``state`` (B, T, d).

        Models whose forward reshapes the stream to the input's shape after the layers (GPT-2) cannot run on a
        slice; for those the head runs on every position and the slice is cut from its logits (``sliceable``
        turns False and chunks span the whole window).
        """
        t = state.shape[1]
        stop = t if stop is None else stop
        if self.sliceable or (start, stop) == (0, t):
            try:
                return self.run(state[:, start:stop])
            except RuntimeError:
                if (start, stop) == (0, t):
                    raise
                self.sliceable = False
                self.chunk = t
        return self.run(state)[:, start:stop]

    def run(self, piece: Any) -> Any:
        """The model's forward after its decoder layers, on ``piece`` as the last layer's output."""
        original = getattr(self.parent, self.attr)
        setattr(self.parent, self.attr, torch.nn.ModuleList([Inject(piece, self.rest, original[-1])]))
        try:
            return model_logits(self.model, self.tokens)
        finally:
            setattr(self.parent, self.attr, original)

    def chunks(self, state: Any) -> Iterator[tuple[int, Any]]:
        """``(start, logits of positions start..start + chunk)`` over every position of ``state``."""
        t, start = state.shape[1], 0
        while start < t:
            stop = min(start + self.chunk, t)
            yield start, self.logits(state, start, stop)
            start = stop


def last_stream(model: Any, tokens: Any, keep: int = 1) -> tuple[Any, tuple | None, Any]:
    """One forward pass that keeps the last decoder layer's output instead of the full logits.

    Returns:
        ``(stream (B, T, d), rest of the last layer's output tuple, logits of the last ``keep`` positions)``; the
        head runs on the last ``keep`` positions only where the model's forward can limit it (``logits_to_keep``),
        on all of them (then sliced) otherwise.
    """
    layers, _ = decoder_layers(model)
    seen: dict[str, Any] = {}

    def hook(module: Any, args: tuple, output: Any) -> None:
        seen["state"], seen["rest"] = first_tensor(output)

    handle = layers[-1].register_forward_hook(hook)
    try:
        kwarg = keep_last_kwarg(model)
        extra = {kwarg: keep} if kwarg is not None else {}
        out = model(input_ids=tokens, use_cache=False, **extra)
        logits = out.logits if hasattr(out, "logits") else out[0]
    finally:
        handle.remove()
    return seen["state"], seen["rest"], logits[:, -keep:]


def position_logits(model: Any, tokens: Any) -> Iterator[tuple[int, Any]]:
    """``(start, logits (B, c, V))`` of a causal LM over chunks of positions, never all ``T`` at once.

    Falls back to one full forward (sliced) for models whose decoder-layer list cannot be found.
    """
    from cbo.errors import ModelError

    try:
        head = Head(model, tokens)
    except (ModelError, AttributeError):
        logits = model_logits(model, tokens)
        step = chunk_positions(tokens.shape[0], tokens.shape[1], logits.shape[-1])
        for start in range(0, tokens.shape[1], step):
            yield start, logits[:, start : start + step]
        return
    state, rest, last = last_stream(model, tokens)
    head.rest = rest
    t = tokens.shape[1]
    again = head.logits(state, t - 1, t).detach()
    last = last.detach()
    scale = float(last.abs().max()) + 1.0
    if again.shape != last.shape or float((again - last).abs().max()) > CHECK_RTOL * scale:
        # something between the decoder layers and the head that the stand-in does not reproduce: full logits
        logits = model_logits(model, tokens)
        for start in range(0, t, head.chunk):
            yield start, logits[:, start : start + head.chunk]
        return
    yield from head.chunks(state)
