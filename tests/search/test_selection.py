"""The final selection's race (``cbo.search.selection``) on synthetic per-window losses and on a tiny model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cbo.errors import InvalidOptionError
from cbo.search.selection import PoolSource, SelectionOptions, paired_interval, race


class SyntheticSource:
    """Fresh windows with known per-window losses: ``loss(s, w) = difficulty_w + effect[s] + noise``.

    Windows differ much more in difficulty (sd 0.5 nats) than the finalists do, as real windows do; the noise of a
    set on a window is its own (sd ``noise``). Each (set, window) costs one FPE, each window's original one more.
    Records every window range each set was measured on.
    """

    def __init__(self, effects: dict, n_windows: int = 2000, noise: float = 0.05, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.effects = {tuple(k): v for k, v in effects.items()}
        self.difficulty = rng.normal(3.0, 0.5, n_windows)
        self.noise = {s: rng.normal(0.0, noise, n_windows) for s in self.effects}
        self.n_windows, self.seq_len = n_windows, 128
        self.fpe = 0.0
        self.calls: list[tuple[list, int, int]] = []

    def measure(self, sets, start, stop):
        self.calls.append((list(sets), start, stop))
        self.fpe += (stop - start) * (1 + len(sets))
        return np.stack([self.difficulty[start:stop] + self.effects[s] + self.noise[s][start:stop] for s in sets])


SETS = [(0, 1), (0, 2), (1, 2), (2, 3)]


def test_the_better_finalist_wins_in_at_least_95_percent_of_seeded_trials():
    wins, decided = 0, 0
    for seed in range(100):
        # (0, 2) is truly better by 0.01 nats per token (a 1 % perplexity ratio), the others tie among themselves
        effects = {s: 0.0 for s in SETS} | {(0, 2): -0.01}
        result = race(SETS, SyntheticSource(effects, seed=seed), budget=2000)
        wins += result.chosen == (0, 2)
        decided += result.stopped == "decided"
    assert wins >= 95
    assert decided >= 90  # the race settles it before the budget almost always


def test_a_true_tie_runs_to_its_budget_and_is_reported():
    effects = {s: 0.0 for s in SETS}
    source = SyntheticSource(effects, seed=3)
    result = race(SETS, source, budget=480)
    assert result.stopped == "budget"
    assert result.windows == 480 and result.tokens == 480 * 128
    assert sorted(result.tie + [result.chosen]) == sorted(SETS)
    for f in result.finalists:
        assert f.windows == 480 and f.status in ("chosen", "tied")
        assert f.low <= 0 <= f.high
        assert f.ratio_low <= 1 <= f.ratio_high
    # rounds of 32, 64, 128 and what is left of the budget (256), all finalists on the same windows
    assert [(s, e) for _, s, e in source.calls] == [(0, 32), (32, 96), (96, 224), (224, 480)]
    assert result.fpe == pytest.approx(480 * 5)
    assert result.level == pytest.approx(1 - 0.05 / (3 * 4))


def test_the_race_stops_when_no_fresh_window_is_left():
    effects = {s: 0.0 for s in SETS[:2]}
    result = race(SETS[:2], SyntheticSource(effects, n_windows=100), budget=1000)
    assert result.stopped == "windows" and result.windows == 100


def test_a_clearly_worse_finalist_is_dropped_early_with_its_interval():
    effects = {(0, 1): 0.0, (0, 2): 0.3, (1, 2): 0.0}
    source = SyntheticSource(effects, seed=1)
    result = race(list(effects), source, budget=1000, ranks=[0, 1, 2])
    bad = next(f for f in result.finalists if f.removed == (0, 2))
    assert bad.status == "dropped" and bad.dropped_round == 0 and bad.windows == 32
    assert bad.low > 0 and bad.diff == pytest.approx(0.3, abs=0.05) and bad.rank == 1
    assert bad.ratio == pytest.approx(math.exp(bad.diff))
    # it is not measured after the round that dropped it
    assert all((0, 2) not in sets for sets, start, _ in source.calls if start > 0)
    assert result.finalists[0].status == "chosen" and result.finalists[0].diff == 0.0
    data = result.to_json()
    assert data["stopped"] == result.stopped and len(data["finalists"]) == 3


def test_the_criterion_kl_reports_differences_without_ratios():
    effects = {(0, 1): 0.0, (0, 2): 0.5}
    result = race(list(effects), SyntheticSource(effects), 64, SelectionOptions(criterion="kl"))
    assert result.chosen == (0, 1) and result.stopped == "decided"
    assert all(f.ratio is None for f in result.finalists) and result.criterion == "kl"


def test_one_finalist_is_chosen_without_measuring():
    source = SyntheticSource({(0, 1): 0.0})
    result = race([(1, 0), (0, 1)], source, budget=100)
    assert result.chosen == (0, 1) and result.stopped == "decided" and source.calls == []


def test_paired_interval_matches_the_t_interval():
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(0).normal(0.1, 1.0, 40)
    mean, low, high = paired_interval(x, 0.05)
    lo, hi = stats.t.interval(0.95, 39, loc=x.mean(), scale=stats.sem(x))
    assert (mean, low, high) == pytest.approx((x.mean(), lo, hi))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(criterion="ppl"),
        dict(first=1),
        dict(growth=0.5),
        dict(confidence=1.0),
        dict(finalists=1),
        dict(text="test"),
    ],
)
def test_bad_options_are_refused(kwargs):
    with pytest.raises(InvalidOptionError):
        SelectionOptions(**kwargs)


@pytest.mark.parametrize("budget", [0, 1, 2.5, "32", True])
def test_bad_budgets_are_refused(budget):
    with pytest.raises(InvalidOptionError, match="select"):
        race(SETS, SyntheticSource({s: 0.0 for s in SETS}), budget)


def test_a_rerun_with_the_cache_chooses_the_same_set_and_measures_nothing(tiny_model, tiny_windows, tmp_path):
    from cbo.measure.cache import MeasureCache
    from cbo.model.blocks import find_blocks

    model = tiny_model("llama", n_layers=5, seed=2)
    blocks = find_blocks(model, "layer")
    pool = tiny_windows(model, n=40, seq_len=16, seed=5)
    finalists = [(0, 1), (3, 4), (2, 4)]
    options = SelectionOptions(first=8)

    def run():
        cache = MeasureCache(tmp_path, model, blocks)
        source = PoolSource(model, blocks, pool, batch_size=4, cache=cache)
        return race(finalists, source, 24, options), source

    first, source = run()
    assert source.work.sets > 0 and first.fpe > 0
    again, source = run()
    assert again.chosen == first.chosen and again.stopped == first.stopped
    assert source.work.sets == 0 and source.work.original_passes == 0 and again.fpe == 0
    assert [f.to_json() for f in again.finalists] == [f.to_json() for f in first.finalists]


def test_pool_source_losses_are_the_measurers(tiny_model, tiny_windows):
    from cbo.measure.measurer import measure_sets
    from cbo.model.blocks import find_blocks

    model = tiny_model("llama", n_layers=4, seed=1)
    blocks = find_blocks(model, "layer")
    pool = tiny_windows(model, n=12, seq_len=16, seed=7)
    source = PoolSource(model, blocks, pool, criterion="kl", batch_size=4)
    got = source.measure([(1,), (2, 3)], 4, 12)
    want = measure_sets(model, blocks, pool[4:12], [(1,), (2, 3)], batch_size=4)["kl"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert source.fpe > 8  # the originals of 8 windows and two sets' partial passes
