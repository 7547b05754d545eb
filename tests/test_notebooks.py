"""The notebooks under notebooks/ run top to bottom in quick mode, and are committed without outputs.

Each notebook has one code cell tagged ``parameters`` that sets ``QUICK = False``; the run inserts a cell
``QUICK = True`` right after it (papermill's convention) and executes a copy of the notebook in a temporary
folder, so nothing is written into the repository.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
# name -> the least number of figures a quick run must draw
NAMES = {"excited_states": 4, "solver_comparison": 2, "depth_width": 3}
CELL_TIMEOUT_S = 900


def _load(name: str):
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def _parameters_cell(nb) -> int:
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"expected one cell tagged 'parameters', found {len(tagged)}"
    cell = nb.cells[tagged[0]]
    assert cell.cell_type == "code" and "QUICK = False" in cell.source
    return tagged[0]


def with_quick(nb, out_dir: Path | None = None):
    """A copy of ``nb`` with a ``QUICK = True`` cell injected after its parameters cell.

    ``out_dir`` sets ``OUT_DIR`` too, for notebooks whose parameters cell has one.
    """
    nb = nbformat.from_dict(nb)
    i = _parameters_cell(nb)
    lines = ["QUICK = True"]
    if out_dir is not None and "OUT_DIR" in nb.cells[i].source:
        lines.append(f"OUT_DIR = {str(out_dir)!r}")
    injected = nbformat.v4.new_code_cell("\n".join(lines))
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(i + 1, injected)
    return nb


@pytest.mark.parametrize("name", sorted(NAMES))
def test_committed_notebooks_are_stripped(name):
    nb = _load(name)
    nbformat.validate(nb)
    _parameters_cell(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{name}.ipynb cell {i} has outputs: strip them before committing"
            assert cell.execution_count is None, f"{name}.ipynb cell {i} has an execution count"


def test_quick_injection_follows_the_parameters_cell():
    nb = with_quick(_load("excited_states"))
    i = _parameters_cell(nb)
    assert nb.cells[i + 1].source == "QUICK = True"
    assert len(nb.cells) == len(_load("excited_states").cells) + 1


def _figures(nb) -> int:
    return sum(
        1
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.get("output_type") in ("display_data", "execute_result") and "image/png" in out.get("data", {})
    )


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NAMES))
def test_notebook_runs_in_quick_mode(name, installed, tmp_path):
    nbclient = pytest.importorskip("nbclient")
    nb = with_quick(_load(name), out_dir=tmp_path / "out")
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    t = time.perf_counter()
    client.execute()  # raises CellExecutionError naming the failing cell
    wall = time.perf_counter() - t
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
    assert not errors
    assert _figures(nb) >= NAMES[name], f"{name}: {_figures(nb)} figures drawn, expected >= {NAMES[name]}"
    if name == "excited_states":  # the chosen pruned model was saved where OUT_DIR says
        assert (tmp_path / "out" / "pruned-M4" / "config.json").is_file()
    print(f"{name}: quick run {wall:.1f} s")
