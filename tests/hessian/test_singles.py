"""``singles``: every energy is the sum of the measured single-removal losses of the surgically pruned model."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_hybrid import measured_increase

from cbo.errors import CBOError
from cbo.hessian import estimate_hessian, names


@pytest.mark.parametrize("loss", ["kl", "ce"])
def test_energy_is_the_sum_of_measured_single_removals(tiny_model, tiny_windows, loss):
    model = tiny_model("llama", n_layers=5)
    windows = tiny_windows(model, n=4, seq_len=10)
    q = estimate_hessian(model, None, windows, estimator="singles", loss=loss, batch_size=2, progress=False)
    ref = np.array([measured_increase(model, windows, [i], loss) for i in range(5)])
    assert np.all(q.H - np.diag(np.diag(q.H)) == 0) and np.all(q.g == 0)
    for r in (1, 2, 3):
        for s in itertools.combinations(range(5), r):
            x = np.zeros(5)
            x[list(s)] = 1
            assert q.energy(x) == pytest.approx(ref[list(s)].sum(), abs=1e-5)
    assert q.metadata["backward_passes"] == 0 and q.metadata["set_evaluations"] == 5 * 2


def test_singles_is_registered_and_refuses_couplings(tiny_model, tiny_windows):
    assert "singles" in names()
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=2, seq_len=8)
    with pytest.raises(CBOError, match="has no couplings"):
        estimate_hessian(model, None, windows, estimator="singles", couplings="positive", progress=False)
