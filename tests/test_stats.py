"""cbo.stats.paired_ppl_ratio against exact cases and a plain loop over the same bootstrap draws."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cbo.errors import InvalidOptionError
from cbo.stats import paired_ppl_ratio


def test_exact_cases():
    a = np.random.default_rng(0).normal(4.0, 0.5, 64)
    assert paired_ppl_ratio(a, a, 500) == (1.0, 1.0, 1.0)
    ratio, lo, hi = paired_ppl_ratio(a - 0.1, a, 500)  # every window 0.1 nats better: exactly exp(-0.1)
    assert ratio == pytest.approx(math.exp(-0.1)) and lo == pytest.approx(ratio) and hi == pytest.approx(ratio)


def test_equals_a_plain_loop_over_the_same_draws():
    rng = np.random.default_rng(1)
    a = rng.normal(4.0, 0.5, 40)
    b = a + rng.normal(0.05, 0.3, 40)
    ratio, lo, hi = paired_ppl_ratio(a, b, 300, seed=7)
    draws = np.random.default_rng(7).integers(0, 40, size=(300, 40))
    ref = sorted(math.exp(sum(a[i] for i in row) / 40 - sum(b[i] for i in row) / 40) for row in draws)
    assert ratio == pytest.approx(math.exp(a.mean() - b.mean()))
    assert lo == pytest.approx(np.quantile(ref, 0.025)) and hi == pytest.approx(np.quantile(ref, 0.975))
    assert lo < ratio < hi


def test_bad_input_is_refused():
    with pytest.raises(InvalidOptionError, match="equal-length"):
        paired_ppl_ratio([1.0, 2.0], [1.0])
    with pytest.raises(InvalidOptionError, match="equal-length"):
        paired_ppl_ratio([], [])
    with pytest.raises(InvalidOptionError, match="resamples"):
        paired_ppl_ratio([1.0], [1.0], 0)
