"""Ctrl-C: every solver stops promptly and returns its best states so far, marked interrupted.

In process: ``solve()`` turns the first SIGINT into the problem's stop event (a second raises KeyboardInterrupt).
As a user meets it: ``cbo solve`` in a subprocess gets SIGINT while each solver runs, prints the best states so
far with the "interrupted" line and exits with status 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from cbo import solve
from cbo.instances import fisher_block_qubo, random_block_qubo
from cbo.solvers import Solver, SolverOutput, available
from cbo.solvers.interrupt import stop_on_interrupt

ROOT = Path(__file__).resolve().parents[2]


class _Interrupting(Solver):
    """A solver that gets Ctrl-C while it runs (``presses`` times) and returns one state unless told not to."""

    name = "interrupting-test-solver"
    presses = 1
    found = True

    @dataclass
    class Options:
        pass

    def run(self, problem, options):
        self.saw_stop = []
        for _ in range(self.presses):
            signal.raise_signal(signal.SIGINT)
            self.saw_stop.append(problem.interrupted)
        self.time_left = problem.time_left()
        Y = np.zeros((1 if self.found else 0, problem.n_free), dtype=np.uint8)
        Y[:, : problem.r] = 1
        return SolverOutput(problem.expand(Y), exact=False, info={"timed_out": True})


def test_first_ctrl_c_sets_the_stop_event_and_the_result_is_marked():
    solver = _Interrupting()
    res = solve(random_block_qubo(6, 0), 2, solver, k=3, time_limit=100.0)
    assert solver.saw_stop == [True] and solver.time_left == 0.0
    assert res.info["interrupted"] is True and res.info["timed_out"] is False and not res.exact
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_second_ctrl_c_raises_and_nothing_found_raises():
    twice = _Interrupting()
    twice.presses = 2
    with pytest.raises(KeyboardInterrupt):
        solve(random_block_qubo(6, 0), 2, twice)
    empty = _Interrupting()
    empty.found = False
    with pytest.raises(KeyboardInterrupt, match="before it found a feasible state"):
        solve(random_block_qubo(6, 0), 2, empty)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_handler_only_over_the_default_one():
    import threading

    event = threading.Event()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_on_interrupt(event) as installed:
            assert not installed and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    with stop_on_interrupt(event) as installed:
        assert installed
    assert signal.getsignal(signal.SIGINT) is previous


# --------------------------------------------------------------------------- `cbo solve` in a subprocess
# every case runs far longer than the test waits: (solver, instance, M, options)
CASES = {
    "sa": ("q300", 100, ["-o", "num_reads=1000000"]),
    "tabu": ("q300", 100, ["-o", "num_reads=100000"]),
    "swap-sa": ("q300", 100, ["-o", "restarts=1000000", "-o", "patience=0"]),
    "qaoa": ("q16", 5, ["-o", "maxiter=100000", "-o", "shots=8192"]),
    "enumerate": ("fisher80", 32, []),
    "cpsat": ("q80", 32, ["-o", "workers=1", "-o", "max_time=1000"]),
}
# modules imported before "ready" is printed, so that the wait below covers the solver's work, not imports
IMPORTS = "import cbo.cli, cbo.solvers.ocean, cbo.solvers.swap, cbo.solvers.enumerate.solver, cbo.solvers.cpsat"


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sigint")
    paths = {}
    for name, q in (
        ("q300", random_block_qubo(300, 0)),
        ("q16", random_block_qubo(16, 0)),
        ("q80", random_block_qubo(80, 0)),
        ("fisher80", fisher_block_qubo(80, 0, samples=32)),
    ):
        paths[name] = folder / f"{name}.cboq"
        q.save(paths[name])
    return paths


def interrupt_cli(args: list[str], wait: float) -> tuple[int, str, str, float]:
    """Run ``cbo ARGS``, send SIGINT ``wait`` s after its imports; (status, stdout, stderr, seconds to exit)."""
    code = f"{IMPORTS}; print('ready', flush=True); from cbo.cli import main; main()"
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200", OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(wait)
        assert proc.poll() is None, "the solver finished before it was interrupted"
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
        return proc.returncode, out, err, time.perf_counter() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.slow
@pytest.mark.parametrize("solver", list(CASES))
def test_cbo_solve_prints_the_best_so_far_and_exits_130(solver, instances):
    if not available()[solver].ok:
        pytest.skip(f"{solver} unavailable here")
    name, M, options = CASES[solver]
    wait = 12.0 if solver == "qaoa" else 6.0  # QAOA builds and transpiles its circuit first
    status, out, err, seconds = interrupt_cli(["solve", str(instances[name]), "--remove", str(M), "--solver", solver,
                                               "--top", "5", *options], wait)  # fmt: skip
    assert status == 130, (status, out[-2000:], err[-3000:])
    assert "interrupted: these are the best states found so far." in out
    assert "rank" in out and "energy" in out  # the table of the best states so far
    assert "Exception ignored" not in err and "Traceback" not in err
    assert seconds < 30, f"{solver} took {seconds:.1f} s to stop after Ctrl-C"
