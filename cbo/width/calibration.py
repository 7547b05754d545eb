"""KL-based calibration selection (NIRVANA): prune with each candidate batch, keep the one that hurts least.

Width scores depend on the calibration text; a bad batch prunes the wrong units. The remedy is cheap
because scoring is one-shot: draw several candidate batches, prune the model with each, and keep the
batch whose pruned model has the lowest KL divergence to the original on a fixed control split.

Example:
    >>> choice = select_calibration(model, candidate_batches(pool, 4, 8), control, ratio=0.2)  # doctest: +SKIP
    >>> choice.windows.shape, choice.kl                                                       # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cbo.errors import DataError
from cbo.extras import require
from cbo.width.prune import width_prune

torch = require("torch", "calibration selection")


def candidate_batches(pool: Any, n_candidates: int, size: int, *, seed: int = 0) -> list[Any]:
    """``n_candidates`` batches of ``size`` windows drawn without replacement from ``pool`` (seeded).

    Candidates are disjoint while the pool allows it; otherwise each is an independent draw.
    """
    if n_candidates < 1 or size < 1:
        raise DataError(f"n_candidates and size must be >= 1, got {n_candidates} and {size}")
    n = int(pool.shape[0])
    if size > n:
        raise DataError(f"a candidate batch of {size} windows needs a pool of at least {size}; the pool has {n}")
    g = torch.Generator().manual_seed(seed)
    if n_candidates * size <= n:
        perm = torch.randperm(n, generator=g)
        return [pool[perm[i * size : (i + 1) * size]] for i in range(n_candidates)]
    return [pool[torch.randperm(n, generator=g)[:size]] for _ in range(n_candidates)]


@dataclass
class CalibrationChoice:
    """The chosen batch and the KL each candidate's pruned model reached on the control split."""

    index: int
    windows: Any
    kl: list[float]
    removed_params: list[int] = field(default_factory=list)

    def summary(self) -> str:
        kls = ", ".join(f"{k:.4f}" for k in self.kl)
        return f"calibration batch {self.index} of {len(self.kl)} (KL on control: {kls})"


def select_calibration(
    model: Any,
    candidates: list[Any],
    control: Any,
    *,
    ratio: float | None = None,
    remove_params: int | None = None,
    score: str = "ntk",
    ref_logprobs: Any = None,
    batch_size: int = 4,
    gqa: str = "group",
    gamma: float | None = None,
    round_to: int = 8,
    score_options: dict[str, Any] | None = None,
    **allocate_options: Any,
) -> CalibrationChoice:
    """Prune with every candidate batch and keep the one with the lowest KL to the original on ``control``.

    Args:
        model: the model to prune (left untouched).
        candidates: a list of ``(B, T)`` token windows.
        control: ``(B, T)`` windows of a fixed held-out split.
        ratio / remove_params: the width budget, as in :func:`cbo.width.allocate.allocate`.
        score: the width score used to prune.
        ref_logprobs: the original model's log-probs on ``control`` (computed when omitted).
        **allocate_options: further options of :func:`cbo.width.prune.width_prune` (``allocation``,
            ``min_heads``, ``min_neurons``, ``max_layer_fraction``).

    Returns:
        A :class:`CalibrationChoice` (ties go to the earliest candidate).
    """
    from cbo.evaluate import count_parameters, kl_to_reference, reference_logits

    if not candidates:
        raise DataError("select_calibration needs at least one candidate batch")
    if ref_logprobs is None:
        ref_logprobs = reference_logits(model, control, batch_size=batch_size)
    kls, removed = [], []
    total = count_parameters(model)
    for batch in candidates:
        pruned, alloc = width_prune(
            model,
            batch,
            ratio=ratio,
            remove_params=remove_params,
            score=score,
            gqa=gqa,
            gamma=gamma,
            round_to=round_to,
            batch_size=batch_size,
            total_params=total,
            score_options=score_options,
            **allocate_options,
        )
        kls.append(float(kl_to_reference(pruned, control, ref_logprobs, batch_size=batch_size)))
        removed.append(alloc.removed_params)
        del pruned
    best = min(range(len(kls)), key=lambda i: (kls[i], i))
    return CalibrationChoice(best, candidates[best], kls, removed)
