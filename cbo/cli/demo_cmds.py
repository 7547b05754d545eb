"""`cbo demo`: the main job on the default model and text, as `make demo` runs it."""

from __future__ import annotations

from pathlib import Path

import typer

from cbo.cli import app
from cbo.cli.common import OVERWRITE_HELP, claim_outputs, console, fail, plain
from cbo.errors import CBOError
from cbo.pipeline.options import DEFAULT_REFINE, DEFAULT_SELECT


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-output"), "--out", help="Where the pruned model and report.json go."),
    remove: int = typer.Option(8, "--remove", "-m", help="Blocks to remove (of 30)."),
    validate: int = typer.Option(10, "--validate", "-v", help="Low-energy states measured on validation text."),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
) -> None:
    """Prune 8 of the 30 blocks of SmolLM2-135M on Austen's novels (estimate, refine, validate the top 10, race
    them on fresh windows), save the model."""
    from cbo.pipeline import prune_depth

    console.print(
        f"[bold]CBO demo[/]: remove {remove} of the 30 blocks of SmolLM2-135M-Instruct, "
        f"calibrated on Austen's novels: the QUBO is refined with {DEFAULT_REFINE:g} FPE of measurements, the "
        f"{validate} best states are validated on held-out text and raced on up to {DEFAULT_SELECT} fresh windows "
        "of it (the default pipeline)."
    )
    try:
        with claim_outputs(folders=(out,), inputs=("smollm2-135m",), overwrite=overwrite):
            report = prune_depth("smollm2-135m", remove=remove, top_k=10, validate=validate, progress=True)
            report.save_model(out)
    except CBOError as exc:
        fail(exc)
    report.print(console)
    console.print(f"charged: {report.work['total_fpe']:.0f} FPE (forward passes over one 128-token window)")
    t = report.timings
    console.print("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in t.items()))
    console.print(f"saved the pruned model, its tokenizer and report.json to {plain(out)}/")
    console.print(
        plain(f"reload it with: cbo.load_pruned({str(out)!r}) or AutoModelForCausalLM.from_pretrained({str(out)!r})")
    )
