"""`cbo demo`: the main job on the default model and text, as `make demo` runs it."""

from __future__ import annotations

from pathlib import Path

import typer

from cbo.cli import app
from cbo.cli.common import console, fail
from cbo.errors import CBOError


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-output"), "--out", help="Where the pruned model and report.json go."),
    remove: int = typer.Option(8, "--remove", "-m", help="Blocks to remove (of 30)."),
    validate: int = typer.Option(10, "--validate", "-v", help="Low-energy states measured on validation text."),
) -> None:
    """Prune 8 of the 30 blocks of SmolLM2-135M on Austen's novels, validate the top 10, save the model."""
    from cbo.pipeline import prune_depth

    console.print(
        f"[bold]CBO demo[/]: remove {remove} of the 30 blocks of SmolLM2-135M-Instruct, "
        f"calibrated on Austen's novels; the {validate} lowest-energy states are validated on held-out text."
    )
    try:
        report = prune_depth("smollm2-135m", remove=remove, top_k=10, validate=validate, progress=True)
        report.save_model(out)
    except CBOError as exc:
        fail(exc)
    report.print(console)
    t = report.timings
    console.print("time: " + ", ".join(f"{k} {v:.1f}s" for k, v in t.items()))
    console.print(f"saved the pruned model, its tokenizer and report.json to {out}/")
    console.print(
        f"reload it with: cbo.load_pruned({str(out)!r}) or AutoModelForCausalLM.from_pretrained({str(out)!r})"
    )
