"""The prior of the refinement loop (:func:`cbo.search.refine.refine`): a given QUBO, or one measured on the
calibration windows (``singles``) or estimated there (any registered estimator), with its cost in FPE."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from cbo.errors import InvalidOptionError
from cbo.qubo.block_qubo import BlockQUBO


def measure_prior(
    blocks: Sequence[Any],
    calibration: Any,
    windows: list[int],
    prior: str | BlockQUBO,
    prior_cost: float,
    measure: Any,
    model: Any,
) -> tuple[BlockQUBO, float]:
    """``(prior QUBO, its cost in FPE)``: a given QUBO as it is, or ``singles`` / an estimator measured on the
    calibration ``windows`` (the low- or high-fidelity ones). The prior's cost is its own item: the measurements'
    FPE counter (what the rounds' budget counts) is left as it was."""
    names, kinds, sizes = [b.name for b in blocks], [b.kind for b in blocks], [int(b.n_params) for b in blocks]
    if isinstance(prior, BlockQUBO):
        if prior.n != len(blocks):
            raise InvalidOptionError(f"the prior QUBO has {prior.n} blocks but the block list has {len(blocks)}")
        return prior, float(prior_cost)
    if prior == "singles":
        before, pairs_before = measure.fpe, measure.pairs
        singles = [(i,) for i in range(len(blocks))]
        D = measure(singles, windows).mean(axis=1)
        cost = float(measure.fpe - before)
        measure.fpe, measure.pairs = before, pairs_before
        meta = {"estimator": "singles", "loss": "kl", "windows": list(windows), "fpe": cost}
        return BlockQUBO(np.diag(2.0 * D), names=names, kinds=kinds, sizes=sizes, metadata=meta), cost
    if not isinstance(prior, str):
        raise InvalidOptionError(f"prior must be an estimator name or a BlockQUBO, got {type(prior).__name__}")
    from cbo.hessian import estimate_hessian

    q = estimate_hessian(model, None, calibration[windows], estimator=prior, blocks=blocks, progress=False)
    meta = q.metadata
    per_batch = meta.get("fpe", meta.get("forward_passes", 0) + 2 * meta.get("backward_passes", 0))
    cost = float(per_batch) * min(int(meta.get("batch_size", 8)), len(windows))
    return q, cost
