"""What solve says about requests it cannot meet as asked (issue 38): ``k`` is capped at the number of removal sets
and a ``k`` whose states cannot fit in memory is refused before any allocation (case 3: ``--top 1000000000`` on 12
blocks raised a raw 14.9 GiB allocation error, or was killed by the OOM killer); an enumeration that cannot finish
is said before it starts; the enumeration's bar ends at the tasks done."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

from cbo.errors import SolverError, SolverOptionError
from cbo.qubo.instances import random_block_qubo
from cbo.solvers import solve

HUGE = 1_000_000_000


@pytest.fixture(scope="module")
def qubo():
    return random_block_qubo(12, seed=3)


@pytest.mark.parametrize("solver", ["auto", "enumerate", "swap-sa"])
def test_k_beyond_the_feasible_states_is_capped_and_said(qubo, solver):
    states = solve(qubo, 3, solver, HUGE, seed=0)
    assert len(states) == math.comb(12, 3) == 220
    assert "k=1000000000 is more than the 220 ways to remove 3 of these 12 blocks" in states.info["k_capped"]
    assert states.options["k"] == 220 and np.all(np.diff(states.energies) >= 0)
    kept = solve(qubo, 3, solver, 165, seed=0, keep=[0])
    assert "k_capped" not in kept.info and len(kept) == math.comb(11, 3)  # 165 exist with block 0 kept
    assert "C(11, 3) with the keep/force lists" in solve(qubo, 3, solver, 500, seed=0, keep=[0]).info["k_capped"]


def test_k_states_that_cannot_fit_in_memory_are_refused_before_the_solve():
    big = random_block_qubo(300, seed=1)
    with pytest.raises(
        SolverOptionError, match=r"k=1000000000000 ranked states of 300 blocks needs about .* GiB.*--top"
    ):
        solve(big, 150, "swap-sa", 10**12, seed=0)


def test_cbo_solve_says_it_capped_top(qubo, tmp_path):
    from cbo.cli import app, register_commands

    register_commands()
    path = qubo.save(tmp_path / "q.cboq")
    res = CliRunner().invoke(app, ["solve", str(path), "--remove", "3", "--top", str(HUGE), "--solver", "enumerate"])
    assert res.exit_code == 0, res.output
    assert "returning at most 220" in " ".join(res.output.split())


def test_an_enumeration_that_cannot_finish_is_said_before_it_starts(tmp_path, monkeypatch):
    """`cbo solve --remove 150 --solver enumerate` on 300 blocks started with no word that C(300, 150) cannot finish;
    the warning is one plain line, without Python's `file.py:line: UserWarning:` prefix."""
    import cbo.solvers.enumerate.solver as enumerator
    from cbo.cli import app, register_commands

    def never_finishes(problem, options):
        raise SolverError("stopped by the test")  # the test only needs what was said before the search

    monkeypatch.setattr(enumerator, "enumerate_locally", never_finishes)
    register_commands()
    path = random_block_qubo(300, seed=1).save(tmp_path / "big.cboq")
    res = CliRunner().invoke(app, ["solve", str(path), "--remove", "150", "--solver", "enumerate"])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "stopped by the test" in res.output, res.output
    assert "warning: exact enumeration of C(300, 150) = 9.4e+88 removal sets may never finish" in text
    assert "--time-limit" in text and ".py:" not in text and text.count("may never finish") == 1
    with pytest.warns(UserWarning, match="may never finish"), pytest.raises(SolverError):
        solve(random_block_qubo(300, seed=1), 150, "enumerate", 5, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a time limit, or a space small enough: no warning
        with pytest.raises(SolverError):
            solve(random_block_qubo(300, seed=1), 150, "enumerate", 5, seed=0, time_limit=1.0)
        monkeypatch.undo()
        solve(random_block_qubo(20, seed=1), 10, "enumerate", 5, seed=0)


def test_the_enumeration_bar_ends_at_its_true_end(capfd):
    """Bounds close the last tasks in one batch: the bar stopped at "4/2300 tasks" and stayed there."""
    states = solve(random_block_qubo(30, seed=1), 8, "enumerate", 5, seed=0, progress=True)
    assert states.exact and states.info["tasks_done"] == 2300
    assert "2300/2300 tasks" in capfd.readouterr().err
