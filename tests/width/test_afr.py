"""AFR's three fixes, each on handmade arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cbo.errors import CBOError
from cbo.width.scores.afr import aggregate, percentile, percentile_clip, power_transform


def test_power_transform_keeps_the_sign():
    s = torch.tensor([-8.0, -1.0, -0.25, 0.0, 0.25, 1.0, 8.0])
    out = power_transform(s, 1 / 3)
    assert torch.equal(torch.sign(out), torch.sign(s))
    torch.testing.assert_close(out, torch.tensor([-2.0, -1.0, -(0.25 ** (1 / 3)), 0.0, 0.25 ** (1 / 3), 1.0, 2.0]))
    torch.testing.assert_close(power_transform(s, 1.0), s)
    with pytest.raises(CBOError, match="p must be > 0"):
        power_transform(s, 0.0)


def test_power_transform_makes_scales_comparable():
    small, large = torch.tensor([1e-6, 4e-6]), torch.tensor([1.0, 4.0])
    ratio = lambda t: (t[1] / t[0]).item()  # noqa: E731
    assert ratio(power_transform(small, 0.5)) == pytest.approx(2.0) == ratio(power_transform(large, 0.5))
    # the gap between the two sources shrinks from 1e6 to 1e3
    assert (power_transform(large, 0.5)[0] / power_transform(small, 0.5)[0]).item() == pytest.approx(1e3)


@pytest.mark.parametrize("q", [0.0, 1.0, 12.5, 50.0, 63.0, 99.0, 100.0])
def test_percentile_matches_numpy(q):
    arr = np.array([[3.0, -1.0, 7.5, 0.0], [2.0, 2.0, -9.0, 11.0], [4.0, 5.0, 6.0, -0.5]])
    assert percentile(torch.from_numpy(arr), q) == pytest.approx(float(np.percentile(arr, q)))


def test_percentile_clip_respects_the_percentiles():
    x = torch.arange(101, dtype=torch.float64) - 50  # -50 .. 50
    x[0], x[-1] = -1e6, 1e6  # two outliers
    out = percentile_clip(x, 5.0, 95.0)
    lo, hi = np.percentile(x.numpy(), 5.0), np.percentile(x.numpy(), 95.0)
    assert out.min().item() == pytest.approx(lo) and out.max().item() == pytest.approx(hi)
    inside = (x >= lo) & (x <= hi)
    assert torch.equal(out[inside], x[inside])  # values inside the band are untouched
    assert int((~inside).sum()) == 10  # 5 below the 5th percentile, 5 above the 95th
    with pytest.raises(CBOError, match="0 <= lower < upper <= 100"):
        percentile_clip(x, 50.0, 10.0)


def test_clipping_before_aggregation_stops_an_outlier():
    # unit 0: one huge weight among negatives; unit 1: modest positive weights
    scores = torch.tensor([[100.0, -1.0, -1.0, -1.0], [0.5, 0.5, 0.5, 0.5]])
    raw = aggregate(scores)
    assert raw[0] > raw[1]  # the outlier makes unit 0 look important
    clipped = aggregate(percentile_clip(scores, 0.0, 85.0))
    assert clipped[0] < clipped[1]  # clipped at the 85th percentile (0.5), unit 0 is the one to remove


def test_sign_preserving_aggregation():
    rows = torch.tensor([[1.0, -1.0, 2.0, -2.0], [0.5, 0.5, 0.5, 0.5], [-1.0, -1.0, -1.0, -1.0]])
    torch.testing.assert_close(aggregate(rows, True), torch.tensor([0.0, 0.5, -1.0]))
    torch.testing.assert_close(aggregate(rows, False), torch.tensor([1.5, 0.5, 1.0]))
    # signed: unit 2 (removing it lowers the loss) ranks lowest; absolute values would rank unit 1 lowest
    assert int(torch.argmin(aggregate(rows, True))) == 2
    assert int(torch.argmin(aggregate(rows, False))) == 1
