"""Staged promotion: promoted sets climb the high windows in stages raced against the incumbent; the losers stop
early, pay only for the windows they were measured on, and enter the surrogate at low fidelity."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from synthetic_losses import SyntheticExecutor, planted_quadratic

from cbo.errors import InvalidOptionError
from cbo.measure.executors import Measurements
from cbo.qubo.block_qubo import BlockQUBO
from cbo.search.options import RefineOptions
from cbo.search.refine import RefineLoop, refine_search
from cbo.search.staged import race, stage_windows


@pytest.mark.parametrize("low,high,stages", [(1, 16, 1), (1, 16, 2), (2, 16, 3), (1, 4, 5), (3, 8, 0)])
def test_stages_are_cumulative_geometric_and_end_with_every_high_window(low, high, stages):
    hi = list(range(100, 100 + high))
    lo = hi[-low:]  # the low windows are a subset of the high ones, anywhere in them
    steps = stage_windows(lo, hi, stages)
    assert steps[0][:low] == lo and sorted(steps[-1]) == hi
    assert all(a == b[: len(a)] for a, b in zip(steps, steps[1:]))  # each stage extends the last
    sizes = [len(s) for s in steps]
    assert sizes == sorted(set(sizes)) and sizes[0] > low and len(sizes) <= stages + 1
    expected = sorted({round(low * (high / low) ** (i / (stages + 1))) for i in range(1, stages + 1)} | {high})
    assert sizes == [s for s in expected if s > low]


def test_the_race_drops_exactly_the_sets_behind_the_incumbent_and_measures_them_no_further():
    n, remove = 10, 3
    _, _, fn = planted_quadratic(n, seed=2)
    every = sorted(itertools.combinations(range(n), remove), key=fn)
    incumbent = every[20]
    m = Measurements(SyntheticExecutor(fn, n_windows=16, spread=0.3))
    hi = list(range(16))
    m([incumbent], hi)
    steps = stage_windows([5], hi, 1)
    sets = every[10:20] + every[21:40]  # ten better than the incumbent, nineteen worse
    finished, losses, dropped = race(m, sets, steps, incumbent)
    assert finished == every[10:20]  # windows scale every set alike: the stage ranks as the full mean does
    assert losses == pytest.approx([m([s], hi).mean() for s in finished])
    assert [tuple(d["removed"]) for d in dropped] == every[21:40]
    for d in dropped:
        key = tuple(d["removed"])
        assert sorted(m.known(key)) == sorted(steps[0]) and d["windows"] == len(steps[0])
        assert d["loss"] > d["incumbent"] == pytest.approx(m([incumbent], steps[0]).mean())
    # without an incumbent every set goes straight to every window
    finished, losses, dropped = race(m, every[40:44], steps, None)
    assert finished == every[40:44] and dropped == [] and all(len(m.known(s)) == 16 for s in finished)


def test_a_staged_loop_spends_less_per_promotion_and_still_finds_the_best():
    """The same rounds with ``stages=1`` measure fewer (set, window) pairs; the dropped sets enter the fit at low
    fidelity with the windows they were measured on; the loop reaches brute force's optimum."""
    n, remove = 14, 6
    _, _, fn = planted_quadratic(n, seed=5, coupling=0.5)
    prior = BlockQUBO(np.diag(2 * np.array([fn((i,)) for i in range(n)])))
    opts = RefineOptions(
        low_windows=1,
        high_windows=8,
        batch=8,
        promote=4,
        patience=50,
        local_parents=1,
        local=0.85,
        thompson=0.1,
        round_floor=0.0,
    )  # no round floor: under the huge budget below, rounds stay at 8 proposals
    pairs = {}
    for stages in (0, 1):
        loop = RefineLoop(Measurements(SyntheticExecutor(fn, n_windows=8)), prior, remove, budget=10**6,
                          options=RefineOptions.build(opts, stages=stages), solver="enumerate")  # fmt: skip
        for _ in range(6):
            loop.step()
        pairs[stages] = loop.measurements.pairs
        dropped = [d for r in loop.rounds for d in r["dropped"]]
        assert (len(dropped) > 0) == (stages > 0)
        sets, ys, nws, lows = loop.data()
        fit = {s: (y, k, lo) for s, y, k, lo in zip(sets, ys, nws, lows)}
        for d in dropped:
            y, k, lo = fit[tuple(d["removed"])]
            assert lo == 1.0 and k == d["windows"] < 8 and d["loss"] > d["incumbent"]
    assert pairs[1] < pairs[0]

    r = refine_search(Measurements(SyntheticExecutor(fn, n_windows=8, spread=0.0)), prior, remove, budget=600,
                      options=RefineOptions.build(opts, stages=1), solver="enumerate")  # fmt: skip
    assert tuple(r.chosen) == min(itertools.combinations(range(n), remove), key=fn)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_a_bad_stage_count_is_refused(bad):
    with pytest.raises(InvalidOptionError, match="stages"):
        RefineOptions(stages=bad).check(32)
