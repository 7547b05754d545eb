"""EvoPress: counts kept by every mutation, duplicates rejected, published defaults, resume = uninterrupted."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from synthetic_losses import Stop, SyntheticExecutor, interrupt_at, planted_quadratic

from cbo.baselines.evopress import default_generations, evopress, evopress_blocks
from cbo.errors import InvalidOptionError
from cbo.measure.executors import Measurements

SUBLAYER_KINDS = ["attention", "mlp"] * 10  # 10 layers' halves, interleaved as find_blocks orders them


def test_published_generation_count():
    assert default_generations(30, 8) == 117  # k (n - k) / 1.5, as the authors' script computes it
    assert default_generations(32, 12) == 160
    assert default_generations(30, 15) == 150


@pytest.mark.parametrize("kinds,remove", [(["layer"] * 12, 5), (SUBLAYER_KINDS, 3), (SUBLAYER_KINDS, {"mlp": 4})])
def test_every_measured_set_keeps_every_count(kinds, remove):
    ex = SyntheticExecutor(lambda s: float(sum(s)) + 1.0)
    evopress(Measurements(ex), kinds, remove, generations=15, offspring=8, initial=16, stages=((2, 1), (1, 4)))
    want = Counter({k: remove for k in set(kinds)} if isinstance(remove, int) else remove)
    sets = {s for _, batch in ex.requests for s in batch}
    assert len(sets) > 50
    for s in sets:
        got = Counter(kinds[i] for i in s)
        assert +got == +want, (s, got, want)


def test_offspring_are_distinct_and_differ_from_the_parent():
    a, _, fn = planted_quadratic(12, seed=1)
    ex = SyntheticExecutor(fn)
    records = []
    r = evopress(
        Measurements(ex),
        ["layer"] * 12,
        5,
        generations=10,
        offspring=8,
        initial=16,
        stages=((2, 1), (1, 4)),
        progress=records.append,
    )
    # every generation's stage-1 call (1 window) scores 8 distinct offspring, none equal to the parent before it
    stage1 = [batch for w, batch in ex.requests if len(batch) >= 8]
    assert all(len(set(b)) == len(b) for b in stage1)
    parents = [tuple(h["removed"]) for h in r.history]
    assert len(r.history) == 11 and r.generations == 10
    fitness = [h["fitness"] for h in r.history]
    assert min(fitness) < fitness[0]
    assert parents[-1] == tuple(r.removed)


def test_finds_the_optimum_of_a_separable_loss():
    rng = np.random.default_rng(0)
    costs = rng.uniform(0, 1, 16)
    ex = SyntheticExecutor(lambda s: float(costs[list(s)].sum()), spread=0.0)
    r = evopress(Measurements(ex), ["layer"] * 16, 4, generations=60, initial=16, stages=((2, 1), (1, 2)))
    assert sorted(r.removed) == sorted(np.argsort(costs)[:4].tolist())


def test_resume_equals_uninterrupted(tmp_path):
    _, _, fn = planted_quadratic(14, seed=3)
    opts = dict(generations=12, offspring=6, initial=10, stages=((2, 1), (1, 3)), seed=7)
    whole = evopress(Measurements(SyntheticExecutor(fn)), ["layer"] * 14, 6, **opts)

    ckpt, stop = tmp_path / "evo.json", interrupt_at("generation", 5)
    with pytest.raises(Stop):
        evopress(Measurements(SyntheticExecutor(fn)), ["layer"] * 14, 6, checkpoint=ckpt, progress=stop, **opts)
    resumed_ex = SyntheticExecutor(fn)
    resumed = evopress(Measurements(resumed_ex), ["layer"] * 14, 6, checkpoint=ckpt, **opts)
    assert resumed.removed == whole.removed
    assert resumed.history == whole.history
    assert resumed.fpe == pytest.approx(whole.fpe)
    # the resumed run measured only what the five finished generations had not
    done = sum(len(b) for _, b in resumed_ex.requests)
    assert 0 < done < whole.fpe


def test_budget_stops_early():
    ex = SyntheticExecutor(lambda s: float(sum(s)))
    r = evopress(Measurements(ex), ["layer"] * 12, 4, generations=50, offspring=8, stages=((2, 1), (1, 4)), budget=150)
    assert r.stopped == "budget" and r.generations < 50


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(remove=12), "cannot remove"),
        (dict(remove={"attention": 2}), "kinds"),
        (dict(stages=((2, 1), (2, 4))), "one survivor"),
        (dict(stages=((2, 1), (1, 99))), "pool has"),
        (dict(offspring=0), "offspring"),
    ],
)
def test_bad_options_are_refused(kwargs, match):
    args = dict(remove=4, generations=3, offspring=4, stages=((2, 1), (1, 4)))
    args.update(kwargs)
    remove = args.pop("remove")
    with pytest.raises(InvalidOptionError, match=match):
        evopress(Measurements(SyntheticExecutor(lambda s: 1.0)), ["layer"] * 12, remove, **args)


def test_on_a_tiny_model_beats_random_sets(tiny_model, tiny_windows):
    from cbo.measure.measurer import measure_sets
    from cbo.model.blocks import find_blocks

    model = tiny_model("llama", n_layers=6, seed=0)
    windows = tiny_windows(model, n=4, seq_len=12, seed=1)
    blocks = find_blocks(model, "layer")
    r = evopress_blocks(model, blocks, windows, 3, generations=6, offspring=4, initial=6, stages=((2, 1), (1, 4)))
    every = list(itertools.combinations(range(6), 3))
    kl = measure_sets(model, blocks, windows, every)["kl"].mean(axis=1)
    rank = int((kl < kl[every.index(tuple(r.removed))] - 1e-9).sum())
    assert rank <= 3  # among the best few of all 20 sets
