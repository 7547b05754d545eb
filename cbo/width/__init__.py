"""Width pruning: score heads and neurons, allocate a budget globally, slice, schedule with depth.

* :mod:`cbo.model.structures` — which weights form a neuron, a head or a KV group, per architecture;
* :mod:`cbo.width.scores` — magnitude, Taylor, AFR-structured, NTK (NIRVANA), AMP, behind one registry;
* :mod:`cbo.width.allocate` — global ranking with the MLP-vs-attention ratio γ, minimums, rounding;
* :mod:`cbo.width.calibration` — choose the calibration batch by the KL of the model it prunes;
* :mod:`cbo.width.prune` — :func:`width_prune`, one-shot: score, allocate, slice;
* :mod:`cbo.recovery.finetune` — a short recovery fine-tune (LoRA or full) after pruning;
* :mod:`cbo.width.mop` — the Mixture-of-Pruners scheduler (depth or width, one step at a time), given a
  depth proposer: it never estimates a Hessian or runs a solver itself;
* the pipeline layer lives in :mod:`cbo.pipeline`: the depth proposers (:mod:`cbo.pipeline.proposers`;
  ``cbo``: the QUBO's choice, ``antepenultimate``) and :func:`cbo.pipeline.compression.compress`, the end-to-end
  call with a before/after report (``cbo.compress``).

The functions below are re-exported here, except those named like their module (``allocate``,
``compress``): import them from :mod:`cbo.width.allocate` and :mod:`cbo.pipeline.compression` (``cbo.compress``).

Example:
    >>> from cbo.width import score_units, prune_width                   # doctest: +SKIP
    >>> from cbo.width.allocate import allocate                          # doctest: +SKIP
    >>> plan = allocate(score_units(model, windows, "ntk"), ratio=0.2).plan  # doctest: +SKIP
    >>> small = prune_width(model, plan)                                 # doctest: +SKIP
"""

from __future__ import annotations

from cbo.lazy import lazy_getattr

_LAZY = {
    "score_units": "cbo.width.scores",
    "score_variants": "cbo.width.scores",
    "default_gamma": "cbo.width.allocate",
    "prune_width": "cbo.surgery.width",
    "WidthPlan": "cbo.surgery.width",
    "model_structures": "cbo.model.structures",
    "layer_widths": "cbo.model.structures",
    "select_calibration": "cbo.width.calibration",
    "width_prune": "cbo.width.prune",
    "mixture_of_pruners": "cbo.width.mop",
    "antepenultimate": "cbo.width.mop",
    "recover": "cbo.recovery.finetune",
    "save_pruned": "cbo.surgery.io",
    "load_pruned": "cbo.surgery.io",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = sorted(_LAZY)
