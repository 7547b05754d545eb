"""Reading refine's round log: which rounds improved the incumbent, and how much of the best set's one-swap
neighbourhood the rounds measured (the report's account of why no later round improved)."""

from __future__ import annotations

from typing import Any, Sequence

from cbo.search.moves import SwapMoves


def improving_rounds(rounds: Sequence[dict[str, Any]]) -> list[int]:
    """The rounds after the first whose best measured set beat every earlier round's (the incumbent improved), by
    the rule of the progress bar's :class:`cbo.progress.Incumbent`."""
    from cbo.progress import Incumbent

    incumbent, out = Incumbent(), []
    for record in rounds:
        before = incumbent.improvements
        incumbent.update(int(record["round"]), float(record["best"]))
        if incumbent.improvements > before:
            out.append(int(record["round"]))
    return out


def neighbourhood(rounds: Sequence[dict[str, Any]], moves: SwapMoves) -> dict[str, int]:
    """How much of the final best set's one-swap neighbourhood the rounds measured: ``{"size": every neighbour,
    "measured": those measured at all, "high": those measured on the high-fidelity windows}``. None of the ``high``
    ones beat the best set (it is the lowest high-fidelity loss); the others lost at low fidelity in their round.
    Empty when no round found a best set."""
    best = rounds[-1].get("best_removed") if rounds else None
    if not best:
        return {}
    around = set(moves.neighbours(best))
    low = {tuple(p) for r in rounds for p in r.get("proposals", [])}
    high = {tuple(p) for r in rounds for p in r.get("promoted", [])}
    return {"size": len(around), "measured": len(around & (low | high)), "high": len(around & high)}


def promotions(rounds: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How the promotions ended: ``{"finished": sets measured on every high window, "dropped": sets stopped at a
    stage behind the incumbent}`` (``cbo.search.staged``; rounds recorded without stages drop none)."""
    finished = sum(len(r.get("promoted", [])) for r in rounds)
    return {"finished": finished, "dropped": sum(len(r.get("dropped", [])) for r in rounds)}
