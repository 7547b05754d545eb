"""Hessian estimators: the block-removal QUBO of a model from calibration text.

``estimate_hessian(model, tokenizer, windows, estimator=..., loss=...)`` returns a BlockQUBO. The estimators
are registered on :data:`ESTIMATORS` (``cbo.hessian.names()`` lists them; a new estimator is one module with a
class decorated with ``@register``, see ``base.py``). Built in:

* ``singles``  measured single-block removal losses, no couplings (the pipeline's default).
* ``fisher``   Gauss-Newton/Fisher from per-sequence gate gradients, one backward per batch.
* ``exact``    autograd Hessian of the gate vector (N Hessian-vector products per batch).
* ``pairwise`` measured loss with every single and pair of blocks removed.
* ``hybrid``, ``fit``, ``trust``: measured singles with Fisher-correlation couplings, refined by measurements.

Every measured loss goes through :class:`cbo.hessian.measure.Measurer`.
"""

from __future__ import annotations

from cbo.hessian.base import ESTIMATORS, Estimator, Run, describe, get, names, register
from cbo.hessian.driver import estimate_hessian, tokens_hash
from cbo.hessian.fingerprint import model_fingerprint
from cbo.hessian.gates import Gates, gate_blocks, set_gates
from cbo.hessian.losses import LOSSES
from cbo.hessian.measure import Measurer, SetLosses, Work

__all__ = [
    "ESTIMATORS",
    "LOSSES",
    "Estimator",
    "Gates",
    "Measurer",
    "Run",
    "SetLosses",
    "Work",
    "describe",
    "estimate_hessian",
    "gate_blocks",
    "get",
    "model_fingerprint",
    "names",
    "register",
    "set_gates",
    "tokens_hash",
]
