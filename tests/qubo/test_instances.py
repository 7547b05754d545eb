"""Synthetic instances: the Fisher-shaped generator against the statistics of the committed real QUBOs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cbo.errors import InvalidQUBOError
from cbo.qubo.block_qubo import BlockQUBO
from cbo.qubo.instances import fisher_block_qubo, fisher_statistics

INSTANCES = Path(__file__).resolve().parents[2] / "benchmarks" / "instances"

# Tolerances on the mean over 10 seeds: absolute for fractions and correlations, a ratio for the diagonal
# profile (its largest entry is one block, so it varies most from seed to seed).
ABSOLUTE = {
    "top_eigenvalue": 0.05,
    "top5_eigenvalues": 0.06,
    "top10_eigenvalues": 0.05,
    "negative_couplings": 0.04,
    "correlation_sd": 0.03,
    "last_correlation": 0.12,
}
RATIO = {"max_diagonal": (0.6, 1.6), "p90_diagonal": (0.7, 1.4), "coupling_ratio": (0.8, 1.25)}


@pytest.mark.parametrize(
    "name, n, granularity",
    [("smollm2-135m_sublayer_fisher-kl", 60, "sublayer"), ("smollm2-135m_layer_fisher-kl", 30, "layer")],
)
def test_fisher_instances_match_the_real_statistics(name, n, granularity):
    real = BlockQUBO.load(INSTANCES / f"{name}.cboq")
    target = fisher_statistics(real.H)
    assert real.metadata["n_sequences"] == 32  # the generator's default sample count is fitted to this
    stats = [fisher_statistics(fisher_block_qubo(n, seed, granularity=granularity).H) for seed in range(10)]
    for key, tol in ABSOLUTE.items():
        mean = float(np.mean([s[key] for s in stats]))
        assert abs(mean - target[key]) <= tol, (key, mean, target[key])
    for key, (lo, hi) in RATIO.items():
        ratio = float(np.mean([s[key] for s in stats])) / target[key]
        assert lo <= ratio <= hi, (key, ratio)
    assert all(s["rank"] == min(n, 32) for s in stats)


def test_fisher_instance_shape_and_reproducibility():
    q = fisher_block_qubo(80, seed=3)
    assert q.n == 80 and np.allclose(q.g, 0) and q.kinds == ("layer",) * 80
    assert np.linalg.eigvalsh(q.H)[0] > -1e-12 and np.linalg.matrix_rank(q.H) == 32
    assert np.mean(np.diag(q.H)) == pytest.approx(0.3)
    assert np.array_equal(q.H, fisher_block_qubo(80, seed=3).H)
    assert not np.array_equal(q.H, fisher_block_qubo(80, seed=4).H)
    full = fisher_block_qubo(80, seed=3, samples=2048)
    assert np.linalg.matrix_rank(full.H) == 80 and full.metadata["samples"] == 2048
    sub = fisher_block_qubo(8, seed=0, granularity="sublayer")
    assert sub.kinds == ("attention", "mlp") * 4
    assert sub.names[:3] == ("layers.0.attn", "layers.0.mlp", "layers.1.attn")
    # heavy ends: the first blocks and the last one cost far more than the median block
    d = np.diag(q.H)
    assert d[1] > 3 * np.median(d) and d[-1] > 5 * np.median(d)
    # the last block compensates its predecessor (population correlation -0.62, sampled with 2048 rows)
    dd = np.sqrt(np.diag(full.H))
    assert full.H[-1, -2] / (dd[-1] * dd[-2]) == pytest.approx(-0.62, abs=0.08)


def test_fisher_instance_bad_input():
    with pytest.raises(InvalidQUBOError, match="n must be"):
        fisher_block_qubo(1)
    with pytest.raises(InvalidQUBOError, match="samples"):
        fisher_block_qubo(10, samples=0)
    with pytest.raises(InvalidQUBOError, match="granularity"):
        fisher_block_qubo(10, granularity="head")
    with pytest.raises(InvalidQUBOError, match="even"):
        fisher_block_qubo(9, granularity="sublayer")
    with pytest.raises(InvalidQUBOError, match="spread"):
        fisher_block_qubo(10, spread=-1.0)
