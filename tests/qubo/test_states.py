"""RankedStates: filtering, dedup, exact energies, ordering, views and round trips."""

import numpy as np
import pytest

from cbo import BlockQUBO, RankedStates
from cbo.qubo.instances import random_block_qubo


def make(q, X, m, k=10):
    return RankedStates.from_candidates(q, X, m, k, solver="test", exact=False)


def test_from_candidates_filters_dedups_sorts():
    q = random_block_qubo(6, seed=1).with_constraints(keep=[0])
    X = np.array(
        [
            [0, 1, 1, 0, 0, 0],
            [0, 1, 1, 0, 0, 0],  # duplicate
            [1, 1, 0, 0, 0, 0],  # violates keep
            [0, 0, 0, 1, 1, 0],
            [0, 0, 1, 1, 1, 0],  # wrong M
            [0, 0, 1, 0, 0, 1],
        ]
    )
    rs = make(q, X, 2)
    assert len(rs) == 3
    assert np.all(np.diff(rs.energies) >= 0)
    np.testing.assert_allclose(rs.energies, q.energy(rs.states))
    assert rs.info["candidates"] == 6 and rs.info["feasible_candidates"] == 4
    assert rs.gaps[0] == 0 and np.all(rs.gaps >= 0)
    assert rs.hamming[0] == 0
    for s in rs:
        assert len(s.removed) == 2 and 0 not in s.removed
        assert s.hamming == int((rs.states[s.rank] != rs.states[0]).sum())


def test_ties_are_ordered_deterministically():
    q = BlockQUBO(np.zeros((4, 4)))
    X = np.array([[0, 0, 1, 1], [1, 1, 0, 0], [0, 1, 1, 0]])
    a = make(q, X, 2)
    b = make(q, X[::-1], 2)
    np.testing.assert_array_equal(a.states, b.states)
    assert a.removed(0) == [0, 1]


def test_k_limits_and_views(tmp_path):
    q = random_block_qubo(8, seed=2)
    import itertools

    X = []
    for c in itertools.combinations(range(8), 3):
        x = np.zeros(8, dtype=np.uint8)
        x[list(c)] = 1
        X.append(x)
    rs = make(q, np.array(X), 3, k=5)
    assert len(rs) == 5
    E = np.sort(q.energy(np.array(X)))[:5]
    np.testing.assert_allclose(rs.energies, E)
    text = repr(rs)
    assert "M=3" in text and "rank" in text
    df = rs.to_pandas()
    assert list(df["rank"]) == list(range(5))
    ss = rs.to_sampleset()
    np.testing.assert_allclose(np.sort(ss.record.energy), rs.energies)
    p = rs.save(tmp_path / "s.json")
    back = RankedStates.load(p)
    np.testing.assert_array_equal(back.states, rs.states)
    np.testing.assert_allclose(back.energies, rs.energies)
    assert back.solver == "test" and back.exact is False and back.remove == 3
    assert rs.removed_names(0) == [q.names[i] for i in rs.removed(0)]


def test_no_feasible_candidates_gives_empty_result():
    q = random_block_qubo(4, seed=0)
    rs = make(q, np.zeros((0, 4)), 2)
    assert len(rs) == 0
    with pytest.raises(Exception, match="no states"):
        _ = rs.ground


def test_edited_states_files_are_refused_naming_the_field(tmp_path):
    """Issue 27: a ranked-states file edited by hand loads as CorruptFileError naming the file and the field
    (reversed or NaN energies, repeated states, counts other than M, indices out of range were accepted, and
    index 99 raised a raw IndexError)."""
    import json

    from cbo.errors import CorruptFileError

    q = random_block_qubo(6, seed=1)
    path = make(q, np.array([[1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1]]), 2).save(tmp_path / "s.json")
    good = json.loads(path.read_text())
    assert RankedStates.load(path).to_json() == good
    cases = {
        "not in increasing order": {"energies": good["energies"][::-1]},
        "not finite": {"energies": [float("nan"), *good["energies"][1:]]},
        "removes 1 distinct blocks": {"removed": [[0, 0], *good["removed"][1:]]},
        "removes 3 distinct blocks": {"removed": [[0, 1, 2], *good["removed"][1:]]},
        "repeats an earlier state": {"removed": [good["removed"][0], good["removed"][0], good["removed"][2]]},
        "outside 0..5": {"removed": [[0, 99], *good["removed"][1:]]},
        "not a block count": {"remove": 9},
    }
    for why, change in cases.items():
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(CorruptFileError, match=f"'{path}'.*{why}"):
            RankedStates.load(path)
    path.write_text(json.dumps({k: v for k, v in good.items() if k != "solver"}))
    with pytest.raises(CorruptFileError, match="incomplete or edited"):
        RankedStates.load(path)
