"""Plots of ranked states and QUBOs (matplotlib, imported lazily).

Each function draws on ``ax`` when given (else a new figure), writes ``path`` when given, and
returns the figure, so notebooks can compose them and the CLI can save them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from cbo.errors import CBOError
from cbo.extras import require

if TYPE_CHECKING:
    from cbo.qubo.block_qubo import BlockQUBO
    from cbo.qubo.states import RankedStates


def _figure(ax: Any, size: tuple[float, float]) -> tuple[Any, Any]:
    plt = _pyplot()
    if ax is None:
        fig, ax = plt.subplots(figsize=size, layout="constrained")
    else:
        fig = ax.figure
    return fig, ax


def _pyplot() -> Any:
    mpl = require("matplotlib", "plotting")
    if mpl.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        import os

        if not os.environ.get("DISPLAY"):
            mpl.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def close(fig: Any) -> None:
    """Close a figure drawn here (frees its memory; the files written stay)."""
    _pyplot().close(fig)


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
        from cbo.stats import spearman

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


def _steps(result: Any) -> list[dict[str, Any]]:
    """MoP steps as dicts, from a MoPResult, a CompressionReport, or a list of MoPStep / dicts."""
    import dataclasses

    steps = getattr(result, "path", result)
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
        raise CBOError(
            f"expected a MoP path (MoPResult, CompressionReport or a list of steps), got {type(result).__name__}."
        )
    out = []
    for s in steps:
        d = dataclasses.asdict(s) if dataclasses.is_dataclass(s) else dict(s)
        if d.get("chosen") not in ("depth", "width") or "params_after" not in d:
            raise CBOError(f"a MoP step needs 'chosen' (depth or width) and 'params_after', got {d!r}.")
        out.append(d)
    if not out:
        raise CBOError("nothing to plot: the MoP path is empty (one-shot schedulers record no path).")
    return out


def plot_mop_path(
    result: Any,
    *,
    params_before: int | None = None,
    criterion: str | None = None,
    ax: Any = None,
    path: str | Path | None = None,
) -> Any:
    """The MoP path: criterion value of each step's chosen candidate against the parameters removed so far.

    Depth steps are squares, width steps circles; the candidate not taken at each step is a grey cross at the
    same abscissa. ``result`` is a :class:`cbo.width.mop.MoPResult`, a :class:`CompressionReport` from
    ``compress(..., scheduler="mop")``, or a list of steps (``MoPStep`` or their dicts).
    """
    steps = _steps(result)
    p0 = params_before or getattr(result, "params_before", None) or steps[0]["params_before"]
    settings = getattr(result, "settings", None) or {}
    criterion = criterion or getattr(result, "criterion", None) or settings.get("criterion") or "criterion"
    fig, ax = _figure(ax, (6.5, 4))
    x = np.array([1.0 - s["params_after"] / p0 for s in steps])

    def value(s: dict[str, Any], kind: str) -> float:
        v = s.get(f"{kind}_score")
        return np.nan if v is None else float(v)

    chosen = np.array([value(s, s["chosen"]) for s in steps])
    other = np.array([value(s, "width" if s["chosen"] == "depth" else "depth") for s in steps])
    ax.plot(x, chosen, "-", color="0.6", lw=1, zorder=1)
    for kind, marker, color in (("depth", "s", "C0"), ("width", "o", "C1")):
        idx = [i for i, s in enumerate(steps) if s["chosen"] == kind]
        if not idx:
            continue
        ax.scatter(x[idx], chosen[idx], marker=marker, s=40, color=color, label=f"{kind} step", zorder=3)
    taken = np.isfinite(other)
    if taken.any():
        ax.scatter(x[taken], other[taken], marker="x", s=30, color="0.5", label="candidate not taken", zorder=2)
    for i, s in enumerate(steps):
        if s["chosen"] == "depth" and s.get("depth_original_layer") is not None and np.isfinite(chosen[i]):
            ax.annotate(
                f"L{s['depth_original_layer']}",
                (x[i], chosen[i]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
            )
    ax.set_xlabel("fraction of parameters removed")
    ax.set_ylabel(f"{criterion} of the chosen candidate")
    letters = "".join("D" if s["chosen"] == "depth" else "W" for s in steps)
    ax.set_title(f"MoP path {letters} ({criterion})")
    ax.legend(loc="best", fontsize=8)
    return _finish(fig, path)


def plot_solver_comparison(
    rows: Any,
    *,
    metric: str = "recall",
    ax: Any = None,
    path: str | Path | None = None,
) -> Any:
    """Wall time (log scale) against a quality metric, one colour per solver and one point per instance.

    ``rows`` is a list of dicts or a pandas DataFrame with columns ``solver``, ``wall_s`` and ``metric``
    (e.g. ``recall`` of the exact top-K); rows with a missing value are left out.
    """
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else [dict(r) for r in rows]
    good = []
    for r in records:
        if "solver" not in r or "wall_s" not in r or metric not in r:
            raise CBOError(f"each row needs 'solver', 'wall_s' and {metric!r}, got keys {sorted(r)}.")
        t, m = r["wall_s"], r[metric]
        if t is not None and m is not None and np.isfinite(t) and np.isfinite(m):
            good.append(r)
    if not good:
        raise CBOError(f"nothing to plot: no row has both a wall time and a {metric!r} value.")
    fig, ax = _figure(ax, (6.5, 4))
    solvers = list(dict.fromkeys(r["solver"] for r in good))
    for i, name in enumerate(solvers):
        pts = [r for r in good if r["solver"] == name]
        ax.scatter(
            [max(float(r["wall_s"]), 1e-6) for r in pts],
            [float(r[metric]) for r in pts],
            s=36,
            color=f"C{i % 10}",
            marker="osD^v<>pP*"[i % 10],
            label=name,
            alpha=0.85,
        )
    ax.set_xscale("log")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel(metric)
    ax.set_title(f"Solvers: time vs {metric} ({len(solvers)} solvers, {len(good)} runs)")
    ax.legend(loc="best", fontsize=8, ncol=2)
    return _finish(fig, path)
