"""Removal losses of one batch through a prefix tree of recorded residual streams (the engine of the measurer).

``RemovalLosses(model, blocks, tokens)`` runs the original model once on a batch and keeps the teacher
distribution, the residual stream entering every decoder layer, and the keyword arguments each layer was
called with (masks, positions, rotary tables: they depend on the positions only, not on the hidden states).
A removal set is a list of *events*: per decoder layer, which of its halves are gone (the attention half, the
MLP half, or both: the whole layer). Sets sorted by their events share the stream computed up to their first
difference, and a set is only run from there on:

* a layer with both halves removed passes its input stream to the next layer unchanged, which is exactly what
  deleting the layer does;
* a layer with one half removed runs with that half's module swapped for a stand-in that returns zeros in the
  module's own output format, which is exactly what zeroing the half does (``cbo.surgery.depth`` does the same
  for good);
* the final norm and head run on the last stream through the model's own forward, with the decoder layers
  swapped for a one-module list that hands back that stream.

The values equal those of the surgically pruned model up to floating-point rounding; a set of deep blocks costs
a fraction of a forward pass. On every batch the replay is checked against the original logits (the last
layer and the head) and, for halves, against the gated pass (the half's branch output zeroed by a hook); a
model that fails the check, or whose layers cannot be replayed this way, falls back to one full gated forward
pass per set.

Work is counted in calls and in ``cost``: forward-pass equivalents of this batch, each call weighted by the
parameters it runs (a decoder layer, a layer without one half, the head) relative to a full forward.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from cbo.errors import ModelError
from cbo.measure.losses import accumulation_dtype
from cbo.model.blocks import branch_tensor, decoder_layers, layer_parts, with_branch_tensor
from cbo.model.gates import Gates
from cbo.model.head import Head, first_tensor, keep_last_kwarg, position_logits

# which halves of a decoder layer a block removes
ATTN, MLP, WHOLE = 1, 2, 3
PART_MASK = {"attn": ATTN, "mlp": MLP, "layer": WHOLE}
PART_OF_MASK = {ATTN: "attn", MLP: "mlp"}
CHECK_RTOL = 1e-4
# the version of the measured values: caches of measured losses, and of the QUBOs built from them, are keyed by it
# (2: the KL summed as Σ p (log p − log q), exact to float32 rounding)
VERSION = 2


def removal_events(blocks: Sequence[Any], removed: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """``((layer, mask), ...)`` sorted by layer: the halves each decoder layer loses when ``removed`` go."""
    masks: dict[int, int] = {}
    for i in removed:
        b = blocks[i]
        masks[b.layer] = masks.get(b.layer, 0) | PART_MASK[b.part]
    return tuple(sorted(masks.items()))


def parameter_count(module: Any) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


class ZeroStandIn(torch.nn.Module):
    """Stands in for a removed attention or MLP module: zeros of its input's shape, in its output format."""

    def __init__(self, tuple_length: int | None) -> None:
        super().__init__()
        self.tuple_length = tuple_length

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        h = args[0] if args else kwargs.get("hidden_states")
        if h is None:
            h = next(v for v in kwargs.values() if isinstance(v, torch.Tensor))
        zeros = torch.zeros_like(h)
        return zeros if self.tuple_length is None else (zeros, *([None] * (self.tuple_length - 1)))


class RemovalLosses:
    """Per-sequence losses (KL to the original, cross-entropy, next-token agreement) of one batch with sets of
    blocks removed.

    Args:
        model: the causal LM (eval mode; gates of an estimator may be attached at 1).
        blocks: the block list (``cbo.model.blocks.find_blocks``: layers, attention/MLP halves, or a mix); removal sets
            index into it.
        tokens: (B, T) token windows of one batch, on the model's input device.
        prefix: use the prefix tree; False forces one full gated pass per set.
        cache: a ``MeasureCache`` (values found there are not measured again).

    Attributes:
        base: ``{"kl": zeros, "ce": (B,), "agree": ones}`` losses of the original model.
        layer_calls / tail_calls / full_calls / original_calls: work done (decoder-layer calls, head runs, full
            gated passes, original passes); ``cost``: all of it in forward passes of this batch.
        measured: set measurements computed (not found in the cache); ``cached``: found in the cache.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        blocks: Sequence[Any],
        tokens: torch.Tensor,
        *,
        prefix: bool = True,
        cache: Any = None,
    ):
        self.model = model
        self.blocks = list(blocks)
        self.tokens = tokens
        self.prefix = prefix
        self.cache = cache.batch(tokens) if cache is not None else None
        self.layer_calls = 0
        self.tail_calls = 0
        self.full_calls = 0
        self.original_calls = 0
        self.measured = 0
        self.cached = 0
        self.cost = 0.0
        self.replay = False
        self._ready = False

    # ------------------------------------------------------------------ the original pass
    def _prepare(self) -> None:
        """The original pass (teacher, streams, call arguments); run on the first set not found in the cache."""
        if self._ready:
            return
        self._ready = True
        model, tokens = self.model, self.tokens
        layers, _ = decoder_layers(model)
        self.layers = layers
        self.n_layers = len(layers)
        self._weights(layers)
        self.replay = self.prefix and all(b.part in PART_MASK for b in self.blocks)
        halves = sorted({(b.layer, PART_MASK[b.part]) for b in self.blocks if PART_MASK.get(b.part) in (ATTN, MLP)})
        self._parts: dict[int, dict[str, Any]] = {}
        if self.replay and halves:
            try:
                self._parts = {layer: layer_parts(layers[layer], model) for layer, _ in halves}
            except ModelError:  # layers that cannot be split into halves are measured by full passes
                self.replay = False
        self.states: list[torch.Tensor] = []
        self.calls: list[tuple[tuple, dict]] = []
        self._rest: tuple | None = None
        self._formats: dict[tuple[int, str], int | None] = {}  # (layer, module name): tuple length or None
        self.original_calls += 1
        self.cost += 1.0
        with torch.no_grad():
            last = self._record() if self.replay else None
            if self.replay:
                self._head = Head(model, tokens, self._rest)
                self._teach(self._head.chunks(self.states[self.n_layers]))
                if not self._replay_matches(last):
                    self.replay = False
            else:
                self._teach(position_logits(model, tokens))
            del last

    def _teach(self, chunks: Iterable[tuple[int, torch.Tensor]]) -> None:
        """The teacher from the original's logits, chunk by chunk: its probabilities, negative entropy and top
        token per position, and the original's own losses.

        KL(p || q) = Σ p log p − Σ p log q: the teacher enters through p and its negative entropy only, so it is
        kept once per batch and each set costs one logsumexp and one sum over the vocabulary.
        """
        b, t = self.tokens.shape
        self._p = self._neg_entropy = self._top = None
        nll = torch.zeros(b, dtype=torch.float64)
        for start, logits in chunks:
            teacher = torch.log_softmax(logits.to(accumulation_dtype(logits.dtype)), dim=-1)
            stop = start + teacher.shape[1]
            if self._p is None:
                self._p = torch.empty((b, t, teacher.shape[-1]), dtype=teacher.dtype, device=teacher.device)
                self._neg_entropy = torch.empty((b, t), dtype=teacher.dtype, device=teacher.device)
                self._top = torch.empty((b, t), dtype=torch.int64, device=teacher.device)
            p = teacher.exp()
            self._p[:, start:stop] = p
            self._neg_entropy[:, start:stop] = (p * teacher).sum(-1)
            self._top[:, start:stop] = logits.argmax(-1)
            nll += self._target_nll(teacher, start).double().cpu()
            del p, teacher
        ce = (nll / (t - 1)).float()
        self._base = {"kl": torch.zeros(b), "ce": ce, "agree": torch.ones(b)}

    def _target_nll(self, logq: torch.Tensor, start: int) -> torch.Tensor:
        """(B,) summed next-token NLL of the chunk's positions (log-probs ``logq`` of positions start..)."""
        t = self.tokens.shape[1]
        predicting = min(start + logq.shape[1], t - 1) - start
        if predicting <= 0:
            return torch.zeros(logq.shape[0], dtype=logq.dtype, device=logq.device)
        target = self.tokens[:, start + 1 : start + 1 + predicting].to(logq.device).unsqueeze(-1)
        return -logq[:, :predicting].gather(-1, target).squeeze(-1).sum(-1)

    def _weights(self, layers: Any) -> None:
        """Parameter counts that weight each kind of call against one full forward pass."""
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        self._layer_params = [parameter_count(layer) for layer in layers]
        self._head_params = parameter_count(head) if head is not None else 0
        self._full_params = max(sum(self._layer_params) + self._head_params, 1)

    def _record(self) -> torch.Tensor | None:
        """Original forward pass that records each layer's input stream, call arguments and the last output,
        and the output format of every half that removal sets may replace.

        Returns the original's logits of the last positions (the head runs on those only where the model allows
        it), for the replay check; None when the layers could not be recorded (then ``replay`` is False)."""
        states: dict[int, torch.Tensor] = {}
        calls: dict[int, tuple[tuple, dict]] = {}
        handles = []

        def pre(k: int):
            def hook(module: Any, args: tuple, kwargs: dict) -> None:
                h = args[0] if args else kwargs.get("hidden_states")
                states[k] = h
                rest = {key: v for key, v in kwargs.items() if key != "hidden_states"}
                calls[k] = (tuple(args[1:]), rest)

            return hook

        def post(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
            out, rest = first_tensor(output)
            states[self.n_layers] = out
            self._rest = rest

        def fmt(key: tuple[int, str]):
            def hook(module: Any, args: tuple, output: Any) -> None:
                self._formats[key] = len(output) if isinstance(output, tuple) else None

            return hook

        try:
            for k, layer in enumerate(self.layers):
                handles.append(layer.register_forward_pre_hook(pre(k), with_kwargs=True))
            handles.append(self.layers[-1].register_forward_hook(post, with_kwargs=True))
            for layer, parts in self._parts.items():
                for part in ("attn", "mlp"):
                    for name, module in zip(parts[f"{part}_names"], parts[f"{part}_modules"]):
                        handles.append(module.register_forward_hook(fmt((layer, name))))
            kwarg = keep_last_kwarg(self.model)
            t = self.tokens.shape[1]
            keep = min(t, max(1, Head(self.model, self.tokens).chunk))
            out = self.model(input_ids=self.tokens, use_cache=False, **({kwarg: keep} if kwarg else {}))
            logits = (out.logits if hasattr(out, "logits") else out[0])[:, -keep:]
        finally:
            for h in handles:
                h.remove()
        if len(states) != self.n_layers + 1 or not all(isinstance(s, torch.Tensor) for s in states.values()):
            self.replay = False
            return None
        self.states = [states[k] for k in range(self.n_layers + 1)]
        self.calls = [calls[k] for k in range(self.n_layers)]
        return logits

    # ------------------------------------------------------------------ replay
    def _layer(self, k: int, h: torch.Tensor, mask: int = 0) -> torch.Tensor:
        """Decoder layer k on stream h, with the halves in ``mask`` removed (both: the stream passes through)."""
        if mask == WHOLE:
            return h
        args, kwargs = self.calls[k]
        self.layer_calls += 1
        if not mask:
            self.cost += self._layer_params[k] / self._full_params
            return first_tensor(self.layers[k](h, *args, **kwargs))[0]
        parts, part = self._parts[k], PART_OF_MASK[mask]
        layer, names = self.layers[k], parts[f"{part}_names"]
        originals = [getattr(layer, name) for name in names]
        self.cost += (self._layer_params[k] - sum(map(parameter_count, originals))) / self._full_params
        for name in names:
            setattr(layer, name, ZeroStandIn(self._formats.get((k, name))))
        try:
            return first_tensor(layer(h, *args, **kwargs))[0]
        finally:
            for name, original in zip(names, originals):
                setattr(layer, name, original)

    def _tail(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """Losses of the model whose last decoder layer outputs ``h`` (final norm and head only, a few positions
        at a time)."""
        self.tail_calls += 1
        self.cost += self._head_params / self._full_params
        return self._losses_of(self._head.chunks(h))

    def _gated_layer(self, k: int, part: str) -> torch.Tensor:
        """Reference for a half's stand-in: layer k with that half's branch output zeroed by a hook."""

        def zero(module: Any, args: tuple, output: Any) -> Any:
            return with_branch_tensor(output, torch.zeros_like(branch_tensor(output)))

        handles = [branch.register_forward_hook(zero) for branch in self._parts[k][f"{part}_branches"]]
        try:
            return self._layer(k, self.states[k])
        finally:
            for handle in handles:
                handle.remove()

    def _replay_matches(self, last: torch.Tensor) -> bool:
        """The replayed last layer and the injected head reproduce the original logits (``last``: those of the
        last positions), and every kind of half in the block list gives, replayed with its stand-in, what the
        gated pass gives."""
        t = self.tokens.shape[1]
        try:
            out = self._layer(self.n_layers - 1, self.states[self.n_layers - 1])
            self.tail_calls += 1
            self.cost += self._head_params / self._full_params
            again = self._head.logits(out, t - last.shape[1], t)
            checks = []
            for mask in (ATTN, MLP):
                layers = [
                    k for k in self._parts if any(PART_MASK[b.part] == mask and b.layer == k for b in self.blocks)
                ]
                if layers:
                    k = max(layers)
                    checks.append((self._layer(k, self.states[k], mask), self._gated_layer(k, PART_OF_MASK[mask])))
        except Exception:  # noqa: BLE001 - any failure means this model cannot be replayed; use full passes
            return False
        scale = float(last.abs().max()) + 1.0
        if again.shape != last.shape or float((again - last).abs().max()) > CHECK_RTOL * scale:
            return False
        for got, want in checks:
            tol = CHECK_RTOL * (float(want.abs().max()) + 1.0)
            if got.shape != want.shape or float((got - want).abs().max()) > tol:
                return False
        return True

    # ------------------------------------------------------------------ losses
    def _losses_of(self, chunks: Iterable[tuple[int, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Per-sequence KL to the teacher, cross-entropy and agreement from a set's logits, chunk by chunk."""
        b, t = self.tokens.shape
        kl = torch.zeros(b, dtype=torch.float64)
        nll = torch.zeros(b, dtype=torch.float64)
        agree = torch.zeros(b, dtype=torch.float64)
        for start, logits in chunks:
            z = logits.to(self._p.dtype)
            stop = start + z.shape[1]
            lse = torch.logsumexp(z, dim=-1)
            # Σ p log q with log q = z − logsumexp(z), one window at a time (a (c, V) temporary): summing terms of
            # the size of log q keeps float32 to rounding, where Σ p z and logsumexp(z) apart are two numbers of the
            # size of the logits whose difference is the answer (0.2 % off on the default model's 49k vocabulary)
            p = self._p[:, start:stop]
            cross = torch.stack([(pb * (zb - lb.unsqueeze(-1))).sum(-1) for pb, zb, lb in zip(p, z, lse)])
            kl += (self._neg_entropy[:, start:stop] - cross).sum(-1).double().cpu()
            nll += self._target_nll(z - lse.unsqueeze(-1), start).double().cpu()
            agree += (z.argmax(-1) == self._top[:, start:stop]).sum(-1).double().cpu()
            del z, lse, cross
        return {"kl": (kl / t).float(), "ce": (nll / (t - 1)).float(), "agree": (agree / t).float()}

    def _full(self, removed: Sequence[int]) -> dict[str, torch.Tensor]:
        with Gates(self.model, self.blocks, requires_grad=False) as gates:
            gates.set(removed=removed)
            self.full_calls += 1
            self.cost += 1.0
            return self._losses_of(position_logits(self.model, self.tokens))

    @property
    def base(self) -> dict[str, torch.Tensor]:
        """Losses of the original model (KL 0, agreement 1)."""
        if self.cache is not None and () in self.cache:
            return self.cache[()]
        self._prepare()
        if self.cache is not None:
            self.cache.update({(): self._base})
        return {k: v.clone() for k, v in self._base.items()}

    def losses(self, sets: Iterable[Iterable[int]]) -> list[dict[str, torch.Tensor]]:
        """``[{"kl": (B,), "ce": (B,), "agree": (B,)}]`` per-sequence losses of each removal set, in order."""
        keys = [tuple(sorted({int(i) for i in s})) for s in sets]
        for key in keys:
            bad = [i for i in key if not 0 <= i < len(self.blocks)]
            if bad:
                raise IndexError(f"block indices {bad} are out of range 0..{len(self.blocks) - 1}")
        out: dict[tuple[int, ...], dict[str, torch.Tensor]] = {}
        if self.cache is not None:
            for key in dict.fromkeys(keys):
                if key in self.cache:
                    out[key] = self.cache[key]
                    self.cached += 1
        missing = [k for k in dict.fromkeys(keys) if k not in out]
        if missing:
            self._prepare()
        with torch.no_grad():
            events: dict[tuple[tuple[int, int], ...], list[tuple[int, ...]]] = {}
            for key in missing:
                self.measured += 1
                if not key:
                    out[key] = {k: v.clone() for k, v in self._base.items()}
                elif self.replay:
                    events.setdefault(removal_events(self.blocks, key), []).append(key)
                else:
                    out[key] = self._full(key)
            if events:
                for ev, value in self._tree(list(events)).items():
                    for key in events[ev]:
                        out[key] = value
        if self.cache is not None and missing:
            self.cache.update({k: out[k] for k in missing})
        return [out[k] for k in keys]

    def _tree(self, sets: list[tuple[tuple[int, int], ...]]) -> dict[tuple[tuple[int, int], ...], dict]:
        """Measure event lists through a prefix tree (depth first, one stream per tree level)."""
        trie: dict[tuple, set[tuple[int, int]]] = {}
        wanted = set(sets)
        for s in sets:
            for d in range(len(s)):
                trie.setdefault(s[:d], set()).add(s[d])
        results: dict[tuple, dict[str, torch.Tensor]] = {}
        n = self.n_layers

        def visit(prefix: tuple, stream: dict[int, torch.Tensor]) -> None:
            # ``stream[L]``: the state entering layer L with ``prefix`` applied (L = n: the last layer's output)
            for event in sorted(trie.get(prefix, ())):
                q, mask = event
                node = prefix + (event,)
                children = {layer for layer, _ in trie.get(node, ())}
                end = n if node in wanted else max(children)
                child: dict[int, torch.Tensor] = {}
                h, layer = self._layer(q, stream[q], mask), q + 1
                while True:
                    if layer in children:
                        child[layer] = h
                    if layer == end:
                        break
                    h = self._layer(layer, h)
                    layer += 1
                if node in wanted:
                    results[node] = self._tail(h)
                del h
                if children:
                    visit(node, child)
                del child

        try:
            visit((), dict(enumerate(self.states)))
        finally:
            visit = None  # noqa: F841 - the closure refers to itself: break the cycle, or it keeps this batch alive
        return results
