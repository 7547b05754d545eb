"""``trust``: the ``hybrid`` QUBO re-expanded around its own solution, trust-region style, for a given M.

A QUBO expanded at "all blocks kept" is asked about states far from there (M of N blocks removed), where its
linear and quadratic terms no longer describe the loss. This estimator moves the expansion point to the
solution and corrects it with measurements made there:

1. Build the ``hybrid`` QUBO (measured single removals + Fisher-correlation couplings) and solve it for
   ``remove`` blocks: the state S (gates ``a_S``: 0 for the removed blocks, 1 for the rest).
2. Measure the calibration loss ``D(S)`` and of every single flip ``D(S ⊕ i)`` (restore a removed block, or
   remove one more). Re-expand at S: with ``δ = x − x_S``,
   ``E_S(x) = D(S) + Σ_i l_i δ_i + ½ δᵀ H δ``, ``l_i`` chosen so that every single flip is exact
   (``E_S(S ⊕ i) = D(S ⊕ i)``) and ``H`` the couplings of the global model. As a QUBO in x this is the global
   QUBO plus a linear correction.
3. Inside the trust region (moves of at most ``radius`` swaps, each restoring one removed block and removing one
   kept block, so Σx stays M) rank the moves by ``E_S`` and measure the ``proposals`` best. Move to the best
   measured state if it lowers the measured loss; repeat from 2 (at most ``max_steps`` times).
4. Return ``E_{S*}`` at the final state, with the couplings of the measured swaps set so that they are exact,
   plus ``locality`` × (Hamming distance to S*): low-energy states are S* and its best predicted neighbours.

Outside blocks whose single-removal damage exceeds ``screen`` times the largest one inside S are not
considered for removal (their flips are not measured). ``keep`` lists blocks never removed; ``prune_depth``
passes its ``remove`` and ``keep`` to the estimator.

Cost: ``hybrid`` plus, per step, up to N flips and ``proposals`` swaps measured on every calibration batch
(streams shared through a prefix tree). The metadata records the path (states and measured losses) and the
work done.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from cbo.checks import check_float, check_int
from cbo.hessian.base import register
from cbo.hessian.hybrid import CalibrationLosses, TargetedEstimator, TargetedOptions


def flip_delta(H: np.ndarray, g: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``E(x ⊕ e_i) − E(x)`` for every i, for ``E = ½xᵀHx − g·x``."""
    sign = 1.0 - 2.0 * x
    field = H @ x - np.diag(H) * x
    return sign * (0.5 * np.diag(H) + field - g)


def energies(H: np.ndarray, g: np.ndarray, X: np.ndarray) -> np.ndarray:
    return 0.5 * np.einsum("ki,ij,kj->k", X, H, X) - X @ g


@register
class TrustRegionEstimator(TargetedEstimator):
    name = "trust"
    description = "hybrid QUBO re-expanded at its solution: measured flips, swaps in a Hamming ball, repeated"
    cost = "hybrid + per step up to N + `proposals` removal sets measured per batch, at most `max_steps` steps"

    @dataclass
    class Options(TargetedOptions):
        radius: int = 1  # swaps per move (Hamming distance 2·radius)
        proposals: int = 4  # predicted-best moves measured per step
        max_steps: int = 8
        locality: float = 0.0  # energy per unit of Hamming distance from the final state, in units of D(S*)/M
        estimator: ClassVar[str] = "trust"

        def validate(self) -> None:
            TargetedOptions.validate(self)
            check_int("radius", self.radius, 1)
            check_int("proposals", self.proposals, 1)
            check_int("max_steps", self.max_steps, 0)
            check_float("locality", self.locality, 0)

    # ------------------------------------------------------------------ the search
    def _start(self, H: np.ndarray, g: np.ndarray, m: int, keep: set[int]) -> np.ndarray:
        from cbo.qubo.block_qubo import BlockQUBO
        from cbo.solvers import solve

        q = BlockQUBO(H, g, keep=sorted(keep)) if keep else BlockQUBO(H, g)
        states = solve(q, m, "enumerate", k=1)
        x = np.zeros(len(g))
        x[list(states[0].removed)] = 1.0
        return x

    def _moves(self, x: np.ndarray, allowed_in: list[int], radius: int) -> list[np.ndarray]:
        inside = [int(i) for i in np.flatnonzero(x)]
        out = []
        for r in range(1, radius + 1):
            for a in itertools.combinations(inside, r):
                for b in itertools.combinations(allowed_in, r):
                    y = x.copy()
                    y[list(a)] = 0.0
                    y[list(b)] = 1.0
                    out.append(y)
        return out

    def finalize(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        opts = self.options
        H0, g0 = self.base_qubo(state)
        n = len(g0)
        m, keep = self.remove, self.keep
        D1 = self.singles(state)
        meter = CalibrationLosses(self, state)
        x = self._start(H0, g0, m, keep)
        d_x = float(meter([np.flatnonzero(x)])[0])
        path = [{"removed": [int(i) for i in np.flatnonzero(x)], "loss": d_x}]
        while True:
            H, g, allowed = self._expand(meter, H0, g0, x, d_x, D1, keep)
            if len(path) > opts.max_steps:
                break
            moves = self._moves(x, allowed, opts.radius)
            if not moves:
                break
            X = np.array(moves)
            picked: list[tuple[int, ...]] = []
            for k in np.argsort(energies(H, g, X), kind="stable"):
                key = tuple(int(i) for i in np.flatnonzero(X[k]))
                if key not in meter.values:
                    picked.append(key)
                    if len(picked) == opts.proposals:
                        break
            if not picked:
                break
            losses = meter(picked)
            best = int(np.argmin(losses))
            if losses[best] >= d_x:
                break
            x = np.zeros(n)
            x[list(picked[best])] = 1.0
            d_x = float(losses[best])
            path.append({"removed": list(picked[best]), "loss": d_x})
        H, g = self._exact_swaps(meter, H, g, x, d_x, keep)
        if opts.locality > 0:
            mu = opts.locality * max(d_x, 0.0) / m
            g = g - mu * (1.0 - 2.0 * x)  # + μ·Σ_i x_i(1 − 2x*_i) = Hamming distance − |S*|
        extra = self.measured_metadata(state)
        extra.update(
            {
                "trust_path": path,
                "trust_steps": len(path) - 1,
                "trust_final": {
                    "removed": [int(i) for i in np.flatnonzero(x)],
                    "loss": d_x,
                    # measured single flips at the final state (block -> loss); screened-out blocks are absent
                    "flips": {
                        str(i): meter.values[k]
                        for i in range(n)
                        if (k := tuple(sorted({int(j) for j in np.flatnonzero(x)} ^ {i}))) in meter.values
                    },
                },
                "trust_start_loss": path[0]["loss"],
                "trust_sets_measured": len(meter.values),
            }
        )
        return H, g, extra

    def _expand(
        self,
        meter: CalibrationLosses,
        H0: np.ndarray,
        g0: np.ndarray,
        x: np.ndarray,
        d_x: float,
        D1: np.ndarray,
        keep: set[int],
    ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """The global QUBO with its linear term corrected so that every measured single flip at x is exact."""
        n = len(g0)
        inside = np.flatnonzero(x)
        worst = float(np.max(D1[inside])) if len(inside) else 0.0
        allowed = [
            i for i in range(n) if x[i] == 0 and i not in keep and D1[i] <= self.options.screen * max(worst, 0.0)
        ]
        flip_sets = []
        for i in [int(j) for j in inside] + allowed:
            s = set(int(j) for j in inside)
            s.symmetric_difference_update({i})
            flip_sets.append((i, sorted(s)))
        values = meter([s for _, s in flip_sets])
        flips = {i: float(v) for (i, _), v in zip(flip_sets, values)}
        model_delta = flip_delta(H0, g0, x)
        g = g0.copy()
        for i, v in flips.items():
            # the linear term w_i x_i changes the flip of i by w_i (1 − 2x_i); g = −(linear term)
            w = ((v - d_x) - model_delta[i]) / (1.0 - 2.0 * x[i])
            g[i] -= w
        return H0, g, allowed

    def _exact_swaps(
        self, meter: CalibrationLosses, H: np.ndarray, g: np.ndarray, x: np.ndarray, d_x: float, keep: set[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Couplings of every measured one-swap neighbour of x set so that its energy is exact, flips kept exact."""
        H = H.copy()
        g = g.copy()
        inside = {int(i) for i in np.flatnonzero(x)}
        flip = {}
        for i in range(len(g)):
            key = tuple(sorted(inside ^ {i}))
            if key in meter.values:
                flip[i] = meter.values[key] - d_x
        changed = False
        for key, v in meter.values.items():
            s = set(key)
            if len(s) != len(inside) or len(s ^ inside) != 2:
                continue
            (a,) = inside - s  # restored
            (b,) = s - inside  # removed
            if a in flip and b in flip:
                # E(x − e_a + e_b) − E(x) = Δ_a + Δ_b − H_ab when the flips are exact
                H[a, b] = H[b, a] = flip[a] + flip[b] - (v - d_x)
                changed = True
        if changed:
            model_delta = flip_delta(H, g, x)
            for i, target in flip.items():
                g[i] -= (target - model_delta[i]) / (1.0 - 2.0 * x[i])
        return H, g
