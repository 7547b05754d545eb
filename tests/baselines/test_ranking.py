"""Ranking.select / max_remove / JSON for each kind of result (scores, order, run distances, per-M sets), against
brute force over the feasible sets; no model needed."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from cbo.baselines.ranking import Ranking, check_caps
from cbo.errors import InfeasibleError

N = 6
KINDS = ["attention", "mlp"] * (N // 2)


def ranking(**kw) -> Ranking:
    return Ranking("demo", "sublayer", [f"b{i}" for i in range(N)], list(KINDS), [10] * N, **kw)


def brute_scored(scores, m, keep=(), caps=None):
    feasible = [
        c
        for c in itertools.combinations(range(N), m)
        if not set(c) & set(keep)
        and np.all(np.isfinite(scores[list(c)]))
        and all(sum(KINDS[i] == k for i in c) <= v for k, v in (caps or {}).items())
    ]
    return list(min(feasible, key=lambda c: (sum(scores[i] for i in c), c)))


def test_scored_selection_is_the_lowest_feasible_total():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=N)
    scores[2] = np.nan  # never removed (e.g. protected)
    r = ranking(scores=scores, keep=(4,))
    assert r.max_remove() == N - 2  # one kept, one unscored: both remain
    for m in range(1, N - 1):
        assert r.select(m) == brute_scored(scores, m, keep=(4,))
    for m in (1, 2, 3):
        assert r.select(m, caps={"attention": 0}) == brute_scored(scores, m, keep=(4,), caps={"attention": 0})
    with pytest.raises(InfeasibleError):
        r.select(N - 1)
    with pytest.raises(InfeasibleError, match="only 3 removable blocks fit"):
        r.select(4, caps={"attention": 0})


def test_order_selection_is_a_prefix_skipping_capped_kinds():
    r = ranking(order=[3, 0, 5, 1], order_losses=[1.0, 2.0, 3.0, 4.0])
    assert [r.select(m) for m in (1, 2, 3, 4)] == [[3], [0, 3], [0, 3, 5], [0, 1, 3, 5]]
    assert r.max_remove() == 4
    assert r.select(2, caps={"mlp": 1}) == [0, 3]  # order 3 (mlp), 0 (attention)
    assert r.select(2, caps={"attention": 0}) == [3, 5]


def test_run_selection_is_the_best_contiguous_run_and_max_remove_the_longest_free_run():
    rng = np.random.default_rng(1)
    d = rng.uniform(size=(N + 1, N + 1))
    r = ranking(distances=d, keep=(2,))
    assert r.max_remove() == 3  # blocks 3, 4, 5
    for m in (1, 2, 3):
        runs = [s for s in range(N - m + 1) if 2 not in range(s, s + m)]
        best = min(runs, key=lambda s: d[s, s + m])
        assert r.select(m) == list(range(best, best + m))
    with pytest.raises(InfeasibleError):
        r.select(4)
    assert ranking(distances=d).max_remove() == N - 1  # something must remain


def test_per_m_sets_answer_only_their_m_and_check_caps():
    r = ranking(sets={2: [4, 1], 3: [0, 1, 3]})
    assert r.select(2) == [1, 4] and r.select(3) == [0, 1, 3] and r.max_remove() == 3
    with pytest.raises(InfeasibleError, match="rank again with max_remove=1"):
        r.select(1)
    with pytest.raises(InfeasibleError, match="breaks the caps"):
        r.select(3, caps={"mlp": 1})


@pytest.mark.parametrize(
    "fields",
    [
        {"scores": np.array([0.1, np.nan, np.inf, 0.3, 0.2, 0.5])},
        {"order": [1, 2], "order_losses": [0.5, float("inf")]},
        {"distances": np.arange((N + 1) ** 2, dtype=float).reshape(N + 1, N + 1)},
        {"sets": {2: [0, 3]}},
    ],
)
def test_json_round_trip_is_strict_json(fields):
    r = ranking(keep=(5,), info={"loss": "ce"}, **fields)
    text = json.dumps(r.to_json(), allow_nan=False)
    again = Ranking.from_json(json.loads(text))
    assert again.to_json() == r.to_json()
    assert again.max_remove() == r.max_remove()
    assert [again.select(m) for m in range(1, r.max_remove() + 1) if r.sets is None or m in r.sets] == [
        r.select(m) for m in range(1, r.max_remove() + 1) if r.sets is None or m in r.sets
    ]


def test_caps_are_checked():
    assert check_caps({"mlp": 2}, KINDS) == {"mlp": 2}
    for bad in ({"conv": 1}, {"mlp": -1}, {"mlp": 1.5}, {"mlp": True}):
        with pytest.raises(InfeasibleError):
            check_caps(bad, KINDS)
