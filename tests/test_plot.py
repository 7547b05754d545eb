"""Each plot renders to a PNG from a small result."""

import numpy as np
import pytest

from cbo import RankedStates
from cbo import plot as cplot
from cbo.instances import random_block_qubo

pytest.importorskip("matplotlib")


@pytest.fixture
def states():
    import itertools

    q = random_block_qubo(8, seed=3, kinds=["attention", "mlp"] * 4)
    X = []
    for c in itertools.combinations(range(8), 3):
        x = np.zeros(8, dtype=np.uint8)
        x[list(c)] = 1
        X.append(x)
    return q, RankedStates.from_candidates(q, np.array(X), 3, 12, solver="test", exact=True)


def is_png(path):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


def test_every_plot_writes_a_png(states, tmp_path):
    q, rs = states
    cplot.plot_spectrum(rs, path=tmp_path / "s.png")
    cplot.plot_removal_map(rs, path=tmp_path / "m.png")
    cplot.plot_hamming(rs, path=tmp_path / "h.png")
    cplot.plot_couplings(q, path=tmp_path / "c.png")
    measured = rs.energies * 2 + np.linspace(0, 0.1, len(rs))
    fig = cplot.plot_energy_vs_measured(rs.energies, measured, chosen=3, path=tmp_path / "e.png")
    assert "Spearman 1.00" in fig.axes[0].get_title()
    for name in "smhce":
        assert is_png(tmp_path / f"{name}.png")
    written = cplot.save_all(rs, q, tmp_path / "all")
    assert len(written) == 4 and all(is_png(p) for p in written)


def test_removal_map_shows_the_states(states):
    _, rs = states
    fig = cplot.plot_removal_map(rs)
    img = fig.axes[0].images[0].get_array()
    np.testing.assert_array_equal(np.asarray(img), rs.states)


def test_bad_input_is_refused(states):
    _, rs = states
    with pytest.raises(Exception, match="same length"):
        cplot.plot_energy_vs_measured([1.0, 2.0], [1.0])
    empty = RankedStates(np.zeros((0, 3)), [], names=["a", "b", "c"], remove=1, solver="x", exact=False)
    with pytest.raises(Exception, match="empty"):
        cplot.plot_spectrum(empty)
