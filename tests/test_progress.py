"""Progress reports: refine's bar says which round found its best set and how many later rounds improved it."""

from __future__ import annotations

from cbo.progress import Incumbent


def test_the_incumbent_says_when_it_was_found_and_how_often_it_improved():
    inc = Incumbent()
    assert inc.update(1, 0.99) == {"best_kl": "0.99", "from": "round 1", "improved": "0 of 0 later rounds"}
    assert inc.update(2, 0.99)["improved"] == "0 of 1 later rounds"  # the same best: nothing beat it, and it says so
    assert inc.update(3, 0.95) == {"best_kl": "0.95", "from": "round 3", "improved": "1 of 2 later rounds"}
    assert inc.update(4, 0.95)["from"] == "round 3"
