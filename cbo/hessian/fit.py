"""``fit``: a QUBO fitted to measured losses of removal sets of the target size M.

The damage of removing blocks is sub-additive (two removals hurt less than the sum of each: the model's output
saturates), and a quadratic model built from singles and pairs extrapolates that to M blocks, where it no
longer holds. This estimator asks the loss where the answer is needed instead:

1. Build the ``hybrid`` QUBO E₀ (measured single removals + Fisher-correlation couplings).
2. Sample ``n_sets`` distinct removal sets of size ``remove``: the lowest-energy states of E₀ (a third of them)
   and random perturbations of those by 1 to 3 swaps (each restoring one removed block and removing another),
   so that the sample covers the region where the solution will be chosen. Measure each set's calibration loss.
3. Fit ``D(S) ≈ α + β E₀(S) + Σ_i w_i x_i + Σ_{i<j} v_ij x_i x_j`` by ridge regression (``w`` and ``v``
   penalized, ``α`` and ``β ≥ 0`` not), with the penalty chosen by 5-fold cross-validation over a grid
   (``ridge`` fixes it instead). The QUBO is ``β E₀ + Σ w_i x_i + Σ v_ij x_i x_j``: E₀ where the data says
   nothing, corrected where it does.

Outside blocks whose single-removal damage exceeds ``screen`` times the largest one inside a state are not
used in the perturbations. ``prune_depth`` passes its ``remove`` and ``keep``. The metadata holds the
cross-validated error and rank correlation of the fit, the penalty, β and the work done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from cbo.checks import check_float, check_int
from cbo.hessian.base import register
from cbo.hessian.hybrid import CalibrationLosses, TargetedEstimator, TargetedOptions

RIDGE_GRID = tuple(10.0**k for k in np.arange(-4.0, 2.01, 0.5))


def pair_features(X: np.ndarray) -> np.ndarray:
    """``x_i x_j`` for i < j, in ``np.triu_indices`` order."""
    iu = np.triu_indices(X.shape[1], 1)
    return X[:, iu[0]] * X[:, iu[1]]


def ridge_fit(Z: np.ndarray, y: np.ndarray, free: int, lam: float) -> np.ndarray:
    """Least squares with an intercept and ``lam``·‖θ‖² on every column of ``Z`` but the first ``free`` ones.

    Returns ``[intercept, θ...]``.
    """
    zm, ym = Z.mean(0), y.mean()
    Zc, yc = Z - zm, y - ym
    penalty = np.full(Z.shape[1], lam * len(y))
    penalty[:free] = 0.0
    A = Zc.T @ Zc + np.diag(penalty)
    theta = np.linalg.lstsq(A, Zc.T @ yc, rcond=None)[0]
    return np.concatenate([[ym - zm @ theta], theta])


def cross_validate(Z: np.ndarray, y: np.ndarray, free: int, grid: tuple[float, ...], seed: int) -> dict[str, Any]:
    """5-fold cross-validated RMSE and Spearman correlation of ``ridge_fit`` for every penalty in ``grid``."""
    from scipy.stats import spearmanr

    k = min(5, len(y))
    folds = np.random.default_rng(seed).permutation(len(y)) % k
    out = []
    for lam in grid:
        pred = np.zeros(len(y))
        for f in range(k):
            test = folds == f
            coef = ridge_fit(Z[~test], y[~test], free, lam)
            pred[test] = coef[0] + Z[test] @ coef[1:]
        rmse = float(np.sqrt(np.mean((pred - y) ** 2)))
        rho = float(spearmanr(pred, y).statistic) if np.std(pred) > 0 else 0.0
        out.append({"ridge": lam, "cv_rmse": rmse, "cv_spearman": rho})
    best = min(out, key=lambda r: r["cv_rmse"])
    return {"best": best, "grid": out}


@register
class FitEstimator(TargetedEstimator):
    name = "fit"
    description = "QUBO fitted (ridge) to measured losses of sets of the target size near the hybrid solution"
    cost = "hybrid + `n_sets` removal sets of size M measured per batch"

    @dataclass
    class Options(TargetedOptions):
        n_sets: int = 120  # measured sets of size M
        ridge: float | None = None  # penalty; None = chosen by 5-fold cross-validation
        estimator: ClassVar[str] = "fit"

        def validate(self) -> None:
            TargetedOptions.validate(self)
            check_int("n_sets", self.n_sets, 5)
            if self.ridge is not None:
                check_float("ridge", self.ridge, 0)

    def sample_sets(self, H0: np.ndarray, g0: np.ndarray, D1: np.ndarray, m: int, keep: set[int]) -> list[list[int]]:
        """Low-energy states of E₀ and their 1-3 swap perturbations, ``n_sets`` distinct sets of size m."""
        from cbo.qubo.block_qubo import BlockQUBO
        from cbo.solvers import solve

        n = len(g0)
        q = BlockQUBO(H0, g0, keep=sorted(keep)) if keep else BlockQUBO(H0, g0)
        n_low = max(1, self.options.n_sets // 3)
        low = [sorted(int(i) for i in s.removed) for s in solve(q, m, "enumerate", k=n_low)]
        sets = {tuple(s) for s in low}
        out = [list(s) for s in low]
        rng = np.random.default_rng([self.run.seed, m, 17])
        free = [i for i in range(n) if i not in keep]
        attempts = 0
        while len(out) < self.options.n_sets and attempts < 100 * self.options.n_sets:
            attempts += 1
            s = set(low[int(rng.integers(len(low)))])
            worst = max(D1[list(s)])
            outside = [i for i in free if i not in s and D1[i] <= self.options.screen * max(worst, 0.0)]
            if not outside:
                continue
            r = int(rng.integers(1, min(3, len(s), len(outside)) + 1))
            for a, b in zip(
                rng.choice(sorted(s), size=r, replace=False), rng.choice(outside, size=r, replace=False), strict=True
            ):
                s.discard(int(a))
                s.add(int(b))
            key = tuple(sorted(s))
            if key not in sets:
                sets.add(key)
                out.append(list(key))
        return out

    def finalize(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        H0, g0 = self.base_qubo(state)
        n = len(g0)
        m, keep = self.remove, self.keep
        D1 = self.singles(state)
        sets = self.sample_sets(H0, g0, D1, m, keep)
        meter = CalibrationLosses(self, state)
        y = meter(sets)
        X = np.zeros((len(sets), n))
        for k, s in enumerate(sets):
            X[k, s] = 1.0
        e0 = 0.5 * np.einsum("ki,ij,kj->k", X, H0, X) - X @ g0
        Z = np.hstack([e0[:, None], X, pair_features(X)])
        if self.options.ridge is None:
            cv = cross_validate(Z, y, 1, RIDGE_GRID, self.run.seed)
            lam = cv["best"]["ridge"]
        else:
            lam = float(self.options.ridge)
            cv = cross_validate(Z, y, 1, (lam,), self.run.seed)
        coef = ridge_fit(Z, y, 1, lam)
        beta = coef[1]
        if beta < 0:  # an anti-correlated prior is no prior: refit without it
            beta = 0.0
            r = ridge_fit(Z[:, 1:], y, 0, lam)
            coef = np.concatenate([[r[0], 0.0], r[1:]])
        w = coef[2 : 2 + n]
        v = coef[2 + n :]
        V = np.zeros((n, n))
        iu = np.triu_indices(n, 1)
        V[iu] = v
        V = V + V.T
        H = beta * H0 + V
        H[np.diag_indices(n)] = beta * np.diag(H0) + 2.0 * w
        g = beta * g0
        extra = self.measured_metadata(state)
        extra.update(
            {
                "fit": {
                    "sets": len(sets),
                    "ridge": lam,
                    "beta": float(beta),
                    "intercept": float(coef[0]),
                    "cv_rmse": cv["best"]["cv_rmse"],
                    "cv_spearman": cv["best"]["cv_spearman"],
                    "loss_range": [float(y.min()), float(y.max())],
                    "grid": cv["grid"],
                },
                "fit_best_measured": {"removed": sets[int(np.argmin(y))], "loss": float(y.min())},
            }
        )
        return H, g, extra
