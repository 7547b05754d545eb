"""`cbo hessian` and `cbo prune`: commands on real models and text."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Optional

import typer

from cbo.cli import app
from cbo.cli.common import (
    BATCH_HELP,
    CACHE_HELP,
    CALIBRATION_HELP,
    GRANULARITY_HELP,
    MODEL_HELP,
    OVERWRITE_HELP,
    QUIET_HELP,
    SEQ_LEN_HELP,
    TEXT_HELP,
    claim_outputs,
    console,
    err_console,
    fail,
    parse_blocks,
    parse_options,
    plain,
    say,
)
from cbo.cli.tables import print_table
from cbo.errors import CBOError
from cbo.pipeline.options import DEFAULT_ESTIMATOR, DEFAULT_REFINE, DEFAULT_SELECT

ESTIMATOR_HELP = "A registered Hessian estimator (`cbo estimators` lists them with their cost)"


@app.command()
def hessian(
    model: str = typer.Argument("smollm2-135m", help=MODEL_HELP),
    output: Path = typer.Option(..., "--output", "-o", help="QUBO file to write (.cboq)."),
    text: Optional[Path] = typer.Option(None, "--text", help=TEXT_HELP),
    estimator: str = typer.Option(
        DEFAULT_ESTIMATOR, "--estimator", "-e", help=f"{ESTIMATOR_HELP}; fisher is the cheapest."
    ),
    loss: str = typer.Option("kl", "--loss", help="kl (to the original) or ce (next-token cross-entropy)."),
    granularity: str = typer.Option("layer", help=GRANULARITY_HELP),
    n_calibration: int = typer.Option(32, help=CALIBRATION_HELP),
    seq_len: int = typer.Option(128, help=SEQ_LEN_HELP),
    batch_size: int = typer.Option(8, help=BATCH_HELP),
    seed: int = typer.Option(0, help="Seed for window choice and label sampling."),
    option: list[str] = typer.Option([], "--option", help="Estimator option KEY=VALUE, e.g. samples=4."),
    cache: bool = typer.Option(True, "--cache/--no-cache", help=CACHE_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Estimate the block-removal QUBO of a model on calibration text and save it (for `cbo solve`)."""
    from cbo.data.windows import make_splits
    from cbo.hessian import estimate_hessian
    from cbo.model.loading import load_model
    from cbo.pipeline.inputs import cache_dirs, check_run_options

    held = contextlib.ExitStack()  # the output, held until the command ends
    try:
        held.enter_context(claim_outputs((output,), inputs=(model,), texts=(text,)))
        check_run_options(seq_len=seq_len, n_calibration=n_calibration, batch_size=batch_size, seed=seed)
        opts = parse_options(option, "--option")
        say(quiet, f"loading {model} ...")
        m, tok = load_model(model, quiet=quiet)
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
    except KeyboardInterrupt:
        interrupted(cache)
    finally:
        held.close()
    md = qubo.metadata
    lin = qubo.linear
    order = lin.argsort()
    console.print(
        f"wrote {plain(output)}: {qubo.n} {md['granularity']} blocks, {md['estimator']}/{md['loss']}, "
        f"{md['n_tokens']} tokens, {md['wall_time_s']:.1f} s"
    )
    console.print(
        "cheapest single removals: "
        + ", ".join(f"{plain(qubo.names[i])} ({lin[i]:.3g})" for i in order[: min(5, qubo.n)])
        + f"; most expensive: {plain(qubo.names[order[-1]])} ({lin[order[-1]]:.3g})"
    )


@app.command()
def prune(
    model: str = typer.Argument("smollm2-135m", help=MODEL_HELP),
    remove: Optional[int] = typer.Option(None, "--remove", "-m", help="M, the number of blocks to remove (default 8)."),
    top: int = typer.Option(10, "--top", "-k", help="How many low-energy states to rank."),
    validate: int = typer.Option(10, "--validate", "-v", help="How many of them to measure on validation text."),
    text: Optional[Path] = typer.Option(None, "--text", help=TEXT_HELP),
    estimator: str = typer.Option(DEFAULT_ESTIMATOR, "--estimator", "-e", help=f"{ESTIMATOR_HELP}."),
    loss: str = typer.Option("kl", "--loss", help="kl or ce."),
    solver: str = typer.Option("auto", "--solver", "-s", help="A registered solver (`cbo solvers` lists them)."),
    method: str = typer.Option("cbo", "--method", help="cbo, or a depth baseline (`cbo estimators` lists them)."),
    granularity: str = typer.Option("layer", help=GRANULARITY_HELP),
    keep: Optional[str] = typer.Option(None, "--keep", help="Blocks never removed, e.g. '0,29'."),
    keep_kind: list[str] = typer.Option(
        [], "--keep-kind", help="Never remove a block of this kind (repeatable): attention, mamba, mlp or moe."
    ),
    max_kind: list[str] = typer.Option(
        [], "--max-kind", help="At most N removed blocks of a kind, KIND=N (repeatable), e.g. attention=4, mlp=2."
    ),
    budget_params: Optional[int] = typer.Option(
        None, "--budget-params", help="At most this many parameters removed (the solver respects it)."
    ),
    n_calibration: int = typer.Option(32, help=CALIBRATION_HELP),
    n_validation: int = typer.Option(32, help="Validation windows."),
    seq_len: int = typer.Option(128, help=SEQ_LEN_HELP),
    batch_size: int = typer.Option(8, help=BATCH_HELP),
    seed: int = typer.Option(0, help="Seed for windows, label sampling and randomized solvers."),
    option: list[str] = typer.Option([], "--option", help="Estimator option KEY=VALUE, e.g. couplings=raw."),
    cache: bool = typer.Option(True, "--cache/--no-cache", help=CACHE_HELP),
    out: Optional[Path] = typer.Option(None, "--out", help="Save the pruned model, tokenizer and report.json here."),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
    plots: Optional[Path] = typer.Option(
        None, "--plots", help="Write spectrum, removal map, Hamming, energy-vs-KL and coupling plots here."
    ),
    width: Optional[str] = typer.Option(
        None, "--width", "-w", help="Width pruning instead of depth: a score (taylor, amp, ntk, afr, magnitude)."
    ),
    ratio: Optional[float] = typer.Option(
        None,
        "--ratio",
        "-r",
        help="With --width: fraction of the parameters to remove, in (0, 1), of the decoder layers' parameters "
        "(see --ratio-of; the report prints both fractions).",
    ),
    ratio_of: str = typer.Option(
        "blocks", "--ratio-of", help="What --ratio is a fraction of: blocks (the decoder layers) or model (all)."
    ),
    tasks: Optional[str] = typer.Option(
        None,
        "--tasks",
        "-t",
        help="Also evaluate the original and the pruned model on lm-eval tasks, e.g. austen_cloze,austen_choice "
        "(local, or cached in this lm-eval installation; needs cbo[eval]).",
    ),
    tasks_limit: Optional[int] = typer.Option(None, "--tasks-limit", help="Items per task (default: all)."),
    refine: Optional[float] = typer.Option(
        None,
        "--refine",
        help="Refine the QUBO with measurements before validating: BUDGET in forward-pass equivalents (one FPE ="
        " one full forward pass over one calibration window) for the rounds after the estimate (the estimate and"
        f" the validation are paid apart). Default: {DEFAULT_REFINE:g} for --method cbo; --no-refine turns it off.",
    ),
    no_refine: bool = typer.Option(False, "--no-refine", help="No refinement: validate the QUBO's own states."),
    select: Optional[int] = typer.Option(
        None,
        "--select",
        help="Race the validated states on up to N fresh windows of the validation text (rounds of 32, 64, 128, ..."
        " windows; a finalist is dropped once it is clearly worse, paired by window) and choose the winner."
        f" Default: {DEFAULT_SELECT} for --method cbo; --no-select turns it off (the lowest validation KL is chosen).",
    ),
    no_select: bool = typer.Option(False, "--no-select", help="No final race: the lowest validation KL is chosen."),
    select_criterion: str = typer.Option(
        "ce", "--select-criterion", help="What --select compares: ce (perplexity) or kl (KL to the original)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of a table."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Remove M blocks chosen by constrained binary optimization; validate the top states and keep the best.

    With --width NAME --ratio R it prunes attention heads and MLP neurons instead (one-shot, score NAME);
    `cbo compress` combines depth and width and runs the MoP scheduler.
    """
    from cbo.pipeline import prune_depth

    locks = contextlib.ExitStack()
    try:
        if width is None and ratio is not None:
            raise CBOError(
                f"--ratio {ratio} is a width-pruning fraction: give --width NAME with it (e.g. --width taylor), or "
                "--remove M for depth pruning."
            )
        locks.enter_context(claim_outputs(folders=(out, plots), inputs=(model,), texts=(text,), overwrite=overwrite))
    except CBOError as exc:
        locks.close()
        fail(exc)
    from cbo.pipeline.options import Data

    data = Data(n_calibration=n_calibration, n_validation=n_validation, seq_len=seq_len)
    with locks:
        if width is not None:
            if remove is not None:
                fail(
                    CBOError(
                        "--remove (depth) and --width (width) were both given; use `cbo compress --depth cbo "
                        "--width NAME --ratio R` to combine them."
                    )
                )
            # --no-refine / --no-select ask for what width pruning does anyway: accepted
            if refine is not None:
                fail(CBOError("--refine refines a depth QUBO; it does not apply to --width. Drop it."))
            if select is not None:
                fail(CBOError("--select races depth candidates; it does not apply to --width. Drop it."))
            if ratio is None:
                fail(CBOError("--width needs --ratio, the fraction of the parameters to remove, e.g. --ratio 0.2."))
            _prune_width(model, width, ratio, ratio_of, text, data, seed, out, as_json, quiet)
            return
        remove = 8 if remove is None else remove
        try:
            refine = switch("--refine", refine, no_refine)
            select = switch("--select", select, no_select)
            opts = parse_options(option, "--option")
            from cbo.model.loading import load_model

            manager = None
            if tasks is not None:
                from cbo.downstream.harness import parse_tasks, task_manager

                if tasks_limit is not None and tasks_limit < 1:
                    raise CBOError(f"--tasks-limit must be >= 1, got {tasks_limit}.")
                tasks = parse_tasks(tasks)
                manager = task_manager(tasks)  # unknown task names fail before any model work
            # loaded here (quietly with -q; the original is also what --tasks evaluates after pruning)
            loaded, tokenizer = load_model(model, quiet=quiet)
            say(quiet, f"pruning {remove} blocks of {model} ({method}) ...")
            report = prune_depth(
                loaded,
                tokenizer,
                text,
                remove=remove,
                estimator=estimator,
                loss=loss,
                solver=solver,
                top_k=top,
                validate=validate,
                granularity=granularity,
                method=method,
                keep=parse_blocks(keep) + [k.strip() for k in keep_kind if k.strip()] or None,
                caps=parse_caps(max_kind) or None,
                budget_params=budget_params,
                seed=seed,
                cache_dir=cache,
                data=data,
                batch_size=batch_size,
                estimator_options=opts,
                progress=not quiet,
                refine=refine,
                select=select,
                select_options={"criterion": select_criterion},
            )
            report.model_name = model
            task_results = None
            if tasks is not None:
                say(quiet, f"evaluating the original and the pruned model on {', '.join(tasks)} ...")
                task_results = compare_on_tasks(
                    loaded, report.pruned_model, tokenizer, tasks, tasks_limit, manager, quiet
                )
            if out is not None:
                extra = {"tasks.json": json.dumps(task_results, indent=1) + "\n"} if task_results is not None else {}
                report.save_model(out, extra_files=extra, progress=not quiet)
            written = []
            if plots is not None:
                from cbo.files import output_folder

                with output_folder(plots) as staging:  # listed as CBO's, replaced whole
                    written = _write_plots(report, staging)
        except CBOError as exc:
            fail(exc)
        except KeyboardInterrupt:
            interrupted(cache)
        if as_json:
            data = report.to_json()
            if task_results is not None:
                data["tasks"] = task_results
            typer.echo(json.dumps(data, indent=1))
        else:
            report.print(console)
            if task_results is not None:
                console.print(tasks_table(task_results))
            t = report.timings
            console.print(
                "time: "
                + ", ".join(f"{k} {v:.1f}s" for k, v in t.items() if k != "total")
                + f" (total {t['total']:.1f}s)"
            )
            if out is not None:
                saved = (
                    "the pruned model, its tokenizer and report.json"
                    if tokenizer is not None
                    else ("the pruned model and report.json")
                )
                console.print(f"saved {saved} to {plain(out)}")
            if written:
                console.print(f"wrote {len(written)} plots to {plain(plots)}")


def interrupted(cache: bool) -> None:
    """Ctrl-C in ``cbo prune`` or ``cbo hessian``: say what is kept and how to resume, then exit with status 130."""
    from cbo.pipeline.inputs import cache_dirs

    if cache:
        folder = cache_dirs(True)[0].parent
        err_console.print(
            f"[yellow]interrupted: the finished work (Hessian batches in a checkpoint, measured removals) is kept in "
            f"{plain(folder)}; run the same command again to resume from it.[/]"
        )
    else:
        err_console.print("[yellow]interrupted: nothing is kept (--no-cache); a rerun starts over.[/]")
    raise typer.Exit(130)


def switch(flag: str, value: Any, off: bool) -> Any:
    """A default-on option's value for prune_depth: ``"auto"`` (the default) when not given, None with ``--no-...``,
    else the value; both at once is refused."""
    if off and value is not None:
        raise CBOError(f"{flag} {value} and --no-{flag[2:]} were both given; keep one.")
    return None if off else ("auto" if value is None else value)


def parse_caps(items: list[str]) -> dict[str, int]:
    """``["attention=4", "mlp=2"]`` -> ``{"attention": 4, "mlp": 2}``; CBOError naming a malformed item."""
    caps: dict[str, int] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep or not kind.strip() or not value.strip().isdigit():
            raise CBOError(f"--max-kind {item!r} must look like KIND=N with N >= 0, e.g. attention=4.")
        caps[kind.strip()] = int(value)
    return caps


def compare_on_tasks(
    original: Any, pruned: Any, tokenizer: Any, tasks: list[str], limit: int | None, manager: Any, quiet: bool
) -> dict[str, Any]:
    """``{"tasks", "limit", "original": {task: metrics}, "pruned": {...}}`` through lm-eval (cbo.downstream)."""
    from cbo.downstream.harness import evaluate_tasks

    out: dict[str, Any] = {"tasks": tasks, "limit": limit}
    for label, m in (("original", original), ("pruned", pruned)):
        out[label] = evaluate_tasks(m, tokenizer, tasks, limit=limit, progress=not quiet, manager=manager)
    return out


def tasks_table(results: dict[str, Any]) -> Any:
    """A rich table: one row per task and metric, the original's value beside the pruned model's."""
    from rich.table import Table

    table = Table(title="downstream tasks (lm-eval)")
    for col, just in (("task", "left"), ("metric", "left"), ("original", "right"), ("pruned", "right"), ("n", "right")):
        table.add_column(col, justify=just)
    for task, metrics in results["original"].items():
        pruned = results["pruned"].get(task, {})
        for metric, value in metrics.items():
            if metric.endswith("_stderr") or metric == "n":
                continue
            cells = []
            for v, err in (
                (value, metrics.get(f"{metric}_stderr")),
                (pruned.get(metric), pruned.get(f"{metric}_stderr")),
            ):
                text = "–" if v is None else f"{v:.4g}"
                cells.append(text + (f" ± {err:.2g}" if err is not None and err == err else ""))
            table.add_row(task, metric, *cells, str(int(metrics.get("n", 0))))
    return table


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
    ratio_of: str,
    text: Optional[Path],
    data: Any,
    seed: int,
    out: Optional[Path],
    as_json: bool,
    quiet: bool,
) -> None:
    """``cbo prune --width NAME --ratio R``: one-shot width pruning with the before/after report of ``compress``."""
    from cbo.pipeline import compress

    try:
        whose = "the decoder layers' parameters" if ratio_of == "blocks" else "all the parameters"
        say(quiet, f"pruning {ratio:.0%} of {whose} of {model} by width ({width or 'taylor'}) ...")
        report = compress(
            model,
            None,
            text,
            ratio=ratio,
            ratio_of=ratio_of,
            width=width or "taylor",
            depth="none",
            scheduler="oneshot",
            **{k: getattr(data, k) for k in ("n_calibration", "n_validation", "seq_len")},  # compress's own n_test
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
        console.print(f"saved to {plain(out)} (load with cbo.load_pruned)")


@app.command()
def estimators() -> None:
    """List the Hessian estimators (with their cost per calibration batch and losses) and the depth baselines."""
    from cbo.hessian import describe
    from cbo.pipeline import depth_methods

    def label(name: str) -> str:
        return f"{name} (default)" if name == DEFAULT_ESTIMATOR else name

    rows = ((label(name), info["cost"], info["losses"], info["description"]) for name, info in describe().items())
    print_table(
        "Hessian estimators (`--estimator`)", ("name", "cost per calibration batch", "losses", "description"), rows
    )
    console.print("depth methods (`--method`): " + ", ".join(depth_methods()))
