"""The refine defaults that follow the space: the budget counts the swap neighbourhood, a large space searches
locally around its incumbent, and that local search still finds brute force's best."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from synthetic_losses import SyntheticExecutor, planted_quadratic

from cbo.measure.executors import Measurements
from cbo.qubo.block_qubo import BlockQUBO
from cbo.search.budget import LOCAL_SEARCH, large_space, scaled_budget, space_options, swap_neighbours
from cbo.search.moves import SwapMoves
from cbo.search.options import RefineOptions
from cbo.search.refine import RefineLoop, refine_search


@pytest.mark.parametrize("n,k", [(30, 8), (30, 15), (12, 5), (60, 16)])
def test_the_budget_counts_the_swap_neighbourhood(n, k):
    parent = tuple(range(k))
    assert swap_neighbours(n, k) == len(set(SwapMoves(["layer"] * n).neighbours(parent)))
    assert scaled_budget(n, k) == max(300.0, np.ceil(4 / 3 * k * (n - k)))
    assert large_space(n, k) == (scaled_budget(n, k) > 300)


def test_a_large_space_gets_the_local_mix_and_keeps_every_other_option():
    given = RefineOptions(batch=12, promote=3, local=0.4)
    small, large = space_options(30, 15, given), space_options(60, 16, given)
    assert small == given  # at the floor: as given
    assert (large.local, large.thompson, large.local_parents) == (0.85, 0.1, 1)
    assert (large.promote, large.stages) == (8, 1) and {k: getattr(large, k) for k in LOCAL_SEARCH} == LOCAL_SEARCH
    assert large.batch == 12
    large.check(32)  # a valid mix: local + thompson <= 1


def test_the_local_search_proposes_around_the_incumbent_and_finds_the_best():
    """With the large space's mix the trust region is the incumbent alone (EvoPress's parent) and most of a batch is
    its 1-3 swap mutations; the loop still reaches brute force's optimum of a planted quadratic with couplings."""
    n, remove = 14, 6
    _, _, fn = planted_quadratic(n, seed=5, coupling=0.5)
    prior = BlockQUBO(np.diag(2 * np.array([fn((i,)) for i in range(n)])))
    opts = RefineOptions.build(RefineOptions(low_windows=2, high_windows=4, batch=8, patience=50), **LOCAL_SEARCH)

    loop = RefineLoop(Measurements(SyntheticExecutor(fn, n_windows=4)), prior, remove, budget=600, options=opts,
                      solver="enumerate")  # fmt: skip
    for _ in range(3):
        loop.step()
    loop.refit()
    assert loop.parents == [loop.best_set]  # the trust region: the incumbent alone
    measured = set(loop.measurements.values)
    near = loop.near(round(opts.local * 20), measured, lambda p: loop.moves.mutate(p, 3))
    assert len(near) == 17 and all(1 <= len(set(s) - set(loop.best_set)) <= 3 for s in near)

    r = refine_search(
        Measurements(SyntheticExecutor(fn, n_windows=4, spread=0.0)), prior, remove, budget=600, options=opts,
        solver="enumerate",
    )  # fmt: skip
    every = list(itertools.combinations(range(n), remove))
    assert tuple(r.chosen) == min(every, key=fn)


def test_rotated_screens_walk_the_high_windows_and_enter_the_fit_without_their_offsets():
    """``rotate_low``: round r screens on high window r mod 4 (every one in turn, each once per four rounds); a set
    screened on one window enters the fit at its loss minus that window's offset, computed by hand from the sets
    measured on all four; the loop still finds brute force's best."""
    n, remove = 12, 5
    _, _, fn = planted_quadratic(n, seed=6, coupling=0.5)
    prior = BlockQUBO(np.diag(2 * np.array([fn((i,)) for i in range(n)])))
    opts = RefineOptions(low_windows=1, high_windows=4, batch=6, promote=2, patience=50, rotate_low=True)
    ex = SyntheticExecutor(fn, n_windows=6, spread=0.4)
    loop = RefineLoop(Measurements(ex), prior, remove, budget=400, options=opts, solver="enumerate")
    loop.run()
    screens = [r["screen"] for r in loop.rounds]
    assert screens[:8] == [[w] for w in loop.hi_ids] * 2 and all(len(s) == 1 for s in screens)

    sets, ys, nws, lows = loop.data()
    m = loop.measurements
    high = [s for s, lo in zip(sets, lows) if not lo]
    table = np.array([[m.values[s][w][0] for w in loop.hi_ids] for s in high])
    offset = dict(zip(loop.hi_ids, (table - table.mean(axis=1, keepdims=True)).mean(axis=0)))
    for s, y, k, lo in zip(sets, ys, nws, lows):
        windows = sorted(m.values[s]) if lo else loop.hi_ids
        assert k == len(windows)
        expected = np.mean([m.values[s][w][0] - (offset[w] if lo else 0.0) for w in windows])
        assert y == pytest.approx(expected)
    # a window's factor shows up as its offset: the corrected low losses sit closer to the sets' true values
    low = [(s, y) for s, y, lo in zip(sets, ys, lows) if lo]
    raw = [np.mean([m.values[s][w][0] for w in m.values[s]]) for s, _ in low]
    truth = [fn(s) * ex.factor[loop.hi_ids].mean() for s, _ in low]  # the high windows' mean
    assert np.abs(np.array([y for _, y in low]) - truth).mean() < np.abs(np.array(raw) - truth).mean()

    r = refine_search(Measurements(SyntheticExecutor(fn, n_windows=6, spread=0.4)), prior, remove, budget=400,
                      options=opts, solver="enumerate")  # fmt: skip
    assert tuple(r.chosen) == min(itertools.combinations(range(n), remove), key=fn)
