"""The refinement loop: the surrogate recovers a planted quadratic, the loop finds brute force's best, resumes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from synthetic_losses import Stop, SyntheticExecutor, interrupt_at, planted_quadratic

from cbo.errors import InvalidOptionError
from cbo.measure.executors import Measurements
from cbo.qubo.block_qubo import BlockQUBO
from cbo.search.refine import refine, refine_search
from cbo.search.surrogate import BayesianQuadratic
from cbo.solvers import solve


def _rows(sets, n):
    X = np.zeros((len(sets), n), dtype=np.uint8)
    for k, s in enumerate(sets):
        X[k, list(s)] = 1
    return X


def test_refit_recovers_a_planted_quadratic():
    n = 10
    a, B, fn = planted_quadratic(n, seed=0)
    prior = BlockQUBO(np.diag(2 * a))  # knows the singles, not the couplings
    sets = [s for m in (2, 3, 5, 7) for s in itertools.combinations(range(n), m)][::3]
    X = _rows(sets, n)
    y = np.array([fn(s) for s in sets])
    model = BayesianQuadratic(prior)
    model.fit(X, y, np.full(len(y), 8), np.zeros(len(y)))
    q = model.qubo()
    # the couplings come back (the prior had none), and so do energies of sets never measured
    iu = np.triu_indices(n, 1)
    assert np.abs(q.H[iu] - B[iu]).max() < 0.02
    unseen = [s for s in itertools.combinations(range(n), 4)]
    pred = q.energy(_rows(unseen, n))
    true = np.array([fn(s) for s in unseen])
    assert np.abs(pred - true).max() < 0.05
    # the refined QUBO solves for an M it never saw measured, to the planted optimum
    best = min(unseen, key=fn)
    assert tuple(solve(q, 4, solver="enumerate", k=1).removed(0)) == best


def test_refit_on_one_m_ranks_that_m():
    n = 9
    a, B, fn = planted_quadratic(n, seed=2, coupling=0.5)
    prior = BlockQUBO(np.diag(2 * a))
    every = list(itertools.combinations(range(n), 4))
    train = every[::2]
    model = BayesianQuadratic(prior)
    model.fit(_rows(train, n), [fn(s) for s in train], np.full(len(train), 4), np.zeros(len(train)))
    pred = model.predict(_rows(every, n))
    true = np.array([fn(s) for s in every])
    assert np.corrcoef(pred, true)[0, 1] > 0.99
    prior_corr = np.corrcoef(prior.energy(_rows(every, n)), true)[0, 1]
    assert prior_corr < 0.95  # the couplings matter here, and the fit found them


def _loop(fn, n, remove, ex, **kw):
    a = np.array([fn((i,)) for i in range(n)])
    prior = BlockQUBO(np.diag(2 * a))
    opts = dict(budget=2000, low_windows=2, high_windows=4, batch=6, promote=2, patience=50, solver="enumerate")
    opts.update(kw)
    return refine_search(Measurements(ex), prior, remove, **opts)


def test_loop_finds_the_planted_optimum_with_few_measurements():
    n, remove = 12, 5
    _, _, fn = planted_quadratic(n, seed=4, coupling=0.5)
    ex = SyntheticExecutor(fn, n_windows=4, spread=0.0)
    r = _loop(fn, n, remove, ex, budget=400, patience=4)
    every = list(itertools.combinations(range(n), remove))
    best = min(every, key=fn)
    assert tuple(r.chosen) == best
    measured = {s for _, batch in ex.requests for s in batch}
    assert len(measured) < len(every) / 4  # 792 sets; the loop measured a fraction
    assert r.fpe <= 400


def test_resume_equals_uninterrupted(tmp_path):
    n, remove = 10, 4
    _, _, fn = planted_quadratic(n, seed=5, coupling=0.4)
    whole = _loop(fn, n, remove, SyntheticExecutor(fn, n_windows=6), budget=300, patience=100, seed=3)

    ckpt = tmp_path / "refine.json"
    with pytest.raises(Stop):
        _loop(fn, n, remove, SyntheticExecutor(fn, n_windows=6), budget=300, patience=100, seed=3, checkpoint=ckpt,
              progress=interrupt_at("round", 3))  # fmt: skip
    ex = SyntheticExecutor(fn, n_windows=6)
    resumed = _loop(fn, n, remove, ex, budget=300, patience=100, seed=3, checkpoint=ckpt)
    assert resumed.chosen == whole.chosen
    assert resumed.rounds == whole.rounds
    assert resumed.fpe == pytest.approx(whole.fpe)
    assert np.allclose(resumed.qubo.H, whole.qubo.H)
    assert len(whole.rounds) > 3 and sum(len(b) for _, b in ex.requests) < whole.cost["rounds"]


def test_bad_options_are_refused():
    _, _, fn = planted_quadratic(8)
    with pytest.raises(InvalidOptionError, match="budget"):
        _loop(fn, 8, 3, SyntheticExecutor(fn), budget=0)
    with pytest.raises(InvalidOptionError, match="low_windows"):
        _loop(fn, 8, 3, SyntheticExecutor(fn), low_windows=5, high_windows=3)
    with pytest.raises(InvalidOptionError, match="high_windows"):
        _loop(fn, 8, 3, SyntheticExecutor(fn, n_windows=4), high_windows=6)


@pytest.mark.slow
def test_on_a_tiny_model_refine_equals_brute_force(tiny_model, tiny_windows, tmp_path):
    from cbo.measure.measurer import measure_sets
    from cbo.model.blocks import find_blocks

    model = tiny_model("llama", n_layers=6, seed=0)
    calibration = tiny_windows(model, n=3, seq_len=12, seed=1)
    validation = tiny_windows(model, n=2, seq_len=12, seed=2)
    blocks = find_blocks(model, "layer")
    r = refine(
        model,
        blocks,
        calibration,
        validation,
        remove=3,
        budget=1000,
        low_windows=3,
        high_windows=3,
        batch=6,
        promote=6,
        patience=50,
        validate=3,
        solver="enumerate",
    )
    every = list(itertools.combinations(range(6), 3))
    kl = measure_sets(model, blocks, calibration, every)["kl"].mean(axis=1)  # the independent reference
    assert r.states.removed(0) == list(every[int(np.argmin(kl))])
    assert r.states.energies[0] == pytest.approx(kl.min(), rel=1e-5)
    assert r.stopped == "exhausted" and len(r.states) == len(every)
    assert r.chosen in r.validation["removed"]
    path = r.qubo.save(tmp_path / "refined.cboq")
    again = BlockQUBO.load(path)
    assert solve(again, 2, solver="enumerate", k=1).removed(0)  # usable for another M


def test_per_kind_counts_at_sublayer_granularity():
    from collections import Counter

    n = 20
    a, _, fn = planted_quadratic(n, seed=0, coupling=0.3)
    kinds = ["attention", "mlp"] * (n // 2)
    prior = BlockQUBO(np.diag(2 * a), kinds=kinds, caps={"attention": 3, "mlp": 3})
    ex = SyntheticExecutor(fn, n_windows=4)
    opts = dict(budget=600, low_windows=2, high_windows=4, batch=8, promote=3, patience=5, solver="swap-tabu")
    r = refine_search(Measurements(ex), prior, 6, **opts)
    want = Counter({"attention": 3, "mlp": 3})
    assert all(Counter(kinds[i] for i in s) == want for _, batch in ex.requests for s in batch)
    att, mlp = [i for i in range(n) if i % 2 == 0], [i for i in range(n) if i % 2 == 1]
    every = [tuple(sorted(x + y)) for x in itertools.combinations(att, 3) for y in itertools.combinations(mlp, 3)]
    best = min(every, key=fn)
    assert tuple(r.chosen) == best  # 14400 sets; the loop found the best having measured well under 1 %
    found = next(k for k, rnd in enumerate(r.rounds) if tuple(rnd["best_removed"]) == best)
    assert len({tuple(p) for rnd in r.rounds[: found + 1] for p in rnd["proposals"]}) < 150


def test_the_budget_counts_the_rounds_only():
    # the prior's cost and the validation are paid apart: they are reported, not taken from the rounds' budget
    _, _, fn = planted_quadratic(10, seed=1)
    r = _loop(fn, 10, 3, SyntheticExecutor(fn), budget=200, prior_cost=150.0, patience=2)
    assert r.cost["prior"] == 150.0 and r.cost["rounds"] <= 200 and r.fpe == pytest.approx(sum(r.cost.values()))
    assert r.stopped == "budget" and r.cost["rounds"] >= 0.9 * 200


def test_a_budget_below_one_round_is_refused_before_the_prior(tiny_model, tiny_windows, monkeypatch):
    model = tiny_model("llama", n_layers=4, seed=0)
    calibration = tiny_windows(model, n=3, seq_len=12, seed=1)
    validation = tiny_windows(model, n=4, seq_len=12, seed=2)

    def boom(*args, **kwargs):
        raise AssertionError("the prior was measured before the budget was checked")

    monkeypatch.setattr(model, "forward", boom)
    # one round: 24 sets on 1 window, 4 of them on the 2 others, and the 3 windows' original passes
    with pytest.raises(InvalidOptionError, match=r"cannot pay one round of refinement \(35 FPE"):
        refine(model, "layer", calibration, validation, remove=2, budget=30, validate=10)


@pytest.mark.parametrize(
    "n, remove, budget, patience, seed",
    [(12, 5, 300, 2, 0), (14, 4, 400, 1, 1), (16, 6, 400, 3, 2), (9, 3, 3000, 2, 3)],
)
def test_refine_spends_its_budget_unless_exhausted(n, remove, budget, patience, seed):
    """When patience runs out the loop widens instead of stopping: it never leaves more than 10 % of its budget
    unspent unless it has nothing new to propose (then it has measured every feasible set)."""
    _, _, fn = planted_quadratic(n, seed=seed, coupling=0.5)
    ex = SyntheticExecutor(fn, n_windows=4)
    r = _loop(fn, n, remove, ex, budget=budget, patience=patience, seed=seed)
    assert r.stopped in ("budget", "exhausted")
    if r.stopped == "exhausted":
        measured = {s for _, batch in ex.requests for s in batch}
        assert len(measured) == len(list(itertools.combinations(range(n), remove)))
    else:
        assert budget * 0.9 <= r.cost["rounds"] <= budget


def test_a_stalled_loop_widens_its_search():
    n, remove = 16, 5
    _, _, fn = planted_quadratic(n, seed=7, coupling=0.3)
    r = _loop(fn, n, remove, SyntheticExecutor(fn, n_windows=4), budget=320, patience=1, seed=0)
    widened = [rnd for rnd in r.rounds if rnd["widened"]]
    assert widened, "patience 1 over many rounds: some rounds ran widened"
    assert max(rnd["widened"] for rnd in r.rounds) >= 2
    # after an improvement the search narrows again
    assert any(a["widen"] == 0 and b["widened"] for a, b in zip(r.rounds[1:], r.rounds))


def test_many_cheap_rounds_are_merged_by_the_round_floor():
    _, _, fn = planted_quadratic(14, seed=8)
    r = _loop(fn, 14, 5, SyntheticExecutor(fn, n_windows=4), budget=600, patience=100, round_floor=0.1)
    assert len(r.rounds) <= 12 and len(r.rounds[0]["proposals"]) > 6  # 10 % of the budget a round


def test_the_last_round_is_cut_to_what_is_left():
    _, _, fn = planted_quadratic(12, seed=9)
    r = _loop(fn, 12, 4, SyntheticExecutor(fn, n_windows=4), budget=101, patience=100)
    assert r.stopped == "budget" and 97 <= r.cost["rounds"] <= 101
    assert len(r.rounds[-1]["proposals"]) <= 6


def test_the_trust_region_proposes_near_the_best_measured_sets():
    n, remove = 16, 5
    _, _, fn = planted_quadratic(n, seed=6, coupling=0.4)
    ex = SyntheticExecutor(fn, n_windows=4)
    r = _loop(fn, n, remove, ex, budget=500, patience=100, local=1.0, thompson=0.0, local_parents=2, solver="auto")
    assert len(r.rounds) > 3
    high: list[tuple[float, tuple[int, ...]]] = []
    for k, rnd in enumerate(r.rounds):
        if k > 0:  # the first round has no fitted surrogate: the prior's own lowest states
            parents = [s for _, s in sorted(high)[:2]]
            for p in rnd["proposals"]:
                assert min(len(set(p) ^ set(q)) for q in parents) <= 6  # at most three swaps from a parent
        high += [(y, tuple(s)) for s, y in zip(rnd["promoted"], rnd["high_loss"])]


def test_local_options_are_checked():
    _, _, fn = planted_quadratic(8)
    with pytest.raises(InvalidOptionError, match="local \\+ thompson"):
        _loop(fn, 8, 3, SyntheticExecutor(fn), local=0.8, thompson=0.4)
    with pytest.raises(InvalidOptionError, match="screen"):
        _loop(fn, 8, 3, SyntheticExecutor(fn), screen=0)


def test_the_prior_measured_on_the_low_windows_by_default_costs_less(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=5, seed=0)
    calibration = tiny_windows(model, n=4, seq_len=12, seed=1)
    opts = dict(remove=2, budget=60, low_windows=1, high_windows=4, batch=3, promote=1, patience=2, validate=2)
    high = refine(model, "layer", calibration, None, prior_windows="high", **opts)
    low = refine(model, "layer", calibration, None, **opts)  # the default
    assert low.cost["prior"] < 0.5 * high.cost["prior"]  # one window instead of four
    with pytest.raises(InvalidOptionError, match="prior_windows"):
        refine(model, "layer", calibration, None, prior_windows="all", **opts)


def test_improving_rounds_are_the_later_rounds_that_beat_the_incumbent():
    from cbo.search.rounds import improving_rounds

    bests = [0.9, 0.9, 0.8, 0.8, 0.8, 0.75]
    assert improving_rounds([{"round": i + 1, "best": b} for i, b in enumerate(bests)]) == [3, 6]
    assert improving_rounds([{"round": 1, "best": 0.5}, {"round": 2, "best": 0.5}]) == []
    assert improving_rounds([]) == []


def test_the_swap_neighbourhood_is_every_set_one_swap_away_within_a_kind():
    """Brute force: every same-size set at Hamming distance 2 that keeps each kind's count and never moves a kept
    unit; k (n - k) of them for one kind."""
    from cbo.search.moves import SwapMoves

    kinds = ["attention", "mlp"] * 4
    moves = SwapMoves(kinds, keep=[0])
    parent = (1, 2, 5)
    got = moves.neighbours(parent)
    want = []
    for cand in itertools.combinations(range(8), 3):
        if 0 in cand or len(set(cand) ^ set(parent)) != 2:
            continue
        if sorted(kinds[i] for i in cand) == sorted(kinds[i] for i in parent):
            want.append(cand)
    assert sorted(got) == sorted(want) and len(got) == len(set(got))
    assert len(SwapMoves(["layer"] * 30).neighbours(tuple(range(15)))) == 225


def test_neighbourhood_counts_the_best_sets_neighbours_measured_at_each_fidelity():
    from cbo.search.moves import SwapMoves
    from cbo.search.rounds import neighbourhood

    moves = SwapMoves(["layer"] * 5)
    rounds = [
        {"proposals": [[0, 1], [0, 2], [3, 4]], "promoted": [[0, 1]], "best_removed": [0, 1]},
        {"proposals": [[1, 2], [1, 4], [0, 3]], "promoted": [[1, 2]], "best_removed": [0, 1]},
    ]
    # neighbours of (0, 1): (0,2) (0,3) (0,4) (1,2) (1,3) (1,4); measured: (0,2) (1,2) (1,4) (0,3); high: (1,2)
    assert neighbourhood(rounds, moves) == {"size": 6, "measured": 4, "high": 1}
    assert neighbourhood([], moves) == {} and neighbourhood([{"best_removed": None}], moves) == {}
