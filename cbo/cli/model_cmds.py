"""`cbo hessian` and `cbo prune`: commands on real models and text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from cbo.cli import app
from cbo.cli.common import MODEL_HELP, TEXT_HELP, console, fail, parse_blocks, parse_options, say
from cbo.errors import CBOError

ESTIMATOR_HELP = "A registered Hessian estimator (`cbo estimators` lists them with their cost)"


@app.command()
def hessian(
    model: str = typer.Argument("smollm2-135m", help=MODEL_HELP),
    output: Path = typer.Option(..., "--output", "-o", help="QUBO file to write (.cboq)."),
    text: Optional[Path] = typer.Option(None, "--text", help=TEXT_HELP),
    estimator: str = typer.Option("fisher", "--estimator", "-e", help=f"{ESTIMATOR_HELP}; fisher is the cheapest."),
    loss: str = typer.Option("kl", "--loss", help="kl (to the original) or ce (next-token cross-entropy)."),
    granularity: str = typer.Option("layer", help="layer, or sublayer (attention and MLP halves)."),
    n_calibration: int = typer.Option(32, help="Calibration windows."),
    seq_len: int = typer.Option(128, help="Tokens per window."),
    batch_size: int = typer.Option(8, help="Windows per forward pass."),
    seed: int = typer.Option(0, help="Seed for window choice and label sampling."),
    option: list[str] = typer.Option([], "--option", help="Estimator option KEY=VALUE, e.g. samples=4."),
    cache: bool = typer.Option(True, "--cache/--no-cache", help="Reuse/store Hessians under CBO_HOME/cache."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
) -> None:
    """Estimate the block-removal QUBO of a model on calibration text and save it (for `cbo solve`)."""
    from cbo.data import make_splits
    from cbo.hessian import estimate_hessian
    from cbo.models import load_model
    from cbo.pipeline.inputs import cache_dirs

    try:
        opts = parse_options(option, "--option")
        say(quiet, f"loading {model} ...")
        m, tok = load_model(model)
        say(quiet, "cutting calibration windows ...")
        splits = make_splits(
            tok, text, seq_len=seq_len, n_calibration=n_calibration, n_validation=0, n_test=0, seed=seed, model=m
        )
        qubo = estimate_hessian(
            m,
            tok,
            splits.calibration,
            estimator=estimator,
            loss=loss,
            granularity=granularity,
            batch_size=batch_size,
            seed=seed,
            cache_dir=cache_dirs(cache)[0],
            progress=not quiet,
            **opts,
        )
        qubo.metadata["data"] = {k: splits.info.get(k) for k in ("source", "documents", "split_by")}
        qubo.save(output)
    except CBOError as exc:
        fail(exc)
    md = qubo.metadata
    lin = qubo.linear
    order = lin.argsort()
    console.print(
        f"wrote {output}: {qubo.n} {md['granularity']} blocks, {md['estimator']}/{md['loss']}, "
        f"{md['n_tokens']} tokens, {md['wall_time_s']:.1f} s"
    )
    console.print(
        "cheapest single removals: "
        + ", ".join(f"{qubo.names[i]} ({lin[i]:.3g})" for i in order[: min(5, qubo.n)])
        + f"; most expensive: {qubo.names[order[-1]]} ({lin[order[-1]]:.3g})"
    )


@app.command()
def prune(
    model: str = typer.Argument("smollm2-135m", help=MODEL_HELP),
    remove: Optional[int] = typer.Option(None, "--remove", "-m", help="M, the number of blocks to remove (default 8)."),
    top: int = typer.Option(10, "--top", "-k", help="How many low-energy states to rank."),
    validate: int = typer.Option(10, "--validate", "-v", help="How many of them to measure on validation text."),
    text: Optional[Path] = typer.Option(None, "--text", help=TEXT_HELP),
    estimator: str = typer.Option("singles", "--estimator", "-e", help=f"{ESTIMATOR_HELP}."),
    loss: str = typer.Option("kl", "--loss", help="kl or ce."),
    solver: str = typer.Option("auto", "--solver", "-s", help="A registered solver (`cbo solvers` lists them)."),
    method: str = typer.Option("cbo", "--method", help="cbo, or a depth baseline (`cbo estimators` lists them)."),
    granularity: str = typer.Option("layer", help="layer, or sublayer (attention and MLP halves)."),
    keep: Optional[str] = typer.Option(None, "--keep", help="Blocks never removed, e.g. '0,29'."),
    n_calibration: int = typer.Option(32, help="Calibration windows."),
    n_validation: int = typer.Option(32, help="Validation windows."),
    seq_len: int = typer.Option(128, help="Tokens per window."),
    batch_size: int = typer.Option(8, help="Windows per forward pass."),
    seed: int = typer.Option(0, help="Seed for windows, label sampling and randomized solvers."),
    option: list[str] = typer.Option([], "--option", help="Estimator option KEY=VALUE, e.g. couplings=raw."),
    cache: bool = typer.Option(True, "--cache/--no-cache", help="Reuse/store Hessians under CBO_HOME/cache."),
    out: Optional[Path] = typer.Option(None, "--out", help="Save the pruned model, tokenizer and report.json here."),
    plots: Optional[Path] = typer.Option(
        None, "--plots", help="Write spectrum, removal map, Hamming, energy-vs-KL and coupling plots here."
    ),
    width: Optional[str] = typer.Option(
        None, "--width", "-w", help="Width pruning instead of depth: a score (taylor, amp, ntk, afr, magnitude)."
    ),
    ratio: Optional[float] = typer.Option(
        None, "--ratio", "-r", help="With --width: fraction of the parameters to remove, in (0, 1)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of a table."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
) -> None:
    """Remove M blocks chosen by constrained binary optimization; validate the top states and keep the best.

    With --width NAME --ratio R it prunes attention heads and MLP neurons instead (one-shot, score NAME);
    `cbo compress` combines depth and width and runs the MoP scheduler.
    """
    from cbo.pipeline import prune_depth

    if width is not None or ratio is not None:
        if remove is not None:
            fail(
                CBOError(
                    "--remove (depth) and --width (width) were both given; use `cbo compress --depth cbo "
                    "--width NAME --ratio R` to combine them."
                )
            )
        if ratio is None:
            fail(CBOError("--width needs --ratio, the fraction of the parameters to remove, e.g. --ratio 0.2."))
        _prune_width(model, width, ratio, text, n_calibration, n_validation, seq_len, seed, out, as_json, quiet)
        return
    remove = 8 if remove is None else remove
    try:
        opts = parse_options(option, "--option")
        say(quiet, f"pruning {remove} blocks of {model} ({method}) ...")
        report = prune_depth(
            model,
            None,
            text,
            remove=remove,
            estimator=estimator,
            loss=loss,
            solver=solver,
            top_k=top,
            validate=validate,
            granularity=granularity,
            method=method,
            keep=parse_blocks(keep) or None,
            seed=seed,
            cache_dir=cache,
            n_calibration=n_calibration,
            n_validation=n_validation,
            seq_len=seq_len,
            batch_size=batch_size,
            estimator_options=opts,
            progress=not quiet,
        )
        if out is not None:
            report.save_model(out)
        written = _write_plots(report, plots) if plots is not None else []
    except CBOError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=1))
    else:
        report.print(console)
        t = report.timings
        console.print(
            "time: " + ", ".join(f"{k} {v:.1f}s" for k, v in t.items() if k != "total") + f" (total {t['total']:.1f}s)"
        )
        if out is not None:
            console.print(f"saved the pruned model and report.json to {out}")
        if written:
            console.print(f"wrote {len(written)} plots to {plots}")


def _write_plots(report: Any, directory: Path) -> list[Path]:
    """The pruning report's plots: the ranked states, the couplings, and energy vs validation KL."""
    from cbo import plot

    if report.states is None:
        raise CBOError(f"--plots needs the CBO method (energies and states); {report.method!r} ranks no states.")
    written = plot.save_all(report.states, report.qubo, directory)
    measured = [v for v in report.validation if v.kl is not None]
    if len(measured) >= 1:
        chosen = next((k for k, v in enumerate(measured) if v.removed == report.chosen_blocks), None)
        fig = plot.plot_energy_vs_measured(
            [v.energy for v in measured], [v.kl for v in measured], chosen=chosen, path=directory / "energy_vs_kl.png"
        )
        plot.close(fig)
        written.append(directory / "energy_vs_kl.png")
    return written


def _prune_width(
    model: str,
    width: Optional[str],
    ratio: float,
    text: Optional[Path],
    n_calibration: int,
    n_validation: int,
    seq_len: int,
    seed: int,
    out: Optional[Path],
    as_json: bool,
    quiet: bool,
) -> None:
    """``cbo prune --width NAME --ratio R``: one-shot width pruning with the before/after report of ``compress``."""
    from cbo.pipeline import compress

    try:
        say(quiet, f"pruning {ratio:.0%} of the parameters of {model} by width ({width or 'taylor'}) ...")
        report = compress(
            model,
            None,
            text,
            ratio=ratio,
            width=width or "taylor",
            depth="none",
            scheduler="oneshot",
            seq_len=seq_len,
            n_calibration=n_calibration,
            n_validation=n_validation,
            measure_speed=not as_json,
            out=out,
            seed=seed,
            progress=not quiet,
        )
    except CBOError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=1, default=str))
        return
    console.print(report.table())
    if out is not None:
        console.print(f"saved to {out} (load with cbo.load_pruned)")


@app.command()
def estimators() -> None:
    """List the Hessian estimators (with their cost per calibration batch and losses) and the depth baselines."""
    from rich.table import Table

    from cbo.hessian import describe
    from cbo.pipeline import DEFAULT_ESTIMATOR, depth_methods

    table = Table(title="Hessian estimators (`--estimator`)")
    for col in ("name", "cost per calibration batch", "losses", "description"):
        table.add_column(col)
    for name, info in describe().items():
        label = f"{name} (default)" if name == DEFAULT_ESTIMATOR else name
        table.add_row(label, info["cost"], info["losses"], info["description"])
    console.print(table)
    console.print("depth methods (`--method`): " + ", ".join(depth_methods()))
