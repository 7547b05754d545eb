"""The ``cbo`` command. Each command group lives in its own module and registers on ``app``."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="cbo",
    help="Compress LLMs by removing blocks chosen with constrained binary optimization.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    # each module adds its commands to `app` on import
    from cbo.cli import (
        demo_cmds,  # noqa: F401
        eval_cmds,  # noqa: F401
        model_cmds,  # noqa: F401
        qubo_cmds,  # noqa: F401
        setup_cmds,  # noqa: F401
        sweep_cmds,  # noqa: F401
        width_cmds,  # noqa: F401
    )


def main() -> None:
    """Entry point of the ``cbo`` console script."""
    _register()
    app()
