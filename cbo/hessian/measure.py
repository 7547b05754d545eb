"""The one measurer: losses of a model with sets of blocks removed (estimators, baselines, validation, search).

``RemovalLosses(model, blocks, tokens)`` runs the original model once on a batch of windows and keeps the
teacher log-probabilities, the residual stream entering every decoder layer, and the keyword arguments each
layer was called with (masks, positions, rotary tables: they depend on the positions only, not on the hidden
states). ``losses(sets)`` then measures many removal sets through a prefix tree: sorted by their removed
layers, sets that share their first removed layers share the stream computed up to their first difference,
and a set is only run from there on. Removing layer q means the stream entering q passes to q + 1 unchanged,
which is exactly what deleting the layer does; the final norm and head run on the last stream through the
model's own forward with the decoder layers swapped for a one-module list that hands back that stream. The
values equal those of the surgically pruned model up to floating-point rounding; a set of deep layers costs a
fraction of a forward pass.

Sublayer blocks, and models whose layers cannot be replayed this way (checked on every batch against the
original logits), fall back to one full gated forward pass per set.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from cbo.hessian.gates import Gates
from cbo.hessian.losses import ce_per_sequence, log_probs, model_logits

LOSS_NAMES = ("kl", "ce")


class _Inject(torch.nn.Module):
    """Stands in for the whole decoder-layer list: returns a given stream in the last layer's output format."""

    def __init__(self, state: torch.Tensor, rest: tuple | None) -> None:
        super().__init__()
        self.state = state
        self.rest = rest

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.state if self.rest is None else (self.state, *self.rest)


def _first_tensor(output: Any) -> tuple[torch.Tensor, tuple | None]:
    if isinstance(output, torch.Tensor):
        return output, None
    return output[0], tuple(output[1:])


class RemovalLosses:
    """Per-sequence losses (KL to the original, cross-entropy) of one batch with sets of blocks removed.

    Args:
        model: the causal LM (eval mode; gates of an estimator may be attached at 1).
        blocks: the block list (``cbo.blocks.find_blocks``); removal sets index into it.
        tokens: (B, T) token windows of one batch.
        prefix: use the prefix tree (layer blocks only); False forces one full gated pass per set.

    Attributes:
        base: ``{"kl": zeros, "ce": (B,)}`` losses of the original model.
        layer_calls / tail_calls / full_calls: work done (decoder-layer calls, head runs, full gated passes).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        blocks: Sequence[Any],
        tokens: torch.Tensor,
        *,
        prefix: bool = True,
        cache: MeasureCache | None = None,
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
        self.measured = 0  # sets measured (not found in the cache)
        self._ready = False

    def _prepare(self) -> None:
        """The original pass (teacher, streams, call arguments); run on the first set not found in the cache."""
        from cbo.blocks import decoder_layers

        if self._ready:
            return
        self._ready = True
        model, tokens, prefix = self.model, self.tokens, self.prefix
        self.original_calls += 1
        layers, path = decoder_layers(model)
        self.layers = layers
        self.n_layers = len(layers)
        parent_path, _, self._attr = path.rpartition(".")
        self._parent = model.get_submodule(parent_path) if parent_path else model
        self._layer_of_block = [b.layer for b in self.blocks]
        self.replay = (
            prefix
            and all(b.kind == "layer" for b in self.blocks)
            and len(set(self._layer_of_block)) == len(self.blocks)
        )
        self.states: list[torch.Tensor] = []
        self.calls: list[tuple[tuple, dict]] = []
        self._rest: tuple | None = None
        with torch.no_grad():
            logits = self._record() if self.replay else model_logits(model, tokens)
            teacher = log_probs(logits)
            # KL(p || q) = Σ p log p − Σ p z + logsumexp(z) for student logits z: the teacher enters through p and
            # its negative entropy only, so each set costs one logsumexp and one dot product over the vocabulary
            self._p = teacher.exp()
            self._neg_entropy = (self._p * teacher).sum(-1)
            del teacher
            self._base = {"kl": torch.zeros(tokens.shape[0]), "ce": ce_per_sequence(logits, tokens).float().cpu()}
            if self.replay and not self._replay_matches(logits):
                self.replay = False
            del logits

    # ------------------------------------------------------------------ recording and replay
    def _record(self) -> torch.Tensor:
        """Original forward pass that records each layer's input stream, call arguments and the last output."""
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
            out, rest = _first_tensor(output)
            states[self.n_layers] = out
            self._rest = rest

        try:
            for k, layer in enumerate(self.layers):
                handles.append(layer.register_forward_pre_hook(pre(k), with_kwargs=True))
            handles.append(self.layers[-1].register_forward_hook(post, with_kwargs=True))
            logits = model_logits(self.model, self.tokens)
        finally:
            for h in handles:
                h.remove()
        if len(states) != self.n_layers + 1 or not all(isinstance(s, torch.Tensor) for s in states.values()):
            self.replay = False
            return logits
        self.states = [states[k] for k in range(self.n_layers + 1)]
        self.calls = [calls[k] for k in range(self.n_layers)]
        return logits

    def _layer(self, k: int, h: torch.Tensor) -> torch.Tensor:
        args, kwargs = self.calls[k]
        self.layer_calls += 1
        return _first_tensor(self.layers[k](h, *args, **kwargs))[0]

    def _tail(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of the model whose last decoder layer outputs ``h`` (final norm and head only)."""
        original = getattr(self._parent, self._attr)
        setattr(self._parent, self._attr, torch.nn.ModuleList([_Inject(h, self._rest)]))
        try:
            self.tail_calls += 1
            return model_logits(self.model, self.tokens)
        finally:
            setattr(self._parent, self._attr, original)

    def _replay_matches(self, logits: torch.Tensor) -> bool:
        """The replayed last layer and the injected head reproduce the original logits."""
        try:
            out = self._layer(self.n_layers - 1, self.states[self.n_layers - 1])
            again = self._tail(out)
        except Exception:  # noqa: BLE001 - any failure means this model cannot be replayed; use full passes
            return False
        self.layer_calls -= 1
        self.tail_calls -= 1
        scale = float(logits.abs().max()) + 1.0
        return again.shape == logits.shape and float((again - logits).abs().max()) <= 1e-4 * scale

    # ------------------------------------------------------------------ losses
    def _losses_of(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        z = logits.to(self._p.dtype)
        lse = torch.logsumexp(z, dim=-1)
        pz = torch.einsum("btv,btv->bt", self._p, z)
        kl = (self._neg_entropy - pz + lse).clamp_min(0.0).mean(-1)
        target = self.tokens[:, 1:].to(z.device).unsqueeze(-1)
        ce = (lse[:, :-1] - z[:, :-1].gather(-1, target).squeeze(-1)).mean(-1)
        return {"kl": kl.float().cpu(), "ce": ce.float().cpu()}

    def _full(self, removed: Sequence[int]) -> dict[str, torch.Tensor]:
        with Gates(self.model, self.blocks, requires_grad=False) as gates:
            gates.set(removed=removed)
            self.full_calls += 1
            return self._losses_of(model_logits(self.model, self.tokens))

    @property
    def base(self) -> dict[str, torch.Tensor]:
        """Losses of the original model (KL is 0)."""
        if self.cache is not None and () in self.cache:
            return self.cache[()]
        self._prepare()
        if self.cache is not None:
            self.cache.update({(): self._base})
        return {k: v.clone() for k, v in self._base.items()}

    def losses(self, sets: Iterable[Iterable[int]]) -> list[dict[str, torch.Tensor]]:
        """``[{"kl": (B,), "ce": (B,)}]`` per-sequence losses of each removal set (block indices), in order."""
        keys = [tuple(sorted({int(i) for i in s})) for s in sets]
        for key in keys:
            bad = [i for i in key if not 0 <= i < len(self.blocks)]
            if bad:
                raise IndexError(f"block indices {bad} are out of range 0..{len(self.blocks) - 1}")
        out: dict[tuple[int, ...], dict[str, torch.Tensor]] = {}
        if self.cache is not None:
            for key in keys:
                if key in self.cache:
                    out[key] = self.cache[key]
        missing = [k for k in dict.fromkeys(keys) if k not in out]
        if missing:
            self._prepare()
        with torch.no_grad():
            todo = []
            for key in missing:
                self.measured += 1
                if not key:
                    out[key] = {k: v.clone() for k, v in self._base.items()}
                elif self.replay:
                    todo.append(tuple(sorted(self._layer_of_block[i] for i in key)))
                else:
                    out[key] = self._full(key)
            if todo:
                by_layers = self._tree(todo)
                block_of_layer = {layer: i for i, layer in enumerate(self._layer_of_block)}
                for layers_key, value in by_layers.items():
                    out[tuple(sorted(block_of_layer[q] for q in layers_key))] = value
        if self.cache is not None and missing:
            self.cache.update({k: out[k] for k in missing})
        return [out[k] for k in keys]

    def _tree(self, sets: list[tuple[int, ...]]) -> dict[tuple[int, ...], dict[str, torch.Tensor]]:
        """Measure layer-removal sets through a prefix tree (depth first, one stream per tree level)."""
        trie: dict[tuple[int, ...], set[int]] = {}
        wanted = set(sets)
        for s in sets:
            for d in range(len(s)):
                trie.setdefault(s[:d], set()).add(s[d])
        results: dict[tuple[int, ...], dict[str, torch.Tensor]] = {}
        n = self.n_layers

        def visit(prefix: tuple[int, ...], stream: dict[int, torch.Tensor]) -> None:
            # ``stream[L]``: the state entering layer L with ``prefix`` removed (L = n: the last layer's output)
            for q in sorted(trie.get(prefix, ())):
                node = prefix + (q,)
                children = trie.get(node, set())
                end = n if node in wanted else max(children)
                child: dict[int, torch.Tensor] = {}
                h, layer = stream[q], q + 1  # layer q is removed: its input enters layer q + 1 unchanged
                while True:
                    if layer in children:
                        child[layer] = h
                    if layer == end:
                        break
                    h = self._layer(layer, h)
                    layer += 1
                if node in wanted:
                    results[node] = self._losses_of(self._tail(h))
                del h
                if children:
                    visit(node, child)
                del child

        root = {k: s for k, s in enumerate(self.states)}
        visit((), root)
        return results


def measure_sets(
    model: torch.nn.Module,
    blocks: Sequence[Any],
    windows: torch.Tensor,
    sets: Sequence[Iterable[int]],
    *,
    batch_size: int = 8,
    prefix: bool = True,
    cache: MeasureCache | None = None,
) -> dict[str, np.ndarray]:
    """Per-sequence losses of every removal set over all windows.

    Returns:
        ``{"kl": (n_sets, B), "ce": (n_sets, B), "base_ce": (B,)}`` and the work done: ``layer_calls``,
        ``tail_calls`` (head runs), ``full_calls`` (full gated passes), ``original_calls`` (original passes, at
        most one per batch), ``measured`` (set-batch measurements not found in the cache).
    """
    sets = [tuple(s) for s in sets]
    kl = np.zeros((len(sets), windows.shape[0]))
    ce = np.zeros((len(sets), windows.shape[0]))
    base_ce = np.zeros(windows.shape[0])
    counts = {"layer_calls": 0, "tail_calls": 0, "full_calls": 0, "original_calls": 0, "measured": 0}
    device = next(model.parameters()).device
    for start in range(0, windows.shape[0], batch_size):
        batch = windows[start : start + batch_size].to(device)
        rl = RemovalLosses(model, blocks, batch, prefix=prefix, cache=cache)
        for k, value in enumerate(rl.losses(sets)):
            kl[k, start : start + batch.shape[0]] = value["kl"].numpy()
            ce[k, start : start + batch.shape[0]] = value["ce"].numpy()
        base_ce[start : start + batch.shape[0]] = rl.base["ce"].numpy()
        for key in counts:
            counts[key] += getattr(rl, key)
        del rl
    return {"kl": kl, "ce": ce, "base_ce": base_ce, **counts}


class MeasureCache:
    """Measured per-sequence losses on disk, one file per (model, blocks, batch of windows).

    Estimators and benchmarks that measure the same sets on the same batches share the work. Each file maps
    a removal set to its per-sequence KL and cross-entropy.

    Args:
        directory: the folder (created if needed).
        model: the model (its fingerprint and the block names are part of every file's key).
        blocks: the block list.
    """

    def __init__(self, directory: str | Path, model: torch.nn.Module, blocks: Sequence[Any]) -> None:
        from cbo.hessian.checkpoint import ensure_writable_dir
        from cbo.hessian.fingerprint import model_fingerprint

        self.dir = ensure_writable_dir(directory, "measurement cache")
        self.prefix = hashlib.sha256(
            json.dumps([model_fingerprint(model), [b.name for b in blocks]]).encode()
        ).hexdigest()[:16]

    def batch(self, tokens: torch.Tensor) -> BatchCache:
        from cbo.hessian.base import tokens_hash

        return BatchCache(self.dir / f"removal-{self.prefix}-{tokens_hash(tokens.cpu())[:16]}.npz")


class BatchCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[tuple[int, ...], dict[str, torch.Tensor]] = self._read()

    def _read(self) -> dict[tuple[int, ...], dict[str, torch.Tensor]]:
        if not self.path.exists():
            return {}
        try:
            with np.load(self.path, allow_pickle=False) as z:
                sets = json.loads(bytes(z["sets"]).decode())
                kl, ce = z["kl"], z["ce"]
        except (OSError, ValueError, KeyError, json.JSONDecodeError):
            return {}
        return {
            tuple(s): {"kl": torch.from_numpy(kl[k].copy()), "ce": torch.from_numpy(ce[k].copy())}
            for k, s in enumerate(sets)
        }

    def __contains__(self, key: tuple[int, ...]) -> bool:
        return key in self.data

    def __getitem__(self, key: tuple[int, ...]) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.data[key].items()}

    def update(self, values: dict[tuple[int, ...], dict[str, torch.Tensor]]) -> None:
        import io

        from cbo.hessian.checkpoint import atomic_write_bytes

        # merge with what other runs wrote since this file was read
        self.data = {**self._read(), **self.data}
        self.data.update({k: {n: t.detach().float().cpu() for n, t in v.items()} for k, v in values.items()})
        sets = list(self.data)
        buf = io.BytesIO()
        np.savez(
            buf,
            sets=np.frombuffer(json.dumps([list(s) for s in sets]).encode(), dtype=np.uint8),
            kl=np.stack([self.data[s]["kl"].numpy() for s in sets]),
            ce=np.stack([self.data[s]["ce"].numpy() for s in sets]),
        )
        try:
            atomic_write_bytes(self.path, buf.getvalue())
        except OSError:
            pass  # a cache that cannot be written only costs time
