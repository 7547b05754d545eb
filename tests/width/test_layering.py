"""One-way arrows of the width modules (STYLE.md): width steps never estimate a Hessian or run a solver (the
pipeline layer hands them a depth proposer), and surgery never imports width."""

from __future__ import annotations

import pytest
from test_architecture import import_edges

# the pipeline layer (compress and the depth proposers live there), which may import hessian and solvers
PIPELINE = ("cbo.pipeline",)


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in edges.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


EDGES, _ = import_edges()
WIDTH_STEPS = sorted(m for m in EDGES if m.startswith("cbo.width") and not m.startswith(PIPELINE))


@pytest.mark.parametrize("module", WIDTH_STEPS)
def test_width_steps_import_no_hessian_solver_or_pipeline(module):
    reached = _reachable(EDGES, module)
    assert not {m for m in reached if m.startswith(("cbo.hessian", "cbo.solvers", *PIPELINE))}


@pytest.mark.parametrize("module", ["cbo.model.structures", "cbo.surgery.width", "cbo.surgery.io", "cbo.surgery.depth"])
def test_surgery_and_structures_import_no_width(module):
    assert not {m for m in _reachable(EDGES, module) if m.startswith("cbo.width")}


def test_the_width_modules_are_listed():
    assert {"cbo.width.mop", "cbo.width.allocate", "cbo.width.scores.base", "cbo.width.prune"} <= set(WIDTH_STEPS)
