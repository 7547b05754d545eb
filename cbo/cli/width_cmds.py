"""`cbo compress` (depth and width pruning with a before/after report), `cbo widths`, `cbo width-scores`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from cbo.cli import app
from cbo.cli.common import (
    BATCH_HELP,
    CALIBRATION_HELP,
    OVERWRITE_HELP,
    SEQ_LEN_HELP,
    claim_outputs,
    console,
    fail,
    parse_options,
    plain,
)
from cbo.cli.tables import print_table
from cbo.errors import CBOError
from cbo.pipeline.options import DEFAULT_ESTIMATOR


@app.command()
def compress(
    ctx: typer.Context,
    model: str = typer.Argument("smollm2-135m", help="Model name or folder (default: the installed SmolLM2-135M)."),
    ratio: float = typer.Option(
        0.3,
        "--ratio",
        "-r",
        help="Fraction of the parameters to remove, in (0, 1), of --ratio-of's (the report shows both).",
    ),
    ratio_of: str = typer.Option(
        "blocks",
        "--ratio-of",
        help="What --ratio is a fraction of: blocks (the decoder layers, default) or model (all).",
    ),
    width: Optional[str] = typer.Option(
        None,
        "--width",
        "-w",
        help="Width score (see `cbo width-scores`): taylor (one-shot default), amp (MoP default).",
    ),
    scheduler: str = typer.Option("oneshot", "--scheduler", "-s", help="oneshot or mop (Mixture of Pruners)."),
    criterion: str = typer.Option("kl", "--criterion", help="MoP path criterion: cosine, kl, ppl, random."),
    depth: str = typer.Option(
        "none", "--depth", "-d", help="Depth part: none, cbo (QUBO), antepenultimate (MoP's rule)."
    ),
    depth_share: float = typer.Option(0.5, help="One-shot with depth: share of the budget removed as whole layers."),
    estimator: str = typer.Option(
        DEFAULT_ESTIMATOR, "--estimator", "-e", help="Hessian estimator of --depth cbo (`cbo estimators` lists them)."
    ),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Save the compressed model and report.json here."),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
    text: Optional[str] = typer.Option(None, "--text", help="Text file/folder/.jsonl (default: the Austen novels)."),
    seq_len: int = typer.Option(128, help=SEQ_LEN_HELP),
    n_calibration: int = typer.Option(32, help=CALIBRATION_HELP),
    n_validation: int = typer.Option(16, help="Control windows (MoP criterion, calibration selection)."),
    n_test: int = typer.Option(32, help="Held-out test windows for the report."),
    gqa: str = typer.Option("group", help="Grouped-query units: group (whole KV groups) or query (heads per group)."),
    gamma: Optional[float] = typer.Option(None, help="MLP-vs-attention pruning ratio (default: parameter ratio)."),
    round_to: int = typer.Option(8, help="Kept MLP widths are multiples of this."),
    allocation: Optional[str] = typer.Option(
        None, help="global (rank all layers together) or uniform (same fraction per layer); default per score."
    ),
    select_calibration: int = typer.Option(0, help="One-shot: candidate calibration batches for KL selection."),
    recovery_steps: int = typer.Option(0, help="MoP: recovery fine-tune steps per candidate."),
    final_recovery_steps: int = typer.Option(0, help="MoP: recovery fine-tune steps at the end."),
    recovery: str = typer.Option("lora", help="Recovery fine-tune: lora (peft) or full."),
    option: list[str] = typer.Option([], "--option", help="Score option name=value (repeatable), e.g. p=0.3."),
    batch_size: int = typer.Option(4, help=BATCH_HELP),
    speed: bool = typer.Option(True, "--speed/--no-speed", help="Measure prefill/decode tokens/s before and after."),
    seed: int = typer.Option(0, help="Seed (data windows, random criterion, recovery)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the report as JSON here."),
) -> None:
    """Compress a model by width (and optionally depth) pruning; print parameters, PPL, KL and speed."""
    from cbo.pipeline.compression import compress as run

    # the options are named as compress() names them, except --json (here), --speed and --option
    options = dict(ctx.params)
    del options["json_out"], options["overwrite"]
    options["measure_speed"] = options.pop("speed")
    try:
        with claim_outputs((json_out,), (out,), inputs=(model,), texts=(text,), overwrite=overwrite):
            options["score_options"] = parse_options(options.pop("option"), "score option")
            report = run(tokenizer=None, progress=True, **options)
            if json_out is not None:
                report.save(json_out)
    except CBOError as exc:
        fail(exc)
    report.print(console)
    if out is not None:
        console.print(f"saved to {plain(out)} (load with cbo.load_pruned)")


@app.command()
def widths(folder: Path = typer.Argument(..., help="A saved (pruned) model folder.")) -> None:
    """Per-layer head counts and MLP widths of a saved model."""
    from cbo.model.structures import layer_widths
    from cbo.surgery.io import load_pruned

    try:
        model = load_pruned(folder)
        rows = layer_widths(model)
    except CBOError as exc:
        fail(exc)
    removed = getattr(model.config, "cbo_removed_layers", None) or []
    original = getattr(model.config, "cbo_original_layers", None) or list(range(len(rows)))
    table = Table(title=plain(f"{folder} ({len(rows)} layers; removed: {removed or 'none'})"))
    for col in ("layer", "original", "heads", "kv heads", "head dim", "MLP width"):
        table.add_column(col, justify="right")
    for i, w in enumerate(rows):
        table.add_row(
            str(i), str(original[i]), str(w["heads"]), str(w["kv_heads"]), str(w["head_dim"]), str(w["intermediate"])
        )
    console.print(table)


@app.command("width-scores")
def width_scores() -> None:
    """List the registered width scores and their options."""
    import dataclasses

    from cbo.width.scores import SCORES

    def options(cls: type) -> str:
        return ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(cls.Options))

    rows = ((name, ", ".join(cls.aliases), options(cls), cls.description) for name, cls in SCORES.items())
    print_table("width scores", ("name", "aliases", "options", "description"), rows)
