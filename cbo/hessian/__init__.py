"""Hessian estimators: the block-removal QUBO of a model from calibration text.

``estimate_hessian(model, tokenizer, windows, estimator=..., loss=...)`` returns a BlockQUBO. Every
module in this package that defines an estimator registers it on import, so a new estimator is one
new module (a class decorated with ``@register``; see ``base.py``). Built in:

* ``fisher``   Gauss-Newton/Fisher from per-sequence gate gradients, one backward per batch.
* ``exact``    autograd Hessian of the gate vector (N Hessian-vector products per batch).
* ``pairwise`` measured loss with every single and pair of blocks removed.
"""

from __future__ import annotations

import importlib
import pkgutil

from cbo.hessian.base import (
    Estimator,
    Run,
    UnknownEstimatorError,
    describe,
    estimate_hessian,
    get,
    names,
    register,
    tokens_hash,
)
from cbo.hessian.fingerprint import model_fingerprint
from cbo.hessian.gates import Gates, gate_blocks, set_gates
from cbo.hessian.losses import LOSSES

# modules that hold machinery rather than estimators
_INFRASTRUCTURE = {"base", "gates", "losses", "checkpoint"}


def _import_estimators() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _INFRASTRUCTURE and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_import_estimators()

__all__ = [
    "LOSSES",
    "Estimator",
    "Gates",
    "Run",
    "UnknownEstimatorError",
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
