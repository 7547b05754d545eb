"""Sweeps: resumable (each cell computed once across an interruption), the results table, the CLI, Ray."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest
import ray_session

import cbo.solvers.sweep as sweep_mod
from cbo.errors import CBOError, InvalidQUBOError, UnknownSolverError
from cbo.solvers.sweep import (
    COLUMNS,
    load_instance,
    make_grid,
    read_records,
    results_table,
    run_sweep,
    solver_row,
    write_table,
)

ray_local = ray_session.ray_local  # the shared local Ray instance (a fixture)

INSTANCES = ["synthetic:12:1", "synthetic:14:2"]


@pytest.fixture
def counted(monkeypatch):
    """Counts the cells the sweep computes (by key)."""
    calls: Counter = Counter()
    inner = sweep_mod.run_cell

    def counting(cell):
        calls[cell.key] += 1
        return inner(cell)

    monkeypatch.setattr(sweep_mod, "run_cell", counting)
    return calls


def _brute(q, m, k=10):
    combos = list(itertools.combinations(range(q.n), m))
    X = np.zeros((len(combos), q.n), dtype=np.uint8)
    for i, c in enumerate(combos):
        X[i, list(c)] = 1
    return np.sort(q.energy(X))[:k]


def stop_after(n: int, seen: list):
    """A cell callback that records each cell's key and raises once ``n`` cells are done (an interrupted sweep)."""

    def stop(record):
        seen.append(record["key"])
        if len(seen) == n:
            raise RuntimeError("interrupted")

    return stop


def test_interrupted_sweep_resumes_and_computes_each_cell_once(tmp_path, counted):
    cells = make_grid(INSTANCES, ["enumerate", "swap-tabu"], removes=[3, 5], seeds=[0, 1])
    assert len(cells) == 2 * 2 * (1 + 2 * 2)  # instance × M × (reference + solvers × seeds)
    out = tmp_path / "sweep.jsonl"
    seen = []
    with pytest.raises(RuntimeError, match="interrupted"):
        run_sweep(cells, out, on_cell=stop_after(2, seen))
    assert len(read_records(out)) == 2 and sum(counted.values()) == 2
    records = run_sweep(cells, out)
    assert sorted(counted) == sorted(c.key for c in cells)
    assert set(counted.values()) == {1}  # every cell computed exactly once over both runs
    assert len(read_records(out)) == len(cells) == len(records)
    # a third run has nothing left to do
    run_sweep(cells, out)
    assert sum(counted.values()) == len(cells)

    rows = results_table(records)
    assert len(rows) == 2 * 2 * 2 * 2
    for row in rows:
        assert set(row) == set(COLUMNS) and row["status"] == "ok" and row["reference"] == "exact"
        ref = _brute(load_instance(row["instance"]), row["remove"])
        assert row["reference_energy"] == pytest.approx(ref[0], rel=1e-12)
        assert row["gap"] >= -1e-12
        if row["solver"] == "enumerate":
            assert row["gap"] == pytest.approx(0.0, abs=1e-12) and row["top10_recall"] == 1.0
            assert row["distinct_states"] == 10 and row["feasible_fraction"] == 1.0


def test_ctrl_c_in_a_cell_stops_the_sweep_without_recording_that_cell(tmp_path, monkeypatch):
    """A solver stopped by Ctrl-C returns its best-so-far marked interrupted: that is no finished cell."""
    cells = make_grid(["synthetic:10:3"], ["enumerate", "swap-tabu"], removes=[4], seeds=[0], reference=False)
    real = sweep_mod.solve

    def interrupted_tabu(qubo, remove, solver, k, **kwargs):
        states = real(qubo, remove, solver, k, **kwargs)
        if solver == "swap-tabu":
            states.info["interrupted"] = True
        return states

    monkeypatch.setattr(sweep_mod, "solve", interrupted_tabu)
    out = tmp_path / "s.jsonl"
    with pytest.raises(KeyboardInterrupt, match="swap-tabu"):
        run_sweep(cells, out)
    assert [r["cell"]["solver"] for r in read_records(out)] == ["enumerate"]
    monkeypatch.setattr(sweep_mod, "solve", real)
    assert len(run_sweep(cells, out)) == 2  # a rerun solves the interrupted cell again


def test_a_torn_last_line_is_skipped_and_its_cell_recomputed(tmp_path, counted):
    cells = make_grid(["synthetic:10:3"], ["enumerate"], removes=[4], seeds=[0], reference=False)
    out = tmp_path / "s.jsonl"
    run_sweep(cells, out)
    text = out.read_text()
    out.write_text(text[: len(text) // 2])  # a crash in the middle of the write
    with pytest.warns(UserWarning, match="not valid JSON"):
        assert read_records(out) == []
    with pytest.warns(UserWarning):
        run_sweep(cells, out)
    assert counted[cells[0].key] == 2


def test_a_torn_sweep_file_stays_resumable_over_reruns(tmp_path, counted):
    """Issue 38, case 8: with the last record cut by a killed write, the first rerun appended its record onto the
    torn line and the second refused the whole file as "not a sweep file"."""
    cells = make_grid(["synthetic:10:3"], ["enumerate", "swap-tabu"], removes=[4], seeds=[0], reference=False)
    out = tmp_path / "s.jsonl"
    run_sweep(cells, out)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text(lines[0] + lines[1][: len(lines[1]) // 2])  # the second record cut mid-write
    with pytest.warns(UserWarning, match="torn last line"):
        run_sweep(cells, out)
    assert all(json.loads(line) for line in out.read_text().splitlines())  # every line a whole record
    assert len(run_sweep(cells, out)) == 2  # the second rerun resumes: nothing refused, nothing recomputed
    assert sorted(counted.values()) == [1, 2]
    # a file an earlier CBO damaged (a record glued onto the torn one) resumes too, keeping the glued record
    first, second = out.read_text().splitlines()
    out.write_text(first[:40] + second + "\n")
    with pytest.warns(UserWarning, match="record after the torn one is kept"):
        assert len(run_sweep(cells, out)) == 2
    assert sorted(counted.values()) == [2, 2]  # the torn record's cell ran again, the glued one did not
    # a whole record whose newline the kill cut is kept, and the next one starts on a new line
    out.write_text(first + "\n" + second)
    run_sweep(cells, out)
    assert out.read_text() == first + "\n" + second + "\n"


def test_error_cells_are_finished_unless_retried(tmp_path, counted):
    cells = make_grid(["synthetic:6:0"], ["enumerate"], removes=[9], seeds=[0], reference=False)
    out = tmp_path / "s.jsonl"
    (rec,) = run_sweep(cells, out)
    assert rec["status"] == "error" and "9" in rec["error"]
    (row,) = results_table([rec])
    assert row["status"] == "error" and row["gap"] is None
    run_sweep(cells, out)
    assert counted[cells[0].key] == 1
    run_sweep(cells, out, retry_failed=True)
    assert counted[cells[0].key] == 2


def test_best_known_reference_without_the_exact_one(tmp_path):
    cells = make_grid(["synthetic:16:4"], ["swap-tabu", "enumerate"], removes=[5], seeds=[0], reference=False, k=3)
    rows = results_table(run_sweep(cells, tmp_path / "s.jsonl"))
    assert {r["reference"] for r in rows} == {"best-known"}
    exact = _brute(load_instance("synthetic:16:4"), 5, 3)
    for r in rows:
        # the best known are the 3 distinct lowest states found by the two cells: the enumerator's
        assert r["reference_energy"] == pytest.approx(exact[0], rel=1e-12)


def test_solver_row_by_hand():
    ref = [1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]  # only the first 10 count
    row = solver_row([1.5, 2.0, 9.0, 10.0, 12.0], ref, reference="exact", wall_time_s=0.5, solver="x")
    assert row["gap"] == 0.5 and row["rel_gap"] == 0.5 and row["best_energy"] == 1.5
    assert row["top10_recall"] == 0.3  # 1.5, 2.0 and 9.0 are at or below the 10th reference energy (9.0)
    assert row["distinct_states"] == 5 and row["solver"] == "x" and row["wall_time_s"] == 0.5
    empty = solver_row([], ref, reference="exact")
    assert empty["top10_recall"] == 0.0 and empty["gap"] is None


def test_grid_validation_and_instances(tmp_path):
    with pytest.raises(UnknownSolverError):
        make_grid(INSTANCES, ["no-such-solver"], removes=[2])
    with pytest.raises(CBOError, match="not in the sweep"):
        make_grid(INSTANCES, ["enumerate"], removes=[2], options={"sa": {"num_reads": 3}})
    with pytest.raises(InvalidQUBOError, match="synthetic:N:SEED"):
        load_instance("synthetic:x")
    q = load_instance("synthetic:8:2:heavy")
    assert q.n == 8 and q.metadata["heavy_ends"]
    path = q.save(tmp_path / "q.cboq")
    (ref, run) = make_grid([str(path)], ["enumerate"], removes=[2])
    assert run.instance_id.startswith("sha256:")
    # a changed file is a different cell
    load_instance("synthetic:8:3").save(path)
    (_, run2) = make_grid([str(path)], ["enumerate"], removes=[2])
    assert run2.key != run.key


def test_write_table_formats(tmp_path):
    rows = [solver_row([1.0], [1.0], reference="exact", instance="a", solver="s")]
    csv_text = write_table(rows, tmp_path / "t.csv").read_text().splitlines()
    assert csv_text[0].split(",") == COLUMNS
    md = write_table(rows, tmp_path / "t.md").read_text()
    assert md.startswith("| instance |")
    line = json.loads(write_table(rows, tmp_path / "t.jsonl").read_text())
    assert list(line) == COLUMNS


def test_cli_sweep_resumes(tmp_path):
    from typer.testing import CliRunner

    import cbo.cli.qubo_cmds  # noqa: F401  (the command modules register on the app when imported)
    import cbo.cli.sweep_cmds  # noqa: F401
    from cbo.cli import app

    out = tmp_path / "cli.jsonl"
    args = ["sweep", "-i", "synthetic:10:1", "-s", "enumerate,swap-sa", "-m", "3,4", "--seeds", "0", "--out", str(out)]
    first = CliRunner().invoke(app, args + ["--quiet"])
    assert first.exit_code == 0, first.output
    n = len(read_records(out))
    assert n == 2 * (1 + 2)
    again = CliRunner().invoke(app, args + ["--table", str(tmp_path / "t.md")])
    assert again.exit_code == 0, again.output
    assert len(read_records(out)) == n and "sweep: 6 cells" in again.output
    assert (tmp_path / "cli.csv").exists() and (tmp_path / "t.md").exists()
    bad = CliRunner().invoke(app, ["sweep", "-i", "synthetic:10:1", "-s", "enumerate", "-m", "x", "--out", str(out)])
    assert bad.exit_code == 2 and "integers" in bad.output


def test_cli_sweep_failures_and_foreign_files(tmp_path):
    """Issue 27: a sweep whose every cell fails exits 1 (it exited 0); names print as given (rich turned
    "synthetic:abc:1" into an emoji); an --out file `cbo sweep` did not write is refused before any work (it
    appended JSON lines to a user's prose file)."""
    from typer.testing import CliRunner

    import cbo.cli.sweep_cmds  # noqa: F401
    from cbo.cli import app

    out = tmp_path / "fail.jsonl"
    res = CliRunner().invoke(app, ["sweep", "-i", "synthetic:8:0", "-s", "sa", "-m", "2", "--out", str(out),
                                   "--no-reference", "-o", "sa:num_reads=0"], env={"COLUMNS": "300"})  # fmt: skip
    assert res.exit_code == 1 and "every one of the 1 cells failed" in res.output, res.output
    res = CliRunner().invoke(app, ["sweep", "-i", "synthetic:abc:1", "-s", "sa", "-m", "2", "--out", str(out)])
    assert "synthetic:abc:1" in res.output and "\N{INPUT SYMBOL FOR LATIN LETTERS}" not in res.output, res.output
    notes = tmp_path / "notes.txt"
    notes.write_text("My notes about the sweep.\nSecond line.\n")
    res = CliRunner().invoke(app, ["sweep", "-i", "synthetic:8:0", "-s", "sa", "-m", "2", "--out", str(notes)])
    assert res.exit_code == 2 and "is not a sweep file" in " ".join(res.output.split()), res.output
    assert notes.read_text() == "My notes about the sweep.\nSecond line.\n"
    with pytest.raises(CBOError, match="is not a sweep file"):
        run_sweep([], notes)


@pytest.mark.slow
def test_ray_sweep_matches_local_and_resumes(ray_local, tmp_path):
    cells = make_grid(INSTANCES, ["enumerate", "swap-sa"], removes=[4], seeds=[0, 1])
    local = {r["key"]: r for r in run_sweep(cells, tmp_path / "local.jsonl")}
    out = tmp_path / "ray.jsonl"
    seen = []
    with pytest.raises(RuntimeError, match="interrupted"):
        run_sweep(cells, out, backend="ray", on_cell=stop_after(2, seen))
    first = read_records(out)
    assert 2 <= len(first) <= len(cells)  # cells already finished on the workers are kept too
    records = run_sweep(cells, out, backend="ray")
    keys = [r["key"] for r in read_records(out)]
    assert sorted(keys) == sorted(c.key for c in cells)  # each cell recorded once
    for r in records:
        np.testing.assert_allclose(r["energies"], local[r["key"]]["energies"], rtol=1e-12)


def test_cli_sweep_ctrl_c_keeps_the_finished_cells(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import cbo.cli.qubo_cmds  # noqa: F401  (with two command groups the app takes the command name)
    import cbo.cli.sweep_cmds  # noqa: F401
    from cbo.cli import app

    real = sweep_mod.solve

    def interrupted_sa(qubo, remove, solver, k, **kwargs):
        states = real(qubo, remove, solver, k, **kwargs)
        states.info["interrupted"] = solver == "swap-sa"
        return states

    monkeypatch.setattr(sweep_mod, "solve", interrupted_sa)
    out = tmp_path / "cli.jsonl"
    args = ["sweep", "-i", "synthetic:10:1", "-s", "swap-sa", "-m", "3", "--out", str(out), "--quiet"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 130
    assert "the 1 finished cells are kept" in " ".join(res.output.split()) and len(read_records(out)) == 1
