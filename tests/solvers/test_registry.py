"""The solver registry: built-ins load lazily, names and aliases resolve, and a new solver needs only its
own class and its registration to be solved with and to pass the shared battery."""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
import test_battery

import cbo.solvers.base as base
from cbo.errors import SolverError, SolverOptionError, UnknownSolverError
from cbo.qubo.instances import random_block_qubo
from cbo.registry import Registry
from cbo.solvers import available, get, names, register, solve


class BruteForce(base.Solver):
    """Every state of the free blocks, by itertools: a complete solver in a dozen lines."""

    name = "brute-force-probe"
    aliases = ("probe",)
    exact = True
    description = "itertools over every state (a test solver)"

    @dataclass
    class Options:
        limit: int = 10**6

        def validate(self) -> None:
            if self.limit < 1:
                raise SolverOptionError(f"limit must be >= 1, got {self.limit!r}.")

    def run(self, problem: base.Problem, options: Options) -> base.SolverOutput:
        combos = list(itertools.islice(itertools.combinations(range(problem.n_free), problem.r), options.limit))
        Y = np.zeros((len(combos), problem.n_free), dtype=np.uint8)
        for row, removed in enumerate(combos):
            Y[row, list(removed)] = 1
        return base.SolverOutput(problem.expand(Y), exact=len(combos) < options.limit)


@pytest.fixture
def own_registry(monkeypatch):
    """A copy of the solver registry for the test, so that a registered test solver does not outlive it."""
    copy = Registry("solver", error=UnknownSolverError, option_error=SolverOptionError)
    for _, cls in base.REGISTRY.items():
        copy.register(cls)
    monkeypatch.setattr(base, "REGISTRY", copy)
    return copy


def test_a_registered_solver_is_solved_with_and_passes_the_battery(own_registry):
    assert "brute-force-probe" not in names()
    register(BruteForce)
    assert "brute-force-probe" in names() and get("probe") is BruteForce
    assert available()["brute-force-probe"].ok
    q = random_block_qubo(8, 0)
    assert solve(q, 3, "probe", k=2).solver == "brute-force-probe"
    with pytest.raises(SolverOptionError, match="limit"):
        solve(q, 3, "probe", limit=0)
    # the shared battery, as it runs for every registered solver (this one is not in its table)
    assert "brute-force-probe" not in test_battery.SETTINGS
    for check in (
        test_battery.test_result_shape_and_exact_energies,
        test_battery.test_keep_and_force_are_respected,
        test_battery.test_nothing_left_to_choose,
        test_battery.test_same_seed_same_result,
        test_battery.test_unknown_option_is_refused,
        test_battery.test_exact_solvers_reproduce_brute_force,
    ):
        check("brute-force-probe")


def test_unknown_names_and_options_say_what_is_valid():
    with pytest.raises(UnknownSolverError, match="unknown solver 'nope'.*'enumerate'"):
        get("nope")
    with pytest.raises(SolverOptionError, match=r"no option\(s\) \['bogus'\]; valid options: \[.*'sweeps'"):
        get("swap-sa").make_options({"bogus": 1})
    with pytest.raises(UnknownSolverError, match="dimod.Sampler"):
        solve(random_block_qubo(6, 0), 2, solver=3.5)


def test_only_solver_classes_with_a_name_register():
    with pytest.raises(SolverError, match="Solver subclasses"):
        register(object)

    class Nameless(BruteForce):
        name = ""

    with pytest.raises(SolverError, match="no name"):
        register(Nameless)


def test_built_in_solvers_load_on_first_lookup():
    # importing the package imports no solver module (and so neither numba nor any extra)
    code = (
        "import sys, cbo, cbo.solvers\n"
        "assert not any(m.startswith(('cbo.solvers.swap', 'cbo.solvers.enumerate')) for m in sys.modules)\n"
        "assert 'numba' not in sys.modules\n"
        "cbo.solvers.get('swap-sa')\n"
        "assert 'cbo.solvers.swap' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_cbo_solvers_lists_every_solver_and_names_the_extra_to_install(monkeypatch):
    from typer.testing import CliRunner

    import cbo.cli.qubo_cmds  # noqa: F401  (the command modules register on the app when imported)
    import cbo.cli.sweep_cmds  # noqa: F401
    from cbo.cli import app

    real = base.has_module
    monkeypatch.setattr(base, "has_module", lambda module: module != "ortools" and real(module))
    result = CliRunner().invoke(app, ["solvers"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in names():
        assert name in result.output
    assert "pip install 'cbo[cpsat]'" in result.output  # not eaten as console markup
