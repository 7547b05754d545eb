"""AFR's steps, each on handmade arrays, and the published aggregation pinned on a hand-computed example."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cbo.errors import CBOError
from cbo.width.scores.afr import (
    EARLIER_OPTIONS,
    aggregate,
    matched_exponent,
    percentile,
    percentile_clip,
    power_transform,
    row_percentile_clip,
    row_percentiles,
    standardize,
)
from cbo.width.scores.base import SCORES


def test_power_transform_keeps_the_sign():
    s = torch.tensor([-8.0, -1.0, -0.25, 0.0, 0.25, 1.0, 8.0])
    out = power_transform(s, 1 / 3)
    assert torch.equal(torch.sign(out), torch.sign(s))
    torch.testing.assert_close(out, torch.tensor([-2.0, -1.0, -(0.25 ** (1 / 3)), 0.0, 0.25 ** (1 / 3), 1.0, 2.0]))
    torch.testing.assert_close(power_transform(s, 1.0), s)
    with pytest.raises(CBOError, match="p must be a finite number > 0"):
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
    raw = aggregate(scores, "signed")
    assert raw[0] > raw[1]  # the outlier makes unit 0 look important
    clipped = aggregate(percentile_clip(scores, 0.0, 85.0), "signed")
    assert clipped[0] < clipped[1]  # clipped at the 85th percentile (0.5), unit 0 is the one to remove


def test_the_published_aggregation_by_hand():
    rows = torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0], [1.0, -3.0, 0.0, -1.0, -2.0]], dtype=torch.float64)
    # 5 entries: the 2nd percentile sits at rank 0.08, the 98th at rank 3.92 (linear interpolation)
    # row 0 sorted 1 2 3 4 100: lo = 1 + 0.08 * 1 = 1.08, hi = 4 + 0.92 * 96 = 92.32
    # row 1 sorted -3 -2 -1 0 1: lo = -3 + 0.08 = -2.92, hi = 0 + 0.92 = 0.92
    clipped = row_percentile_clip(rows, 2.0, 98.0)
    expected = torch.tensor([[1.08, 2.0, 3.0, 4.0, 92.32], [0.92, -2.92, 0.0, -1.0, -2.0]], dtype=torch.float64)
    torch.testing.assert_close(clipped, expected)
    # means: row 0 102.4 / 5 = 20.48; row 1 -5.0 / 5 = -1.0
    torch.testing.assert_close(aggregate(clipped, "published"), torch.tensor([20.48, 1.0], dtype=torch.float64))
    torch.testing.assert_close(aggregate(clipped, "signed"), torch.tensor([20.48, -1.0], dtype=torch.float64))
    # absolute: (0.92 + 2.92 + 0 + 1 + 2) / 5 = 1.368
    torch.testing.assert_close(aggregate(clipped, "absolute"), torch.tensor([102.4 / 5, 1.368], dtype=torch.float64))


def test_a_large_negative_unit_is_important_under_the_published_aggregation():
    rows = torch.tensor([[-2.0, -2.0, -2.0, -2.0], [0.1, -0.1, 0.1, -0.1], [1.0, 1.0, 1.0, 1.0]])
    assert torch.argsort(aggregate(rows, "published")).tolist() == [1, 2, 0]  # the cancelling unit goes first
    assert torch.argsort(aggregate(rows, "signed")).tolist() == [0, 1, 2]  # the earlier ranking removes unit 0


def test_row_percentiles_match_numpy():
    rows = torch.randn(7, 33, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for q in (0.0, 2.0, 37.5, 98.0, 100.0):
        np.testing.assert_allclose(row_percentiles(rows, [q])[0].numpy(), np.percentile(rows.numpy(), q, axis=1))
    single = torch.tensor([[3.0], [-1.0]])
    torch.testing.assert_close(row_percentile_clip(single, 2.0, 98.0), single)
    with pytest.raises(CBOError, match="0 <= lower < upper <= 100"):
        row_percentile_clip(rows, 98.0, 2.0)


def test_matched_exponent_makes_the_log_spreads_equal():
    s = torch.tensor([1.0, -100.0, 0.0])  # zeros are left out
    ref = torch.tensor([1.0, 10.0])
    assert matched_exponent(s, ref) == pytest.approx(0.5)
    torch.testing.assert_close(power_transform(s, 0.5).abs()[:2], ref)
    g = torch.Generator().manual_seed(1)
    heavy = torch.randn(5000, generator=g).mul(3.0).exp() * torch.sign(torch.randn(5000, generator=g))
    light = torch.randn(5000, generator=g).mul(0.5).exp()
    p = matched_exponent(heavy, light)
    assert p == pytest.approx(0.5 / 3.0, rel=0.05)
    spread = lambda t: float(t.abs().log().std())  # noqa: E731
    assert spread(power_transform(heavy, p)) == pytest.approx(spread(light), rel=1e-6)
    assert matched_exponent(torch.tensor([2.0, 2.0]), ref) == 1.0  # no spread to match


def test_standardize():
    t = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(standardize(t, "zscore"), torch.tensor([-1.0, 0.0, 1.0]))  # sample std = 1
    torch.testing.assert_close(standardize(2 * t, "scale"), t)
    torch.testing.assert_close(standardize(t, "none"), t)
    torch.testing.assert_close(standardize(torch.full((3,), 5.0), "zscore"), torch.zeros(3))
    with pytest.raises(CBOError, match="AFR standardize"):
        standardize(t, "minmax")


def test_options_are_checked_before_any_work():
    SCORES.make_options("afr", EARLIER_OPTIONS)  # the earlier aggregation stays a valid option set
    with pytest.raises(CBOError, match="p='match' matches the gradient score to the companion"):
        SCORES.make_options("afr", {"companion": "none"})
    SCORES.make_options("afr", {"companion": "none", "power": False})
    for bad, match in (
        ({"aggregation": "mean"}, "AFR aggregation"),
        ({"companion": "magnitude"}, "AFR companion"),
        ({"clip_scope": "layer"}, "AFR clip_scope"),
        ({"p": -1.0}, "power exponent p"),
        ({"p": "auto"}, "power exponent p"),
        ({"clip_percentiles": (2.0, 50.0, 98.0)}, "clip_percentiles"),
    ):
        with pytest.raises(CBOError, match=match):
            SCORES.make_options("afr", bad)
