"""`cbo solve` as a user sees it: keep/force lists added to the file's, the removed blocks listed in full, no
progress line left above the table, output paths checked before the work."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from typer.testing import CliRunner

from cbo import BlockQUBO
from cbo.cli import app, main  # noqa: F401  (main registers the command modules)
from cbo.qubo.instances import fisher_block_qubo, random_block_qubo

ROOT = Path(__file__).resolve().parents[2]


def _register() -> None:
    import cbo.cli.qubo_cmds  # noqa: F401


def _invoke(*args: str, columns: int = 200):
    _register()
    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})


def _removed_sets(output: str) -> list[list[int]]:
    """The removed blocks of each table row, joining the lines a wrapped cell takes."""
    rows: list[list[int]] = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) < 7:
            continue
        rank, removed = cells[1], cells[2]
        if rank.isdigit():
            rows.append([])
        if rows and removed:
            rows[-1] += [int(v) for v in removed.replace(",", " ").split()]
    return rows


def test_keep_and_force_are_added_to_the_lists_in_the_file(tmp_path):
    base = random_block_qubo(10, 0)
    path = tmp_path / "q.cboq"
    BlockQUBO(base.H, base.g, keep=[5], force=[7]).save(path)
    plain = _invoke("solve", str(path), "--remove", "3", "--solver", "enumerate")
    assert plain.exit_code == 0, plain.output
    res = _invoke("solve", str(path), "--remove", "3", "--solver", "enumerate", "--keep", "0", "--force", "2")
    assert res.exit_code == 0, res.output
    rows = _removed_sets(res.output)
    assert len(rows) == 6  # 10 blocks, 2 kept, 2 forced: one of the 6 others
    for removed in rows:
        assert 0 not in removed and 5 not in removed  # the given keep and the stored one
        assert 7 in removed and 2 in removed  # the given force and the stored one
    assert "added to the keep list stored in the file" in " ".join(_invoke("solve", "--help").output.split())


def test_a_block_both_kept_and_forced_is_an_error(tmp_path):
    path = tmp_path / "q.cboq"
    BlockQUBO(random_block_qubo(8, 0).H, keep=[1]).save(path)
    res = _invoke("solve", str(path), "--remove", "2", "--force", "1")
    assert res.exit_code == 2 and "error:" in res.output


def test_the_removed_blocks_of_large_m_are_listed_in_full(tmp_path):
    q = random_block_qubo(80, 0)
    path = tmp_path / "q80.cboq"
    q.save(path)
    out = tmp_path / "states.json"
    res = _invoke("solve", str(path), "--remove", "40", "--top", "3", "--out", str(out), columns=80)
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    from cbo import RankedStates

    states = RankedStates.load(out)
    assert _removed_sets(res.output) == [states.removed(i) for i in range(len(states))]
    assert all(len(row) == 40 for row in _removed_sets(res.output))


def test_output_paths_are_checked_before_the_work(tmp_path):
    path = tmp_path / "q.cboq"
    random_block_qubo(8, 0).save(path)
    res = _invoke("solve", str(path), "--remove", "2", "--out", str(tmp_path / "missing" / "s.json"))
    assert res.exit_code == 2 and "does not exist" in res.output
    res = _invoke("solve", str(path), "--remove", "2", "--plot", str(tmp_path))
    assert res.exit_code == 2 and "is a folder" in res.output


def _screen(raw: bytes) -> list[str]:
    """What a terminal shows: escape sequences dropped, carriage returns overwriting the line."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode("utf-8", "replace"))
    lines = []
    for line in text.replace("\r\n", "\n").split("\n"):
        shown: list[str] = []
        col = 0
        for ch in line:
            if ch == "\r":
                col = 0
                continue
            if col < len(shown):
                shown[col] = ch
            else:
                shown.append(ch)
            col += 1
        lines.append("".join(shown).rstrip())
    return lines


def _run_in_terminal(args: list[str], columns: int = 70) -> tuple[int, list[str]]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm", OMP_NUM_THREADS="1")
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from cbo.cli import main; main()", *args], stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), _screen(b"".join(chunks))


def test_no_progress_line_stays_above_the_result_table(tmp_path):
    path = tmp_path / "fisher.cboq"
    fisher_block_qubo(80, 0, samples=128).save(path)
    for strategy in ("relaxation", "lexicographic"):
        status, screen = _run_in_terminal(["solve", str(path), "--remove", "32", "--solver", "enumerate",
                                           "--time-limit", "4", "-o", f"strategy={strategy}"])  # fmt: skip
        assert status == 0, "\n".join(screen)
        assert any("rank" in line for line in screen)
        assert not [line for line in screen if "enumerate C(" in line], "\n".join(screen)
        assert max(len(line) for line in screen) <= 70


def test_interrupted_json_run_still_prints_its_states(tmp_path, monkeypatch):
    """--json after an interrupt: the states as JSON on stdout, the note on stderr, status 130."""
    import cbo.solvers.base as base

    real = base.Problem.__post_init__

    def interrupted(self):
        real(self)
        self.stop.set()  # as if Ctrl-C came at once: every solver returns at its first check

    monkeypatch.setattr(base.Problem, "__post_init__", interrupted)
    path = tmp_path / "q.cboq"
    random_block_qubo(40, 1).save(path)
    res = _invoke("solve", str(path), "--remove", "10", "--solver", "swap-sa", "--json")
    assert res.exit_code == 130, res.output
    assert "interrupted" in res.output
    start = res.output.index("{")
    import json

    data = json.loads(res.output[start : res.output.rindex("}") + 1])
    assert data["info"]["interrupted"] is True and all(len(r) == 10 for r in data["removed"])


def test_fewer_states_than_asked_come_with_a_note(tmp_path):
    """Issue 27: `cbo solve -k 5 -s tabu` returned 1 state with no note (its reads converge on one state). Every
    solver returns k states or says why fewer came back; an exact solver on a small instance says the
    constraints admit no more only when that is so."""
    from cbo import solve
    from cbo.solvers import available

    if not available()["tabu"].ok:
        import pytest

        pytest.skip("tabu unavailable here")
    q = random_block_qubo(12, 0)
    states = solve(q, 3, "tabu", k=5, seed=0, num_reads=1)
    assert len(states) == 5 or "of the 5 asked for" in states.info["fewer_states"]
    path = tmp_path / "q.cboq"
    q.save(path)
    res = _invoke("solve", str(path), "--remove", "3", "-k", "5", "-s", "tabu", "-o", "num_reads=1")
    assert res.exit_code == 0, res.output
    assert len(_removed_sets(res.output)) == 5 or "of the 5 asked for" in " ".join(res.output.split())
    assert "fewer_states" not in solve(q, 3, "enumerate", k=5).info  # all 5 exist and came back
    small = solve(BlockQUBO(q.H[:4, :4]), 3, "enumerate", k=10)  # only 4 states exist: nothing to explain
    assert len(small) == 4 and "fewer_states" not in small.info


def test_the_solver_listing_says_which_solvers_are_python_only():
    """Issue 27: `cbo solvers` listed dimod as usable, but `-s dimod` works only from Python."""
    from cbo.solvers import available

    res = _invoke("solvers", columns=300)
    assert res.exit_code == 0, res.output
    if available()["dimod"].ok:
        line = next(line for line in res.output.splitlines() if "│ dimod" in line)
        assert "Python only" in line and "cbo solve -s" in line


def test_the_enumeration_bar_shows_no_estimate_of_the_time_left(capsys):
    """Issue 27: the enumerator's first seconds showed an ETA of about two hours ("0/2300 … 1:54:22") for a solve
    of seconds: its tasks differ widely in size (and the first pays the compilation), so the bar shows the tasks
    done and the elapsed time, not tqdm's rate-based estimate."""
    from cbo import solve

    q = fisher_block_qubo(40, 0, samples=64)
    for strategy in ("lexicographic", "relaxation"):
        solve(q, 12, "enumerate", k=3, progress=True, strategy=strategy, time_limit=30)
        shown = [line for line in re.split(r"[\r\n]", capsys.readouterr().err) if "enumerate C(40,12)" in line]
        assert shown, strategy
        assert not [line for line in shown if re.search(r"<\s*(\?|\d+:\d\d)", line) or "it/s" in line], shown
