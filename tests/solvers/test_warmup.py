"""`cbo setup` compiles the solvers' kernels, so the first exact solve does not pause to compile without a word."""

from __future__ import annotations

from typer.testing import CliRunner

from cbo.solvers.warmup import compile_kernels


def test_compile_kernels_runs_every_kernel_path():
    assert compile_kernels() >= 0.0


def test_cbo_setup_compiles_the_kernels_and_says_so():
    from cbo.cli import app, register_commands

    register_commands()
    res = CliRunner().invoke(app, ["setup", "--no-model", "--no-text", "--no-tasks"])
    assert res.exit_code == 0, res.output
    assert "compiling the solvers' kernels" in res.output and "solver kernels: compiled and cached" in res.output
    res = CliRunner().invoke(app, ["setup", "--no-model", "--no-text", "--no-tasks", "--no-compile"])
    assert res.exit_code == 0 and "kernels" not in res.output
