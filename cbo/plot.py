"""Plots of ranked states and QUBOs (matplotlib, imported lazily).

Each function draws on ``ax`` when given (else a new figure), writes ``path`` when given, and
returns the figure, so notebooks can compose them and the CLI can save them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from cbo._extras import require
from cbo.errors import CBOError

if TYPE_CHECKING:
    from cbo.qubo import BlockQUBO
    from cbo.states import RankedStates


def _figure(ax: Any, size: tuple[float, float]) -> tuple[Any, Any]:
    plt = _pyplot()
    if ax is None:
        fig, ax = plt.subplots(figsize=size, layout="constrained")
    else:
        fig = ax.figure
    return fig, ax


def _pyplot() -> Any:
    mpl = require("matplotlib", "plot", "plotting")
    if mpl.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        import os

        if not os.environ.get("DISPLAY"):
            mpl.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig: Any, path: str | Path | None) -> Any:
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def _need_states(states: RankedStates) -> None:
    if not len(states):
        raise CBOError("nothing to plot: the ranked states are empty.")


def plot_spectrum(states: RankedStates, *, ax: Any = None, path: str | Path | None = None) -> Any:
    """Energy of each ranked state (left axis) and its gap to the ground state (right axis)."""
    _need_states(states)
    fig, ax = _figure(ax, (6, 3.5))
    ranks = np.arange(len(states))
    ax.plot(ranks, states.energies, "o-", color="C0", ms=4, label="energy")
    ax.set_xlabel("rank (0 = ground state)")
    ax.set_ylabel("energy")
    ax2 = ax.twinx()
    ax2.bar(ranks, states.gaps, color="C1", alpha=0.3, label="gap to ground")
    ax2.set_ylabel("gap to ground")
    kind = "exact" if states.exact else "heuristic"
    ax.set_title(f"Energy spectrum, M={states.remove} ({states.solver}, {kind})")
    return _finish(fig, path)


def plot_removal_map(
    states: RankedStates, *, ax: Any = None, path: str | Path | None = None, max_states: int = 50
) -> Any:
    """States × blocks: which blocks each ranked state removes."""
    _need_states(states)
    X = states.states[:max_states]
    fig, ax = _figure(ax, (max(5, 0.22 * X.shape[1] + 2), max(2.5, 0.2 * X.shape[0] + 1.5)))
    ax.imshow(X, aspect="auto", cmap="Greys", interpolation="nearest", vmin=0, vmax=1)
    ax.set_xlabel("block")
    ax.set_ylabel("rank")
    step = max(1, X.shape[1] // 30)
    ax.set_xticks(range(0, X.shape[1], step))
    ax.set_title(f"Removed blocks (black) of the top {X.shape[0]} states, M={states.remove}")
    return _finish(fig, path)


def plot_hamming(states: RankedStates, *, ax: Any = None, path: str | Path | None = None) -> Any:
    """Hamming distance of each ranked state to the ground state."""
    _need_states(states)
    fig, ax = _figure(ax, (6, 3))
    ax.plot(np.arange(len(states)), states.hamming, "s-", ms=4, color="C2")
    ax.set_xlabel("rank")
    ax.set_ylabel("Hamming distance to ground")
    ax.set_title("Distance of excited states from the ground state")
    return _finish(fig, path)


def plot_energy_vs_measured(
    energies: Sequence[float],
    measured: Sequence[float],
    *,
    chosen: int | None = None,
    label: str = "validation KL",
    ax: Any = None,
    path: str | Path | None = None,
    log: bool = False,
) -> Any:
    """Scatter of energy against a measured quality (KL, PPL); ``chosen`` marks one point."""
    e = np.asarray(energies, dtype=float)
    y = np.asarray(measured, dtype=float)
    if e.shape != y.shape or e.size == 0:
        raise CBOError(
            f"energies and measured values must be non-empty and the same length, got {e.size} and {y.size}."
        )
    fig, ax = _figure(ax, (5, 4))
    ax.scatter(e, y, s=18, color="C0", label="states")
    if chosen is not None:
        ax.scatter([e[chosen]], [y[chosen]], s=120, facecolors="none", edgecolors="C3", lw=2, label="chosen")
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("energy")
    ax.set_ylabel(label)
    if e.size > 2:
        from cbo._stats import spearman

        ax.set_title(f"Energy vs {label} (Spearman {spearman(e, y):.2f})")
    ax.legend(loc="best")
    return _finish(fig, path)


def plot_couplings(qubo: BlockQUBO, *, ax: Any = None, path: str | Path | None = None) -> Any:
    """The coupling matrix H as a heatmap (symmetric colour scale), blocks coloured by kind."""
    fig, ax = _figure(ax, (6.5, 5.5))
    H = np.array(qubo.H)
    off = H.copy()
    np.fill_diagonal(off, 0)
    lim = float(np.abs(off).max()) or 1.0
    im = ax.imshow(off, cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
    fig.colorbar(im, ax=ax, shrink=0.8, label="coupling H_ij (diagonal hidden)")
    kinds = sorted(set(qubo.kinds))
    colors = {k: f"C{i}" for i, k in enumerate(kinds)}
    n = qubo.n
    for i, k in enumerate(qubo.kinds):
        ax.add_patch(_rect(i, n, colors[k]))
    handles = [_patch(colors[k], k) for k in kinds]
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(0.0, -0.1),
        ncol=len(kinds),
        fontsize=8,
        title="block kind (bottom strip)",
    )
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(n + 0.5, -0.5)
    ax.set_xlabel("block")
    ax.set_ylabel("block")
    ax.set_title("Couplings between blocks")
    return _finish(fig, path)


def _rect(i: int, n: int, color: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((i - 0.5, n - 0.5), 1, 1, color=color, clip_on=False)


def _patch(color: str, label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(color=color, label=label)


def save_all(states: RankedStates, qubo: BlockQUBO | None, directory: str | Path) -> list[Path]:
    """Write the spectrum, removal map, Hamming and (with a QUBO) coupling plots to a folder."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    out = []
    for name, fn in (("spectrum", plot_spectrum), ("removal_map", plot_removal_map), ("hamming", plot_hamming)):
        fig = fn(states, path=d / f"{name}.png")
        plt.close(fig)
        out.append(d / f"{name}.png")
    if qubo is not None:
        plt.close(plot_couplings(qubo, path=d / "couplings.png"))
        out.append(d / "couplings.png")
    return out
