"""RefineOptions: one set of defaults, one round cost, checks that name the option."""

from __future__ import annotations

import pytest

from cbo.errors import InvalidOptionError
from cbo.search.options import RefineOptions, check_budget


def test_defaults_windows_and_round_cost():
    o = RefineOptions()
    assert o.windows(32) == (1, 16) and o.windows(6) == (1, 6)
    assert o.round_cost(6) == 24 * 1 + 4 * 5 and o.round_cost(6, first=True) == 24 + 20 + 6
    assert o.round_cost(6, per_pair=0.5) == 22.0


def test_build_replaces_fields_and_refuses_unknown_ones():
    o = RefineOptions.build(RefineOptions(batch=8), promote=2)
    assert (o.batch, o.promote, o.patience) == (8, 2, RefineOptions().patience)
    with pytest.raises(InvalidOptionError, match=r"no option\(s\) \['bach'\]"):
        RefineOptions.build(bach=3)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(low_windows=5, high_windows=3), "low_windows <= high_windows"),
        (dict(high_windows=9), "high_windows <= calibration windows"),
        (dict(promote=30), "promote"),
        (dict(local=0.8, thompson=0.4), r"local \+ thompson"),
        (dict(screen=0), "screen"),
        (dict(prior_windows="all"), "prior_windows"),
        (dict(round_floor=2.0), "round_floor"),
    ],
)
def test_bad_options_are_named(change, match):
    with pytest.raises(InvalidOptionError, match=match):
        RefineOptions(**change).check(8)


@pytest.mark.parametrize("bad", [0, -1, True, "300", float("nan"), float("inf")])
def test_bad_budgets(bad):
    with pytest.raises(InvalidOptionError, match="refine must be a budget"):
        check_budget(bad, "refine")
