"""Depth proposers: which decoder layer(s) a depth step removes, for MoP and for ``compress``'s one-shot part.

A proposer is a callable ``(model, calibration) -> layer index or None`` (the next layer MoP's depth step
removes; None: no depth candidate, see :mod:`cbo.width.mop`) with a ``layers(model, calibration, n)`` method
for the one-shot depth part of :func:`cbo.pipeline.compression.compress`:

* :class:`Antepenultimate` — MoP's rule: the layers just before the last two;
* :class:`CBOProposer` — the ground state of the CBO QUBO of the current model (KL Hessian of the layer
  gates by :func:`cbo.hessian.estimate_hessian`, solved with the first and last layers kept).

This is the pipeline layer: it may estimate Hessians and run solvers, which the width modules never do.

Example:
    >>> propose = depth_proposer("cbo", solver="enumerate")                        # doctest: +SKIP
    >>> propose(model, calibration), propose.layers(model, calibration, 3)         # doctest: +SKIP
    (17, [14, 17, 21])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from cbo.errors import InfeasibleError, UnknownNameError
from cbo.model.blocks import decoder_layers
from cbo.model.forward import torch_threads_kept
from cbo.pipeline.options import DEFAULT_ESTIMATOR
from cbo.width.mop import DepthProposer, antepenultimate

DEPTH_METHODS = ("none", "cbo", "antepenultimate")


def removable_layers(model: Any, n: int) -> int:
    """The number of decoder layers of ``model``, after checking that a one-shot step may remove ``n`` of them."""
    layers = len(decoder_layers(model)[0])
    if n > layers - 3:
        raise InfeasibleError(f"cannot remove {n} of {layers} layers by depth (the first and last two stay)")
    return layers


class Antepenultimate:
    """MoP's depth rule (the paper): the layer(s) just before the last two."""

    name: ClassVar[str] = "antepenultimate"

    def __call__(self, model: Any, calibration: Any = None) -> int | None:
        return antepenultimate(model, calibration)

    def layers(self, model: Any, calibration: Any, n: int) -> list[int]:
        """The ``n`` layers just before the last two."""
        if n <= 0:
            return []
        layers = removable_layers(model, n)
        return list(range(layers - 2 - n, layers - 2))


@dataclass
class CBOProposer:
    """The ground state of the CBO QUBO (KL loss, layer gates) with the first and last layers kept.

    Args:
        estimator: the Hessian estimator (``cbo.hessian``).
        solver: a registered solver; ``"auto"`` falls back to ``"enumerate"`` where no automatic one is registered.
        batch_size / seed / progress: for the estimate and the solve.
    """

    name: ClassVar[str] = "cbo"
    estimator: str = DEFAULT_ESTIMATOR
    solver: str = "enumerate"
    batch_size: int = 4
    seed: int = 0
    progress: bool = False

    def __call__(self, model: Any, calibration: Any) -> int | None:
        if len(decoder_layers(model)[0]) < 3:
            return None
        return self.solve(model, calibration, 1)[0]

    def layers(self, model: Any, calibration: Any, n: int) -> list[int]:
        """The ``n`` layers of the QUBO's ground state."""
        if n <= 0:
            return []
        removable_layers(model, n)
        return self.solve(model, calibration, n)

    def solve(self, model: Any, calibration: Any, n: int) -> list[int]:
        """Estimate the QUBO of ``model`` on ``calibration`` and return the ``n`` layers its ground state removes."""
        import cbo.solvers as solvers
        from cbo.hessian import estimate_hessian

        layers = len(decoder_layers(model)[0])
        qubo = estimate_hessian(
            model,
            None,
            calibration,
            estimator=self.estimator,
            loss="kl",
            granularity="layer",
            batch_size=self.batch_size,
            seed=self.seed,
            progress=self.progress,
        )
        solver = "enumerate" if self.solver == "auto" and "auto" not in solvers.names() else self.solver
        with torch_threads_kept():
            states = solvers.solve(qubo, remove=n, solver=solver, k=1, keep=[0, layers - 1], seed=self.seed)
        return sorted(int(i) for i in states.removed(0))


def depth_proposer(
    method: str,
    *,
    estimator: str = DEFAULT_ESTIMATOR,
    solver: str = "enumerate",
    batch_size: int = 4,
    seed: int = 0,
    progress: bool = False,
) -> DepthProposer | None:
    """The proposer named by ``compress``'s ``depth`` option: ``cbo``, ``antepenultimate``, or None for ``none``.

    The keyword options configure the ``cbo`` proposer (see :class:`CBOProposer`).
    """
    if method == "none":
        return None
    if method == "antepenultimate":
        return Antepenultimate()
    if method == "cbo":
        return CBOProposer(estimator=estimator, solver=solver, batch_size=batch_size, seed=seed, progress=progress)
    raise UnknownNameError(f"unknown depth method {method!r}; use one of {list(DEPTH_METHODS)}")
