"""Depth-pruning baselines: the block-selection rules CBO is measured against.

Each method ranks the removable blocks of a model (decoder layers, or attention / MLP halves with
``granularity="sublayer"``) from calibration windows and returns the blocks to remove for any M:

* ``block_influence`` (ShortGPT, Men et al. 2024): ``BI_i = 1 − mean_t cos(h_i[t], h_{i+1}[t])`` over every
  token of the calibration windows, ``h_i`` the residual stream entering block ``i``; remove the M lowest.
* ``angular`` (Gromov et al., "The Unreasonable Ineffectiveness of the Deeper Layers"):
  ``d(ℓ, n) = arccos(cos(h_ℓ[T], h_{ℓ+n}[T])) / π`` on the last token, averaged over the calibration windows;
  remove the contiguous run ``ℓ*, …, ℓ*+n−1`` with ``n = M`` and ``ℓ* = argmin_ℓ d(ℓ, n)``.
* ``sleb`` (Song et al. 2024): greedy; remove the block whose removal least raises the calibration loss,
  re-measure with it removed, repeat M times.
* ``taylor`` (Taylor+ of Shortened LLaMA, Kim et al. 2024): ``I_i = Σ_{w in block i} |w · ∂L/∂w|`` with L the
  calibration cross-entropy; remove the M smallest. The "+" keeps the first four and the last two blocks
  (``protect=(4, 2)``); ``protect=(0, 0)`` is plain Taylor.
* ``ppl`` (PPL criterion of Shortened LLaMA): remove one block at a time, measure the calibration loss, remove
  the M blocks whose single removal hurts least.

The residual states are read with forward hooks on the decoder layers (and on the attention branch for
sublayers), not from ``output_hidden_states``: Hugging Face models return the last layer's output *after*
the final norm there. Removal-based methods measure actual removal on a copy of the model that shares the
weights (no weight is copied), so a removed layer costs no compute.

Example:
    >>> removed = select_blocks("block_influence", model, splits, remove=8)       # doctest: +SKIP
    >>> ranking = rank_blocks("sleb", model, splits, max_remove=15)              # doctest: +SKIP
    >>> ranking.select(8), ranking.select(15)                                     # doctest: +SKIP
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cbo.errors import CBOError, DataError, InfeasibleError, ModelError
from cbo.extras import require

torch = require("torch", "depth baselines")
F = torch.nn.functional

GRANULARITIES = ("layer", "sublayer")
LOSSES = ("ce", "kl")
TAYLOR_PROTECT = (4, 2)  # Taylor+: the first four and the last two blocks are never removed


@dataclass
class Ranking:
    """What a baseline learned from the calibration windows; ``select(M)`` gives the blocks to remove.

    Attributes:
        method, granularity: the rule and the block granularity.
        names, kinds, sizes: the blocks (as ``cbo.blocks.find_blocks`` lists them).
        scores: per-block score, lower = removed first (BI, Taylor importance, loss with the block removed);
            ``nan`` for blocks that may not be removed.
        order: greedy removal order (SLEB), ``order_losses[k]`` the calibration loss after ``order[:k+1]``.
        distances: angular methods: ``distances[a, b]`` the mean angular distance between the states entering
            blocks ``a`` and ``b`` (``b = N`` is the model's last block output).
        keep: blocks never removed.
        passes: forward / backward passes over calibration batches; wall_time: seconds.
    """

    method: str
    granularity: str
    names: list[str]
    kinds: list[str]
    sizes: list[int]
    scores: np.ndarray | None = None
    order: list[int] | None = None
    order_losses: list[float] | None = None
    distances: np.ndarray | None = None
    keep: tuple[int, ...] = ()
    passes: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0})
    wall_time: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.names)

    def max_remove(self) -> int:
        """The largest M this ranking can answer."""
        free = self.n - len(self.keep) - (0 if self.keep else 1)  # something must remain
        if self.order is not None:
            free = min(free, len(self.order))
        return free

    def select(self, remove: int, *, caps: Mapping[str, int] | None = None) -> list[int]:
        """The ``remove`` blocks this method removes (sorted indices).

        Args:
            remove: M.
            caps: optional ``{kind: max}`` limits (e.g. ``{"attention": 4}``) on the removed blocks' kinds; the
                scored methods take the lowest scores that fit, angular the best run that fits, SLEB its
                greedy order skipping blocks that would break a cap (pass caps to :func:`rank_blocks` for a
                greedy search that respects them throughout).

        Raises:
            InfeasibleError: M is out of range for the model, the kept blocks or the caps.
        """
        _check_int(remove, "remove")
        if not 1 <= remove <= self.max_remove():
            raise InfeasibleError(
                f"{self.method}: remove={remove} is out of range; this ranking answers 1..{self.max_remove()} "
                f"({self.n} {self.granularity} blocks, {len(self.keep)} kept)."
            )
        caps = dict(caps or {})
        if self.distances is not None:
            return self._select_run(remove, caps)
        if self.order is not None:
            candidates = list(self.order)
        else:
            assert self.scores is not None
            allowed = [i for i in range(self.n) if i not in self.keep and np.isfinite(self.scores[i])]
            candidates = sorted(allowed, key=lambda i: (self.scores[i], i))
        chosen: list[int] = []
        used: dict[str, int] = {}
        for i in candidates:
            kind = self.kinds[i]
            if kind in caps and used.get(kind, 0) >= caps[kind]:
                continue
            chosen.append(i)
            used[kind] = used.get(kind, 0) + 1
            if len(chosen) == remove:
                return sorted(chosen)
        raise InfeasibleError(
            f"{self.method}: only {len(chosen)} removable blocks fit (kept {list(self.keep)}, caps {caps}, "
            f"blocks this method never removes excluded); cannot remove {remove}."
        )

    def _select_run(self, remove: int, caps: dict[str, int]) -> list[int]:
        assert self.distances is not None
        best, best_d = None, math.inf
        for start in range(0, self.n - remove + 1):
            run = range(start, start + remove)
            if any(i in self.keep for i in run):
                continue
            counts: dict[str, int] = {}
            for i in run:
                counts[self.kinds[i]] = counts.get(self.kinds[i], 0) + 1
            if any(counts.get(k, 0) > v for k, v in caps.items()):
                continue
            d = float(self.distances[start, start + remove])
            if d < best_d:
                best, best_d = start, d
        if best is None:
            raise InfeasibleError(f"angular: no contiguous run of {remove} blocks avoids the kept blocks {self.keep}.")
        return list(range(best, best + remove))

    def to_json(self) -> dict[str, Any]:
        def arr(a: Any) -> Any:
            if a is None:
                return None
            return [[_num(v) for v in row] for row in a] if np.ndim(a) == 2 else [_num(v) for v in a]

        return {
            "method": self.method,
            "granularity": self.granularity,
            "names": list(self.names),
            "kinds": list(self.kinds),
            "sizes": [int(s) for s in self.sizes],
            "scores": arr(self.scores),
            "order": self.order,
            "order_losses": self.order_losses,
            "distances": arr(self.distances),
            "keep": list(self.keep),
            "passes": dict(self.passes),
            "wall_time": self.wall_time,
            "info": self.info,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ranking:
        def arr(a: Any) -> Any:
            return None if a is None else np.asarray(a, dtype=np.float64)

        return cls(
            method=data["method"],
            granularity=data["granularity"],
            names=list(data["names"]),
            kinds=list(data["kinds"]),
            sizes=[int(s) for s in data["sizes"]],
            scores=arr(data.get("scores")),
            order=None if data.get("order") is None else [int(i) for i in data["order"]],
            order_losses=data.get("order_losses"),
            distances=arr(data.get("distances")),
            keep=tuple(int(i) for i in data.get("keep", ())),
            passes=dict(data.get("passes", {})),
            wall_time=float(data.get("wall_time", 0.0)),
            info=dict(data.get("info", {})),
        )


def _num(v: Any) -> Any:
    v = float(v)
    return v if math.isfinite(v) else str(v)


# ---------------------------------------------------------------------------------------------- registry
_RANKERS: dict[str, Callable[..., Ranking]] = {}
METHODS: dict[str, str] = {}  # name -> one-line description (iterating gives the names)


def register_method(name: str, description: str) -> Callable[[Callable[..., Ranking]], Callable[..., Ranking]]:
    """Decorator: add a ranking function ``fn(model, windows, blocks, ctx, **opts) -> Ranking`` to the registry."""

    def deco(fn: Callable[..., Ranking]) -> Callable[..., Ranking]:
        _RANKERS[name] = fn
        METHODS[name] = description
        return fn

    return deco


def methods() -> list[str]:
    """The registered baseline names."""
    return list(METHODS)


# ---------------------------------------------------------------------------------------------- helpers
def _check_int(value: Any, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InfeasibleError(f"{label} must be an integer, got {value!r}.")
    return int(value)


def calibration_windows(splits_or_windows: Any, model: Any = None) -> Any:
    """(B, T) int64 windows: a tensor / array, or the calibration split of a ``TokenSplits``."""
    from cbo.data import check_windows

    if splits_or_windows is None:
        raise DataError("no calibration windows given; pass a (B, T) token tensor or cbo.data.make_splits(...).")
    windows = splits_or_windows
    if hasattr(windows, "calibration") and not isinstance(windows, torch.Tensor):
        windows = windows.calibration
    if not isinstance(windows, torch.Tensor):
        try:
            windows = torch.as_tensor(np.asarray(windows))
        except (TypeError, ValueError) as exc:
            raise DataError(f"calibration windows must be a (B, T) array of token ids: {exc}") from exc
    windows = check_windows(windows, model)
    if windows.shape[0] == 0:
        raise DataError("the calibration windows are empty; give at least one window.")
    return windows


def _device(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _batches(windows: Any, batch_size: int) -> Iterable[Any]:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise CBOError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
    for start in range(0, windows.shape[0], batch_size):
        yield windows[start : start + batch_size]


def _logits(model: Any, batch: Any) -> Any:
    out = model(input_ids=batch.to(_device(model)), use_cache=False)
    return (out.logits if hasattr(out, "logits") else out[0]).float()


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, leave=False, desc=desc)


def shared_weight_copy(model: Any) -> Any:
    """A structural copy of ``model`` whose parameters and buffers are the original tensors (nothing copied)."""
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


def pruned_view(model: Any, blocks: Sequence[Any], removed: Iterable[int]) -> Any:
    """The model with the given blocks actually removed, sharing the original weights (cheap; read-only use).

    Layer blocks are deleted (``remove_blocks``); sublayer blocks are replaced by zero modules
    (``remove_sublayers``). The original model is untouched.
    """
    from cbo.surgery.depth import remove_blocks, remove_sublayers

    removed = sorted({int(i) for i in removed})
    view = shared_weight_copy(model)
    if not removed:
        return view
    if all(blocks[i].kind == "layer" for i in removed):
        return remove_blocks(view, [blocks[i].layer for i in removed], inplace=True)
    return remove_sublayers(view, [blocks[i] for i in removed], inplace=True)


class _LossMeter:
    """Mean calibration loss of a model: next-token NLL (``ce``) or KL to the original model (``kl``)."""

    def __init__(self, model: Any, windows: Any, loss: str, batch_size: int, passes: dict[str, int]) -> None:
        if loss not in LOSSES:
            raise CBOError(
                f"unknown loss {loss!r}; valid: {list(LOSSES)} (ce = cross-entropy, kl = KL to the original)."
            )
        self.windows, self.loss, self.batch_size, self.passes = windows, loss, batch_size, passes
        self.reference = None
        if loss == "kl":
            with torch.no_grad():
                self.reference = [F.log_softmax(_logits(model, b), dim=-1).cpu() for b in _batches(windows, batch_size)]
            passes["forward"] += len(self.reference)

    @torch.no_grad()
    def __call__(self, model: Any) -> float:
        total, count = 0.0, 0
        for k, batch in enumerate(_batches(self.windows, self.batch_size)):
            logp = F.log_softmax(_logits(model, batch), dim=-1)
            self.passes["forward"] += 1
            if self.loss == "ce":
                target = batch[:, 1:].to(logp.device)
                total += float(-logp[:, :-1].gather(-1, target.unsqueeze(-1)).sum())
                count += target.numel()
            else:
                ref = self.reference[k].to(logp.device)
                total += float((ref.exp() * (ref - logp)).sum())
                count += batch.numel()
        value = total / count
        return value if math.isfinite(value) else math.inf


def _protected(n: int, protect: Any) -> set[int]:
    if protect is None:
        return set()
    first, last = (int(p) for p in protect)
    if first < 0 or last < 0:
        raise CBOError(f"protect must be two integers >= 0 (first, last), got {protect!r}.")
    return set(range(min(first, n))) | set(range(max(0, n - last), n))


# ---------------------------------------------------------------------------------------------- residual states
class _ResidualStates:
    """Forward hooks that read the residual stream at every block boundary.

    For each forward pass, ``states`` holds ``N + 1`` tensors ``(B, T, d)``: the stream entering block 0, 1, …,
    and the last block's output. Layer granularity: layer inputs and the last layer's output. Sublayer
    granularity: layer input, layer input + attention branch, layer output, for every layer.
    """

    def __init__(self, model: Any, granularity: str) -> None:
        from cbo.blocks import decoder_layers, layer_parts

        self.layers, _ = decoder_layers(model)
        self.granularity = granularity
        self.parts = [layer_parts(layer, model) for layer in self.layers] if granularity == "sublayer" else None
        self._handles: list[Any] = []
        self.inputs: dict[int, Any] = {}
        self.outputs: dict[int, Any] = {}
        self.attn: dict[int, Any] = {}

    def __enter__(self) -> _ResidualStates:
        from cbo.blocks import branch_tensor

        def pre(k: int):
            def hook(module: Any, args: tuple, kwargs: dict) -> None:
                h = args[0] if args else kwargs.get("hidden_states")
                if not isinstance(h, torch.Tensor):
                    raise ModelError(f"decoder layer {k} was not called with the hidden states first")
                self.inputs[k] = h.detach()

            return hook

        def post(k: int, store: dict[int, Any]):
            def hook(module: Any, args: tuple, output: Any) -> None:
                store[k] = branch_tensor(output).detach()

            return hook

        try:
            for k, layer in enumerate(self.layers):
                self._handles.append(layer.register_forward_pre_hook(pre(k), with_kwargs=True))
                self._handles.append(layer.register_forward_hook(post(k, self.outputs)))
                if self.parts is not None:
                    self._handles.append(self.parts[k]["attn_branch"].register_forward_hook(post(k, self.attn)))
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
            if self.parts is not None:
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
    """
    model.eval()
    cos_sum, n_tok, last, passes = None, 0, [], 0
    with torch.no_grad(), _ResidualStates(model, granularity) as rec:
        for batch in _batches(windows, batch_size):
            model(input_ids=batch.to(_device(model)), use_cache=False)
            passes += 1
            states = [s.to(torch.float64) for s in rec.states()]
            cos = torch.stack([F.cosine_similarity(a, b, dim=-1).sum() for a, b in itertools.pairwise(states)])
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


# ---------------------------------------------------------------------------------------------- the methods
@dataclass
class _Context:
    keep: tuple[int, ...]
    batch_size: int
    progress: bool
    max_remove: int
    caps: dict[str, int]


def _ranking(method: str, blocks: Sequence[Any], granularity: str, ctx: _Context, **kw: Any) -> Ranking:
    return Ranking(
        method=method,
        granularity=granularity,
        names=[b.name for b in blocks],
        kinds=[b.kind for b in blocks],
        sizes=[int(b.n_params) for b in blocks],
        keep=ctx.keep,
        **kw,
    )


def _masked(scores: np.ndarray, excluded: Iterable[int]) -> np.ndarray:
    scores = np.asarray(scores, dtype=np.float64).copy()
    for i in excluded:
        scores[i] = np.nan
    return scores


@register_method("block_influence", "ShortGPT: remove the M blocks with the lowest 1 − mean cos(input, output)")
def _block_influence(model: Any, windows: Any, blocks: Sequence[Any], granularity: str, ctx: _Context) -> Ranking:
    stats = residual_statistics(model, windows, granularity, batch_size=ctx.batch_size)
    bi = 1.0 - stats["cos"]
    r = _ranking("block_influence", blocks, granularity, ctx, scores=_masked(bi, ctx.keep))
    r.passes["forward"] = stats["forward"]
    r.info["block_influence"] = [float(v) for v in bi]
    return r


@register_method("angular", "Gromov et al.: remove the contiguous run whose last-token angular distance is smallest")
def _angular(model: Any, windows: Any, blocks: Sequence[Any], granularity: str, ctx: _Context) -> Ranking:
    stats = residual_statistics(model, windows, granularity, batch_size=ctx.batch_size)
    r = _ranking("angular", blocks, granularity, ctx, distances=angular_distances(stats["last"]))
    r.passes["forward"] = stats["forward"]
    return r


@register_method(
    "ppl", "Shortened LLaMA PPL: remove the M blocks whose single removal raises the calibration loss least"
)
def _ppl(
    model: Any, windows: Any, blocks: Sequence[Any], granularity: str, ctx: _Context, *, loss: str = "ce"
) -> Ranking:
    r = _ranking("ppl", blocks, granularity, ctx)
    meter = _LossMeter(model, windows, loss, ctx.batch_size, r.passes)
    candidates = [i for i in range(len(blocks)) if i not in ctx.keep]
    bar = _progress(len(candidates), ctx.progress, "ppl baseline")
    scores = np.full(len(blocks), np.nan)
    for i in candidates:
        scores[i] = meter(pruned_view(model, blocks, [i]))
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    r.scores = scores
    r.info["loss"] = loss
    return r


@register_method(
    "sleb", "SLEB: greedily remove the block whose removal least raises the calibration loss, re-measuring"
)
def _sleb(
    model: Any, windows: Any, blocks: Sequence[Any], granularity: str, ctx: _Context, *, loss: str = "ce"
) -> Ranking:
    r = _ranking("sleb", blocks, granularity, ctx)
    meter = _LossMeter(model, windows, loss, ctx.batch_size, r.passes)
    removed: list[int] = []
    losses: list[float] = []
    step_scores: list[list[float]] = []
    free = [i for i in range(len(blocks)) if i not in ctx.keep]
    steps = ctx.max_remove
    total = sum(len(free) - k for k in range(steps))
    bar = _progress(total, ctx.progress, "sleb baseline")
    for _ in range(steps):
        used: dict[str, int] = {}
        for i in removed:
            used[blocks[i].kind] = used.get(blocks[i].kind, 0) + 1
        best, best_loss, scores = None, math.inf, [math.nan] * len(blocks)
        for i in free:
            if i in removed:
                continue
            kind = blocks[i].kind
            if kind in ctx.caps and used.get(kind, 0) >= ctx.caps[kind]:
                continue
            value = meter(pruned_view(model, blocks, removed + [i]))
            scores[i] = value
            if bar is not None:
                bar.update()
            if value < best_loss or best is None:
                best, best_loss = i, value
        if best is None:
            break
        removed.append(best)
        losses.append(best_loss)
        step_scores.append(scores)
    if bar is not None:
        bar.close()
    r.order, r.order_losses = removed, losses
    r.info.update({"loss": loss, "step_scores": [[_num(v) for v in s] for s in step_scores], "caps": ctx.caps})
    return r


def block_param_modules(model: Any, block: Any) -> list[Any]:
    """The modules whose parameters a block's removal deletes (a layer; or a half and the norms only it uses)."""
    from cbo.blocks import decoder_layers, layer_parts

    if block.kind == "layer":
        return [block.module]
    layer = decoder_layers(model)[0][block.layer]
    parts = layer_parts(layer, model)
    part = "attn" if block.kind == "attention" else "mlp"
    return [parts[part]] + [getattr(layer, n) for n in parts[f"{part}_norms"]]


def taylor_importance(
    model: Any, windows: Any, blocks: Sequence[Any], *, batch_size: int = 8
) -> tuple[np.ndarray, int]:
    """``Σ_{w in block} |w · ∂L/∂w|`` per block, L the mean next-token cross-entropy of the windows.

    Returns:
        ``(importance (N,), backward passes)``. Parameter gradients are restored to their previous state.
    """
    params = list(model.parameters())
    saved = [(p, p.requires_grad, p.grad) for p in params]
    n_pred = windows.shape[0] * (windows.shape[1] - 1)
    passes = 0
    was_training = model.training
    model.eval()
    try:
        for p in params:
            p.requires_grad_(True)
            p.grad = None
        with torch.enable_grad():
            for batch in _batches(windows, batch_size):
                logits = _logits(model, batch)
                target = batch[:, 1:].to(logits.device)
                nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum")
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


@register_method("taylor", "Taylor+ (Shortened LLaMA): remove the M blocks with the smallest Σ|w·∂L/∂w|")
def _taylor(
    model: Any,
    windows: Any,
    blocks: Sequence[Any],
    granularity: str,
    ctx: _Context,
    *,
    protect: Any = TAYLOR_PROTECT,
) -> Ranking:
    importance, backward = taylor_importance(model, windows, blocks, batch_size=ctx.batch_size)
    protected = _protected(len(blocks), protect) if granularity == "layer" else _protected_layers(blocks, protect)
    r = _ranking("taylor", blocks, granularity, ctx, scores=_masked(importance, set(ctx.keep) | protected))
    r.passes.update({"forward": backward, "backward": backward})
    r.info.update({"importance": [float(v) for v in importance], "protect": list(protect or (0, 0))})
    return r


def _protected_layers(blocks: Sequence[Any], protect: Any) -> set[int]:
    """Sublayer blocks whose decoder layer is among the protected first / last layers."""
    n_layers = 1 + max(b.layer for b in blocks)
    layers = _protected(n_layers, protect)
    return {i for i, b in enumerate(blocks) if b.layer in layers}


# ---------------------------------------------------------------------------------------------- public calls
def rank_blocks(
    method: str,
    model: Any,
    splits_or_windows: Any,
    *,
    granularity: str = "layer",
    max_remove: int | None = None,
    keep: Iterable[Any] | None = None,
    caps: Mapping[str, int] | None = None,
    batch_size: int = 8,
    progress: bool = False,
    **options: Any,
) -> Ranking:
    """Run a baseline once on the calibration windows; the result answers ``select(M)`` for every M.

    Args:
        method: a name of :data:`METHODS` (``block_influence``, ``angular``, ``sleb``, ``taylor``, ``ppl``).
        model: a Hugging Face causal LM.
        splits_or_windows: (B, T) token windows, or a ``TokenSplits`` (its calibration split is used).
        granularity: ``"layer"`` or ``"sublayer"``.
        max_remove: the largest M needed (SLEB runs that many greedy steps; default: all removable blocks).
        keep: blocks never removed (indices or names).
        caps: ``{kind: max}`` limits that SLEB's greedy search respects at every step.
        batch_size: windows per forward pass.
        progress: show progress bars.
        **options: method options: ``loss="ce"|"kl"`` (sleb, ppl), ``protect=(first, last)`` (taylor).

    Example:
        >>> r = rank_blocks("ppl", model, splits)                  # doctest: +SKIP
        >>> r.select(8)                                            # doctest: +SKIP
    """
    from cbo.blocks import find_blocks

    if method not in _RANKERS:
        raise CBOError(f"unknown depth baseline {method!r}; valid methods: {methods()}.")
    if granularity not in GRANULARITIES:
        raise ModelError(f"unknown granularity {granularity!r}; use one of {GRANULARITIES}.")
    blocks = find_blocks(model, granularity)
    windows = calibration_windows(splits_or_windows, model)
    keep_idx = _keep_indices(keep, blocks)
    free = len(blocks) - len(keep_idx) - (0 if keep_idx else 1)  # something must remain
    steps = free if max_remove is None else _check_int(max_remove, "max_remove")
    if not 1 <= steps <= free:
        raise InfeasibleError(
            f"max_remove={steps} is out of range; {len(blocks)} blocks, {len(keep_idx)} kept: use 1..{free}."
        )
    ctx = _Context(tuple(keep_idx), batch_size, progress, steps, dict(caps or {}))
    fn = _RANKERS[method]
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        ranking = fn(model, windows, blocks, granularity, ctx, **options)
    except TypeError as exc:
        if "unexpected keyword" in str(exc):
            raise CBOError(f"baseline {method!r} does not take option(s) {sorted(options)}: {exc}") from exc
        raise
    finally:
        model.train(was_training)
    ranking.wall_time = time.perf_counter() - t0
    ranking.info.update({"n_windows": int(windows.shape[0]), "seq_len": int(windows.shape[1])})
    return ranking


def _keep_indices(keep: Iterable[Any] | None, blocks: Sequence[Any]) -> list[int]:
    if keep is None:
        return []
    names = [b.name for b in blocks]
    out = []
    for k in [keep] if isinstance(keep, (int, str)) else keep:
        if isinstance(k, str) and not k.lstrip("-").isdigit():
            if k not in names:
                raise InfeasibleError(f"keep names unknown block {k!r}; blocks are {names[0]}..{names[-1]}.")
            out.append(names.index(k))
            continue
        i = int(k)
        if not 0 <= i < len(blocks):
            raise InfeasibleError(f"keep index {i} is out of range; valid: 0..{len(blocks) - 1}.")
        out.append(i)
    return sorted(set(out))


def select_blocks(
    method: str,
    model: Any,
    splits_or_windows: Any,
    remove: int,
    *,
    granularity: str = "layer",
    keep: Iterable[Any] | None = None,
    caps: Mapping[str, int] | None = None,
    batch_size: int = 8,
    progress: bool = False,
    **options: Any,
) -> list[int]:
    """The blocks a baseline removes (sorted indices into ``cbo.blocks.find_blocks(model, granularity)``).

    Usable as ``prune_depth(..., method=NAME)``. See :func:`rank_blocks` for the arguments; ``caps`` limits the
    removed blocks per kind, e.g. ``{"attention": 4}``.

    Example:
        >>> select_blocks("block_influence", model, splits, remove=8)      # doctest: +SKIP
        [16, 17, 18, 19, 20, 21, 22, 23]
    """
    _check_int(remove, "remove")
    ranking = rank_blocks(
        method,
        model,
        splits_or_windows,
        granularity=granularity,
        max_remove=remove if method == "sleb" else None,
        keep=keep,
        caps=caps,
        batch_size=batch_size,
        progress=progress,
        **options,
    )
    return ranking.select(remove, caps=caps)
