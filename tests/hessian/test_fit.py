"""``fit``: the fitted QUBO against losses measured on surgically pruned models (every set of the target size)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hessian_reference import logits_of, ref_loss_per_sequence, teacher_logprobs

from cbo.errors import CBOError
from cbo.hessian import estimate_hessian
from cbo.hessian.fit import cross_validate, pair_features, ridge_fit
from cbo.surgery.depth import remove_blocks

N, M = 5, 2


def _x(removed):
    x = np.zeros(N)
    x[list(removed)] = 1
    return x


def test_fit_on_every_set_reproduces_the_measured_losses(tiny_model, tiny_windows):
    model = tiny_model("qwen2", n_layers=N, seed=4)
    windows = tiny_windows(model, n=4, seq_len=10)
    teacher = teacher_logprobs(model, windows)
    sets = list(itertools.combinations(range(N), M))
    with torch.no_grad():
        measured = np.array(
            [
                float(
                    ref_loss_per_sequence(
                        logits_of(remove_blocks(model, list(s)), windows), windows, "kl", teacher
                    ).mean()
                )
                for s in sets
            ]
        )
    # all C(5, 2) = 10 sets sampled; one pair feature per set, so a tiny ridge interpolates them
    q = estimate_hessian(
        model, None, windows, estimator="fit", remove=M, n_sets=30, ridge=1e-9, screen=1e9, batch_size=2, progress=False
    )
    assert q.metadata["fit"]["sets"] == math.comb(N, M)
    energy = np.array([q.energy(_x(s)) for s in sets])
    np.testing.assert_allclose(energy - energy.mean(), measured - measured.mean(), atol=1e-4)
    best = q.metadata["fit_best_measured"]
    assert tuple(best["removed"]) == sets[int(np.argmin(measured))]
    assert best["loss"] == pytest.approx(measured.min(), abs=1e-5)


def test_sampled_sets_are_distinct_of_size_m_and_respect_keep(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=6)
    windows = tiny_windows(model, n=2, seq_len=8)
    q = estimate_hessian(
        model, None, windows, estimator="fit", remove=2, keep=[0], n_sets=9, batch_size=2, progress=False, screen=1e9
    )
    fit = q.metadata["fit"]
    assert fit["sets"] == 9 and fit["ridge"] in [g["ridge"] for g in fit["grid"]]
    assert min(g["cv_rmse"] for g in fit["grid"]) == fit["cv_rmse"]
    assert 0 not in q.metadata["fit_best_measured"]["removed"]
    with pytest.raises(CBOError, match="remove=M"):
        estimate_hessian(model, None, windows, estimator="fit", progress=False)


def test_ridge_regression_against_numpy_least_squares():
    rng = np.random.default_rng(0)
    X = (rng.random((40, 6)) < 0.5).astype(float)
    Z = np.hstack([rng.normal(size=(40, 1)), X, pair_features(X)])
    y = Z @ rng.normal(size=Z.shape[1]) + 0.3
    coef = ridge_fit(Z, y, 1, 0.0)
    ref = np.linalg.lstsq(np.hstack([np.ones((40, 1)), Z]), y, rcond=None)[0]
    np.testing.assert_allclose(coef[0] + Z @ coef[1:], np.hstack([np.ones((40, 1)), Z]) @ ref, atol=1e-8)
    # a huge penalty shrinks every penalized coefficient to 0 and leaves the free one
    big = ridge_fit(Z, y, 1, 1e12)
    assert np.abs(big[2:]).max() < 1e-6 and abs(big[1]) > 1e-3
    cv = cross_validate(Z, y, 1, (1e-8, 1e3), seed=0)
    assert cv["best"]["ridge"] == 1e-8 and cv["best"]["cv_spearman"] > 0.9
