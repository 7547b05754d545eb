"""The ``cbo`` command. Each command group lives in its own module and registers on ``app`` when imported;
``common.py`` holds what they share (consoles, errors, option parsers)."""

from __future__ import annotations

import importlib
import os
import signal
from typing import Any

import typer

app = typer.Typer(
    name="cbo",
    help="Compress LLMs by removing blocks chosen with constrained binary optimization.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def run_command(ctx: typer.Context) -> None:
    # every command: warnings as one plain line each (cbo.cli.messages)
    from cbo.cli.messages import show_warnings_plainly

    show_warnings_plainly(ctx)


# the modules whose import adds their commands to `app` (imported by name: they import `app` from here)
COMMAND_MODULES = (
    "cbo.cli.demo_cmds",
    "cbo.cli.eval_cmds",
    "cbo.cli.heal_cmds",
    "cbo.cli.model_cmds",
    "cbo.cli.qubo_cmds",
    "cbo.cli.setup_cmds",
    "cbo.cli.sweep_cmds",
    "cbo.cli.width_cmds",
)


def register_commands() -> None:
    """Import every command module (each adds its commands to ``app``)."""
    for module in COMMAND_MODULES:
        importlib.import_module(module)


def stop_on_sigterm() -> None:
    """End this process on SIGTERM (``kill``, a scheduler's stop) as on Ctrl-C: a KeyboardInterrupt unwinds the
    command, so its staging folders and output locks are removed and it says what it kept. A process forked from
    this one dies of SIGTERM as usual."""
    owner = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main() -> None:
    """Entry point of the ``cbo`` console script."""
    register_commands()
    stop_on_sigterm()
    app()
