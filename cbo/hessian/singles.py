"""``singles``: the measured loss of removing each block alone, and no couplings — the default estimator.

``E(x) = Σ_i D_i x_i`` with ``D_i`` the calibration loss increase (KL to the original, or cross-entropy) of the
model with block i deleted, measured exactly (no Taylor expansion) through the prefix tree of ``measure.py``:
about N/2 forward passes per batch plus N runs of the head, no backward pass. Its ground state is the
one-at-a-time ranking; its value in the pipeline is the spectrum above it — the excited states are the sets
that trade one cheap block for a slightly dearer one, and validating the top 10 on held-out text picks among
them.

Why this is the default (BENCHMARKS.md, "Energy fidelity and the default estimator"): on the default model it
was the only variant whose validated choice beat every depth baseline at both M = 8 and M = 15 of 30. The
second-order ``fisher`` estimate (one forward + one backward) stays available as the cheap option, and
``hybrid``, ``pairwise``, ``fit`` and ``trust`` add couplings, which helped at one M and hurt at the other there.

It is ``hybrid`` with ``couplings="none"`` under its own name, so that the default carries no Fisher pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbo.errors import InvalidOptionError
from cbo.hessian.base import register
from cbo.hessian.hybrid import HybridEstimator


@register
class SinglesEstimator(HybridEstimator):
    name = "singles"
    description = "measured single-block removal losses, no couplings (validated excited states choose)"
    cost = "N single removals per batch (prefix-shared, about N/2 forward passes), no backward pass"

    @dataclass
    class Options(HybridEstimator.Options):
        couplings: str = "none"

        def validate(self) -> None:
            HybridEstimator.Options.validate(self)
            if self.couplings != "none":
                raise InvalidOptionError(
                    f"estimator 'singles' has no couplings (got couplings={self.couplings!r}); "
                    "use estimator='hybrid' for measured singles with couplings."
                )
