"""Hessian estimators: the block-removal QUBO of a model from calibration text.

``estimate_hessian(model, tokenizer, windows, estimator=..., loss=...)`` returns a BlockQUBO. The estimators
are registered on :data:`ESTIMATORS` (``cbo.hessian.names()`` lists them; a new estimator is one module with a
class decorated with ``@register``, see ``base.py``). Built in:

* ``singles``  measured single-block removal losses, no couplings (the pipeline's default).
* ``fisher``   Gauss-Newton/Fisher from per-sequence gate gradients, one backward per batch.
* ``paper``    the CBO paper's recipe: empirical Fisher AᵀA/n of per-sequence CE gate gradients, no linear term.
* ``exact``    autograd Hessian of the gate vector (N Hessian-vector products per batch).
* ``pairwise`` measured loss with every single and pair of blocks removed.
* ``hybrid``, ``fit``, ``trust``: measured singles with Fisher-correlation couplings, refined by measurements.

Measured losses come from :mod:`cbo.measure` (the prefix tree and its measurer); the gates from
:mod:`cbo.model.gates`.
"""

from __future__ import annotations

from cbo.hessian.base import ESTIMATORS, Estimator, Run, describe, get, names, register
from cbo.hessian.driver import estimate_hessian, tokens_hash
from cbo.measure.losses import LOSSES

__all__ = [
    "ESTIMATORS",
    "LOSSES",
    "Estimator",
    "Run",
    "describe",
    "estimate_hessian",
    "get",
    "names",
    "register",
    "tokens_hash",
]
