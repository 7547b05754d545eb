"""The swap-neighbour table from fabricated measurements: the count of lower neighbours, the lowest ones with
their swap, and the report's row."""

from __future__ import annotations

from bench_scripts import bench_module


def test_local_rank_counts_lower_neighbours_and_names_their_swaps():
    S = bench_module("swap_neighbours")
    centre = (0, 1)
    kl = {centre: 1.0, (0, 2): 0.9, (0, 3): 1.2, (1, 2): 1.0, (1, 3): 0.95}
    r = S.local_rank(centre, kl, top=2)
    assert r["kl"] == 1.0 and r["neighbours"] == 4 and r["lower"] == 2  # a tie is not lower
    assert r["best_neighbour_kl"] == 0.9
    assert r["lowest"][0] == {"removed": [0, 2], "kl": 0.9, "out": [1], "in": [2]}
    assert [x["removed"] for x in r["lowest"]] == [[0, 2], [1, 3]]
    alone = S.local_rank(centre, {centre: 2.0}, top=3)
    assert alone["lower"] == 0 and alone["best_neighbour_kl"] is None and alone["lowest"] == []


def test_the_report_has_a_row_per_set():
    S = bench_module("swap_neighbours")
    lowest = [{"removed": [0, 2], "kl": 0.9, "out": [1], "in": [2]}]
    method = {"kl": 1.0, "neighbours": 4, "lower": 1, "best_neighbour_kl": 0.9, "lowest": lowest}
    result = {
        "command": "x",
        "machine": {},
        "wall_time_s": 1.0,
        "points": {"m15-s0": {"granularity": "layer", "windows": 32, "methods": {"refined": method}}},
    }
    text = S.markdown(result)
    assert "| refined | 1.0000 | 4 | 1 | 0.9000 | put back [1], remove [2] |" in text
