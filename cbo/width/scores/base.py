"""The width-score interface, its registry and :func:`score_units`.

Lifecycle: a score is a small class; :func:`score_units` builds it with checked options, then calls
``attach()`` (hooks, gradient switches), ``accumulate(batch)`` once per calibration batch, ``finalize()``
(per-unit importances) and ``remove()``, which it always calls, even when a batch fails. Higher importance
means "keep"; the allocator removes the lowest-scoring units.

A new score is one module with a :class:`WidthScore` subclass decorated with ``@SCORES.register`` (its
``Options`` dataclass may define ``validate()``, which raises :class:`InvalidOptionError`); the built-in
modules are listed in :data:`SCORES` and imported on its first lookup.

Example:
    >>> scores = score_units(model, windows, "ntk")        # doctest: +SKIP
    >>> scores.values[(0, "mlp")].shape                    # doctest: +SKIP
    torch.Size([1536])
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cbo.checks import check_int
from cbo.errors import DataError, InvalidOptionError, ModelError
from cbo.extras import require
from cbo.model.forward import input_device, window_batches
from cbo.model.structures import KINDS, ModelStructures, Units, model_structures, units_of
from cbo.progress import progress_iter
from cbo.registry import Registry

torch = require("torch", "width scores")

Key = tuple[int, str]  # (decoder layer, "attention" | "mlp")

# every width score; the built-in modules register theirs when the registry is first read
SCORES: Registry[type[WidthScore]] = Registry(
    "width score",
    builtins=tuple(f"cbo.width.scores.{m}" for m in ("afr", "amp", "magnitude", "ntk", "taylor")),
)
register = SCORES.register
get = SCORES.get
names = SCORES.names


@dataclass
class UnitScores:
    """Per-unit importances of every prunable structure (higher = more important)."""

    score: str
    gqa: str
    values: dict[Key, Any]
    units: dict[Key, Units]
    structures: ModelStructures
    options: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def keys(self) -> list[Key]:
        return sorted(self.values, key=lambda k: (k[0], KINDS.index(k[1])))


class WidthScore(abc.ABC):
    """Base class of every width score; subclasses register with ``@SCORES.register``."""

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    needs_data: ClassVar[bool] = True
    # options that only change finalize(): score_variants may vary them over one set of calibration passes
    finalize_options: ClassVar[tuple[str, ...]] = ()
    # how allocate() spends a budget by default: "global" ranking, or "uniform" (same fraction per layer) for
    # scores whose scale is not comparable from one layer to the next
    default_allocation: ClassVar[str] = "global"

    @dataclass
    class Options:
        pass

    def __init__(self, model: Any, structures: ModelStructures, units: dict[Key, Units], options: Any):
        self.model = model
        self.structures = structures
        self.units = units
        self.options = options
        self.n_batches = 0
        self.info: dict[str, Any] = {}  # what finalize() chose, copied into UnitScores.info
        self._handles: list[Any] = []

    def structure(self, key: Key) -> Any:
        layer, kind = key
        return self.structures.of_kind(kind)[layer]

    # lifecycle -------------------------------------------------------------------------------
    def attach(self) -> None:
        """Register hooks and switches; everything registered here is undone by :meth:`remove` (none by default)."""
        return None

    def accumulate(self, batch: Any) -> None:
        """Process one batch of token ids ``(B, T)`` (data-free scores need nothing)."""
        return None

    @abc.abstractmethod
    def finalize(self) -> dict[Key, Any]:
        """Per-unit importances ``{(layer, kind): (n_units,) tensor}``; may be called more than once."""

    def remove(self) -> None:
        """Remove every hook this score registered (safe to call twice)."""
        while self._handles:
            self._handles.pop().remove()

    def hook(self, handle: Any) -> None:
        """Keep a hook handle so that :meth:`remove` removes it."""
        self._handles.append(handle)


def score_units(
    model: Any,
    windows: Any = None,
    score: str = "ntk",
    *,
    kinds: tuple[str, ...] = KINDS,
    gqa: str = "group",
    batch_size: int = 4,
    structures: ModelStructures | None = None,
    progress: bool = False,
    **options: Any,
) -> UnitScores:
    """Importance of every attention unit and MLP neuron of ``model``.

    Args:
        model: a Hugging Face causal LM (eval mode is used while scoring).
        windows: ``(B, T)`` int64 token windows of calibration text (not needed by ``magnitude``).
        score: a registered score name (``SCORES.names()``): magnitude, taylor, afr, ntk, amp.
        kinds: which structures to score.
        gqa: grouped-query units, ``"group"`` (whole KV groups) or ``"query"`` (query heads).
        batch_size: windows per forward pass.
        **options: fields of the score's ``Options`` dataclass.

    Example:
        >>> s = score_units(model, windows, "afr", p=0.5, clip_percentiles=(1.0, 99.0))   # doctest: +SKIP
        >>> s.info["p"]["3.mlp.up_proj.weight"]                                         # doctest: +SKIP
        0.5
    """
    return score_variants(
        model,
        windows,
        score,
        [options],
        kinds=kinds,
        gqa=gqa,
        batch_size=batch_size,
        structures=structures,
        progress=progress,
    )[0]


def score_variants(
    model: Any,
    windows: Any,
    score: str,
    variants: list[dict[str, Any]],
    *,
    kinds: tuple[str, ...] = KINDS,
    gqa: str = "group",
    batch_size: int = 4,
    structures: ModelStructures | None = None,
    progress: bool = False,
) -> list[UnitScores]:
    """Several option sets of one score over a single set of calibration passes (ablations).

    The first variant's options drive the passes; the others may differ only in the score's
    ``finalize_options`` (e.g. AFR's ``aggregation``, ``power``, ``clip``; Taylor's ``variant``).

    Example:
        >>> full, no_clip = score_variants(model, windows, "afr", [{}, {"clip": False}])   # doctest: +SKIP
    """
    cls = SCORES.get(score)
    if not variants:
        raise InvalidOptionError("score_variants needs at least one option set")
    opts = [SCORES.make_options(cls, v) for v in variants]
    first = dataclasses.asdict(opts[0])
    for o in opts[1:]:
        changed = {k for k, v in dataclasses.asdict(o).items() if first[k] != v}
        fixed = sorted(changed - set(cls.finalize_options))
        if fixed:
            raise InvalidOptionError(
                f"variants of {cls.name!r} may differ only in {list(cls.finalize_options) or 'nothing'}; "
                f"{fixed} change the calibration passes (score them separately)"
            )
    structs = structures if structures is not None else model_structures(model, kinds)
    units = {(s.layer, s.kind): units_of(s, gqa) for s in structs.all(kinds)}
    if not units:
        raise ModelError(f"{type(model).__name__} has no prunable {'/'.join(kinds)} structures")
    if cls.needs_data:
        if windows is None or not hasattr(windows, "shape") or windows.ndim != 2 or windows.shape[0] == 0:
            raise DataError(
                f"width score {cls.name!r} needs calibration token windows of shape (B, T); got {windows!r}"
            )
    check_int("batch_size", batch_size, 1, error=DataError)
    was_training = model.training
    model.eval()
    scorer = cls(model, structs, units, opts[0])
    results = []
    try:
        scorer.attach()
        if cls.needs_data:
            device = input_device(model)
            batches = [batch for _, batch in window_batches(windows, batch_size)]
            for batch in progress_iter(batches, progress, desc=f"width score {cls.name}"):
                scorer.accumulate(batch.to(device))
                scorer.n_batches += 1
        for o in opts:
            scorer.options = o
            values = scorer.finalize()
            for key, v in values.items():
                if not torch.isfinite(v).all():
                    raise DataError(f"width score {cls.name!r} produced non-finite values for layer {key[0]} {key[1]}")
            info = dict(scorer.info)  # what finalize() chose (e.g. AFR's exponents)
            results.append(UnitScores(cls.name, gqa, values, units, structs, dataclasses.asdict(o), info))
    finally:
        scorer.remove()
        model.train(was_training)
    return results


class GradientScore(WidthScore):
    """Base of scores built from ``∂objective/∂W`` summed over batches.

    ``attach`` turns gradients off for every parameter that no score reads (embeddings, norms, the head),
    ``remove`` restores each parameter's ``requires_grad`` and clears the gradients it produced.
    """

    def attach(self) -> None:
        self._saved = {id(p): (p, p.requires_grad, p.grad) for p in self.model.parameters()}
        self._scored: dict[int, Any] = {}
        for s in self.structures.all():
            for slot in s.slots:
                if not slot.is_bias:
                    self._scored[id(slot.tensor)] = slot.tensor
        for p in self.model.parameters():
            p.requires_grad_(id(p) in self._scored)
            p.grad = None
        self._grad_sum: dict[int, Any] = {}

    @abc.abstractmethod
    def objective(self, batch: Any) -> Any:
        """The scalar whose gradient the score uses, for one batch."""

    def accumulate(self, batch: Any) -> None:
        with torch.enable_grad():
            value = self.objective(batch)
            value.backward()
        for key, p in self._scored.items():
            if p.grad is not None:
                if key in self._grad_sum:
                    self._grad_sum[key] += p.grad
                else:
                    self._grad_sum[key] = p.grad.detach().clone()
                p.grad = None

    def mean_grad(self, param: Any) -> Any:
        g = self._grad_sum.get(id(param))
        if g is None:
            return torch.zeros_like(param)
        return g / max(self.n_batches, 1)

    def per_weight(self, key: Key, fn) -> dict[str, Any]:
        """``{slot name: fn(weight, mean gradient)}`` for the weight slots of one structure."""
        out = {}
        for slot in self.structure(key).slots:
            if not slot.is_bias and slot.name not in out:
                w = slot.tensor.detach()
                out[slot.name] = fn(w, self.mean_grad(slot.tensor))
        return out

    def remove(self) -> None:
        super().remove()
        for p, flag, grad in getattr(self, "_saved", {}).values():
            p.requires_grad_(flag)
            p.grad = grad
        self._grad_sum = {}


def lm_loss(model: Any, batch: Any) -> Any:
    """Mean next-token cross-entropy of a batch of token windows."""
    logits = model(input_ids=batch).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1).to(logits.device)
    )
