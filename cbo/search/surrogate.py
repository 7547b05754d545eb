"""A Bayesian quadratic model of measured removal losses around a prior QUBO (the surrogate of ``cbo.search.refine``).

The measured loss of a removal set ``x`` (one row per measurement, ``n_w`` windows) is modelled as

    y(x) = s · E₀(x) + Σ_i w_i x_i + Σ_{i<j} w_ij x_i x_j + c + c_f · f(x) + ε,   ε ~ N(0, σ² / n_w),

with ``E₀`` the prior QUBO's energy, ``f`` the indicator of a low-fidelity measurement (fewer windows: their mean
differs from the full pool's by the windows' own difficulty), independent Gaussian priors ``w_i ~ N(0, τ₁²)``,
``w_ij ~ N(0, τ₂²)`` and near-flat ones on ``s, c, c_f``. Like BOCS (Baptista & Poloczek 2018) the coefficients
have a closed-form posterior and a posterior draw proposes the next sets (Thompson sampling); unlike BOCS's
sparsity prior this one shrinks towards the prior QUBO, which already ranks single blocks well. ``σ, τ₁, τ₂``
maximise the marginal likelihood over a grid, so the fit needs no held-out split.

All solves are in the measurements' space (an n × n Cholesky factor, n = measurements), which stays cheap when
there are more pair features than measurements (sublayer granularity: 1770 pairs); posterior draws use
Matheron's rule (a prior draw corrected by the data) and need the same factor only.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Any, Sequence

import numpy as np

from cbo.qubo.block_qubo import BlockQUBO

NOISE_GRID = (0.003, 0.01, 0.03, 0.1, 0.3)  # σ in units of the measured losses' spread (one window)
LINEAR_GRID = (0.003, 0.01, 0.03, 0.1, 0.3)  # τ₁, same units
PAIR_GRID = (0.001, 0.003, 0.01, 0.03, 0.1)  # τ₂, same units
FLAT = 1e2  # prior scale of s, c and c_f in the same units (near-flat; larger only worsens the conditioning)


def features(prior: BlockQUBO, X: np.ndarray, low: np.ndarray) -> np.ndarray:
    """Rows ``[E₀(x), x, x_i x_j (i < j), 1, f]`` for the sets ``X`` (K, N) and their low-fidelity flags."""
    X = np.asarray(X, dtype=np.float64).reshape(-1, prior.n)
    iu = np.triu_indices(prior.n, 1)
    pairs = (X[:, :, None] * X[:, None, :])[:, iu[0], iu[1]]
    e0 = np.atleast_1d(prior.energy(X.astype(np.uint8))) - prior.offset
    return np.hstack([e0[:, None], X, pairs, np.ones((X.shape[0], 1)), np.asarray(low, float).reshape(-1, 1)])


@dataclass
class Fit:
    """The posterior of one fit: its mean coefficients, the chosen hyperparameters and the factor for draws."""

    mean: np.ndarray
    prior_scale: np.ndarray  # prior standard deviation of every coefficient
    noise: float  # σ (per window)
    log_evidence: float
    Z: np.ndarray
    y: np.ndarray
    noise_var: np.ndarray
    chol: np.ndarray  # Cholesky factor of Z S₀ Zᵀ + D
    grid: tuple[int, int, int] = (0, 0, 0)  # indices of σ, τ₁, τ₂ in their grids

    @property
    def hyper(self) -> dict[str, Any]:
        return {
            "noise": self.noise,
            "tau_linear": float(self.prior_scale[1]),
            "tau_pair": float(self.prior_scale[-3]),
            "grid": list(self.grid),
        }


class BayesianQuadratic:
    """The surrogate: ``fit`` on measurements, then ``qubo()`` (the posterior mean) or ``draw(rng)`` (Thompson).

    Args:
        prior: the prior QUBO (its energy is the first feature; its names, kinds, sizes and constraints are kept).
    """

    def __init__(self, prior: BlockQUBO) -> None:
        self.prior = prior
        self.n = prior.n
        self.n_pairs = self.n * (self.n - 1) // 2
        self.fit_: Fit | None = None

    def _scales(self, spread: float, e0_spread: float, tau1: float, tau2: float) -> np.ndarray:
        s_scale = FLAT * spread / max(e0_spread, 1e-12)
        return np.concatenate(
            [[s_scale], np.full(self.n, tau1 * spread), np.full(self.n_pairs, tau2 * spread), [FLAT * spread] * 2]
        )

    def fit(
        self, X: np.ndarray, y: np.ndarray, windows: np.ndarray, low: np.ndarray, start: Sequence[int] | None = None
    ) -> Fit:
        """Fit on sets ``X`` (K, N) with mean losses ``y`` over ``windows`` windows each; ``low``: low fidelity.

        The hyperparameters maximise the evidence over the whole grid, or (``start``: grid indices of an earlier
        fit, ``Fit.hyper["grid"]``) by hill-climbing on the grid from there: a refit after a few more measurements
        moves little, at a fifth of the cost.
        """
        y = np.asarray(y, dtype=np.float64)
        nw = np.asarray(windows, dtype=np.float64)
        Z = features(self.prior, X, low)
        spread = float(np.std(y)) if len(y) > 1 and np.std(y) > 0 else max(abs(float(np.mean(y))), 1e-6)
        e0_spread = float(np.std(Z[:, 0])) if len(y) > 1 else 1.0
        e0_spread = e0_spread if e0_spread > 0 else max(abs(float(Z[0, 0])), 1.0)
        # the prior covariance of the measurements, one Gram matrix per block of features: each grid point only
        # weighs them (K² work instead of K² times the number of features)
        blocks = (slice(0, 1), slice(1, self.n + 1), slice(self.n + 1, -2), slice(-2, None))
        gram = [Z[:, b] @ Z[:, b].T for b in blocks]
        fits: dict[tuple[int, int, int], Fit | None] = {}

        def at(index: tuple[int, int, int]) -> Fit | None:
            if index not in fits:
                sigma, tau1, tau2 = NOISE_GRID[index[0]], LINEAR_GRID[index[1]], PAIR_GRID[index[2]]
                scale = self._scales(spread, e0_spread, tau1, tau2)
                noise_var = (sigma * spread) ** 2 / nw
                weights = (scale[0], tau1 * spread, tau2 * spread, FLAT * spread)  # the scales of the four blocks
                C = sum(w**2 * G for w, G in zip(weights, gram)) + np.diag(noise_var)
                try:
                    L = np.linalg.cholesky(C)
                except np.linalg.LinAlgError:
                    fits[index] = None
                    return None
                alpha = _solve_chol(L, y)
                ev = -0.5 * float(y @ alpha) - float(np.log(np.diag(L)).sum()) - 0.5 * len(y) * np.log(2 * np.pi)
                fits[index] = Fit(scale**2 * (Z.T @ alpha), scale, sigma * spread, ev, Z, y, noise_var, L, index)
            return fits[index]

        sizes = (len(NOISE_GRID), len(LINEAR_GRID), len(PAIR_GRID))
        if start is None:
            candidates = [at(i) for i in product(*(range(k) for k in sizes))]
        else:
            here = tuple(min(max(int(i), 0), k - 1) for i, k in zip(start, sizes))
            while True:  # to the best neighbour (each index within one step) until none is better
                near = product(*(range(max(i - 1, 0), min(i + 2, k)) for i, k in zip(here, sizes)))
                found = [f for f in (at(i) for i in near) if f is not None]
                if not found:
                    break
                top = max(found, key=lambda f: f.log_evidence)
                if top.grid == here:
                    break
                here = top.grid
            candidates = list(fits.values())
        found = [f for f in candidates if f is not None]
        if not found:
            raise np.linalg.LinAlgError("no hyperparameters gave a positive-definite covariance")
        self.fit_ = max(found, key=lambda f: f.log_evidence)
        return self.fit_

    def predict(self, X: np.ndarray, low: bool = False, theta: np.ndarray | None = None) -> np.ndarray:
        """Loss of sets ``X`` at full (or low) fidelity under ``theta`` (default: the posterior mean)."""
        Z = features(self.prior, X, np.full(np.asarray(X).reshape(-1, self.n).shape[0], float(low)))
        return Z @ (self._fitted().mean if theta is None else np.asarray(theta, dtype=np.float64))

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """One posterior draw of the coefficients (Matheron's rule: prior draw + data correction)."""
        f = self._fitted()
        theta0 = rng.standard_normal(f.mean.shape[0]) * f.prior_scale
        eps = rng.standard_normal(len(f.y)) * np.sqrt(f.noise_var)
        return theta0 + f.prior_scale**2 * (f.Z.T @ _solve_chol(f.chol, f.y - f.Z @ theta0 - eps))

    def qubo(self, theta: np.ndarray | None = None, metadata: dict[str, Any] | None = None) -> BlockQUBO:
        """The QUBO of coefficients ``theta`` (default: the posterior mean), full fidelity, with the prior's blocks."""
        theta = self._fitted().mean if theta is None else np.asarray(theta, dtype=np.float64)
        n, p = self.n, self.prior
        s, w = float(theta[0]), theta[1 : n + 1]
        W = np.zeros((n, n))
        W[np.triu_indices(n, 1)] = theta[n + 1 : n + 1 + self.n_pairs]
        W = W + W.T
        H = s * p.H + W  # ½ xᵀ W x = Σ_{i<j} w_ij x_i x_j
        g = s * p.g - w
        c = p.constraints
        return BlockQUBO(
            H,
            g,
            names=p.names,
            kinds=p.kinds,
            sizes=p.sizes,
            keep=c.keep,
            force=c.force,
            caps=dict(c.caps),
            max_removed_params=c.max_removed_params,
            min_removed_params=c.min_removed_params,
            offset=float(theta[n + 1 + self.n_pairs]),
            metadata=dict(metadata or {}),
            symmetrize=True,
        )

    def _fitted(self) -> Fit:
        if self.fit_ is None:
            raise RuntimeError("fit the surrogate first")
        return self.fit_


def _solve_chol(L: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(L Lᵀ)⁻¹ b`` (scipy's triangular solves when installed; numpy's general solve otherwise)."""
    try:
        from scipy.linalg import solve_triangular
    except ImportError:
        return np.linalg.solve(L.T, np.linalg.solve(L, b))
    return solve_triangular(L.T, solve_triangular(L, b, lower=True), lower=False)
