"""`cbo setup`: install the default model and text into CBO_HOME."""

from __future__ import annotations

import typer

from cbo.cli import app


@app.command("setup")
def setup(
    model: bool = typer.Option(True, "--model/--no-model", help="Install the default model (SmolLM2-135M)."),
    text: bool = typer.Option(True, "--text/--no-text", help="Install the default text (six Austen novels)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the final folders."),
) -> None:
    """Install the default model and text (idempotent; what `make setup` runs)."""
    from cbo.assets import ensure_default_model, ensure_default_text
    from cbo.errors import CBOError

    try:
        if model:
            typer.echo(f"default model: {ensure_default_model(progress=not quiet)}")
        if text:
            typer.echo(f"default text:  {ensure_default_text(progress=not quiet)}")
    except CBOError as exc:
        typer.echo(f"setup failed: {exc}", err=True)
        raise typer.Exit(1) from exc
