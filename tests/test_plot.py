"""Each plot renders to a PNG from a small result."""

import numpy as np
import pytest

from cbo import RankedStates
from cbo import plot as cplot
from cbo.qubo.instances import random_block_qubo

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


# ------------------------------------------------------------------------------------------------ MoP path
def _mop_steps():
    from cbo.width.mop import MoPStep

    # D (layer 20, kl 0.10 vs width 0.30), W (0.25 vs depth 0.40), D (layer 7), final W (width only)
    return [
        MoPStep(0, "depth", 1000, 900, 20, 20, 100, 100, 0.10, 0.30, 1.0),
        MoPStep(1, "width", 900, 800, 19, 22, 100, 100, 0.40, 0.25, 1.0),
        MoPStep(2, "depth", 800, 700, 7, 7, 100, 100, 0.35, 0.50, 1.0),
        MoPStep(3, "width", 700, 650, None, None, 0, 50, None, 0.45, 1.0, True),
    ]


def test_mop_path_plot_draws_each_step(tmp_path):
    import dataclasses

    steps = _mop_steps()
    fig = cplot.plot_mop_path(steps, criterion="kl", path=tmp_path / "mop.png")
    assert is_png(tmp_path / "mop.png")
    ax = fig.axes[0]
    assert ax.get_title() == "MoP path DWDW (kl)"
    by_label = {c.get_label(): np.asarray(c.get_offsets()) for c in ax.collections}
    np.testing.assert_allclose(by_label["depth step"], [[0.1, 0.10], [0.3, 0.35]])
    np.testing.assert_allclose(by_label["width step"], [[0.2, 0.25], [0.35, 0.45]])
    # the rejected candidate of each of the first three steps; the final step had none
    np.testing.assert_allclose(by_label["candidate not taken"], [[0.1, 0.30], [0.2, 0.40], [0.3, 0.50]])
    assert [t.get_text() for t in ax.texts] == ["L20", "L7"]
    # a CompressionReport-like object: steps as dicts, criterion from the settings, p0 from the report
    report = type("R", (), {"path": [dataclasses.asdict(s) for s in steps], "params_before": 2000,
                            "settings": {"criterion": "cosine"}})()  # fmt: skip
    fig2 = cplot.plot_mop_path(report)
    offsets = {c.get_label(): np.asarray(c.get_offsets()) for c in fig2.axes[0].collections}
    np.testing.assert_allclose(offsets["depth step"][:, 0], [0.55, 0.65])
    assert "(cosine)" in fig2.axes[0].get_title()


def test_mop_path_plot_refuses_empty_or_malformed():
    with pytest.raises(Exception, match="empty"):
        cplot.plot_mop_path([])
    with pytest.raises(Exception, match="chosen"):
        cplot.plot_mop_path([{"step": 0}])


# ------------------------------------------------------------------------------------------------ solvers
def test_solver_comparison_plot_one_series_per_solver(tmp_path):
    rows = [
        {"instance": "a", "solver": "enumerate", "wall_s": 0.5, "recall": 1.0},
        {"instance": "b", "solver": "enumerate", "wall_s": 2.0, "recall": 1.0},
        {"instance": "a", "solver": "swap-sa", "wall_s": 0.1, "recall": 0.9},
        {"instance": "b", "solver": "swap-sa", "wall_s": 0.2, "recall": 0.8},
        {"instance": "a", "solver": "sa", "wall_s": 3.0, "recall": 0.3},
        {"instance": "b", "solver": "sa", "wall_s": None, "recall": None},  # a skipped run is left out
    ]
    fig = cplot.plot_solver_comparison(rows, path=tmp_path / "solvers.png")
    assert is_png(tmp_path / "solvers.png")
    ax = fig.axes[0]
    series = {c.get_label(): np.asarray(c.get_offsets()) for c in ax.collections}
    assert list(series) == ["enumerate", "swap-sa", "sa"]
    np.testing.assert_allclose(series["swap-sa"], [[0.1, 0.9], [0.2, 0.8]])
    assert series["sa"].shape == (1, 2)
    assert ax.get_xscale() == "log"
    assert "3 solvers, 5 runs" in ax.get_title()
    pd = pytest.importorskip("pandas")
    fig2 = cplot.plot_solver_comparison(pd.DataFrame(rows), metric="recall")
    assert len(fig2.axes[0].collections) == 3


def test_solver_comparison_plot_refuses_bad_rows():
    with pytest.raises(Exception, match="wall_s"):
        cplot.plot_solver_comparison([{"solver": "x", "recall": 1.0}])
    with pytest.raises(Exception, match="nothing to plot"):
        cplot.plot_solver_comparison([{"solver": "x", "wall_s": None, "recall": None}])


def test_mop_path_plot_without_depth_steps_has_no_depth_series():
    steps = [s for s in _mop_steps() if s.chosen == "width"]
    labels = [c.get_label() for c in cplot.plot_mop_path(steps).axes[0].collections]
    assert labels == ["width step", "candidate not taken"]
