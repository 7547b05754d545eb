"""Swap moves: every mutation keeps each kind's count, never touches kept units, and moves 1..m swaps."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from cbo.search.moves import SwapMoves


@pytest.mark.parametrize("kinds", [["layer"] * 12, ["attention", "mlp"] * 8])
def test_mutations_keep_counts_and_kept_units(kinds):
    keep = [0, 3]
    moves = SwapMoves(kinds, keep=keep, rng=np.random.default_rng(0))
    counts = {k: 3 for k in set(kinds)}
    parent = moves.random_set(counts)
    assert not set(parent) & set(keep)
    for _ in range(500):
        child = moves.mutate(parent, 3)
        assert Counter(kinds[i] for i in child) == Counter(kinds[i] for i in parent)
        assert not set(child) & set(keep)
        assert len(set(child) ^ set(parent)) <= 2 * 3  # at most 3 swaps
        parent = child


def test_swap_counts_follow_min_of_two_uniforms():
    moves = SwapMoves(["layer"] * 40, rng=np.random.default_rng(1))
    parent = tuple(range(0, 40, 2))
    swaps = Counter()
    for _ in range(4000):
        child = moves.mutate(parent, 3)
        swaps[len(set(child) - set(parent))] += 1  # a swap may undo another: at most, not exactly, the draw
    share = {k: v / 4000 for k, v in swaps.items()}
    # P(min = 1) = 5/9, P(min = 2) = 3/9, P(min = 3) = 1/9 before collisions
    assert share[1] == pytest.approx(5 / 9, abs=0.06) and share[3] < 1 / 9 + 0.03


def test_a_kind_removed_entirely_or_not_at_all_does_not_move():
    kinds = ["attention", "mlp"] * 4
    moves = SwapMoves(kinds, rng=np.random.default_rng(2))
    parent = (0, 2, 4, 6, 1)  # every attention unit, one MLP unit
    assert moves.movable(parent) == ["mlp"]
    for _ in range(50):
        child = moves.mutate(parent, 3)
        assert {0, 2, 4, 6} <= set(child) and len(child) == 5
    assert moves.mutate((), 3) == ()
