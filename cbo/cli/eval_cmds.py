"""`cbo eval`: downstream tasks through lm-eval on a model name or folder (pruned folders included)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from cbo.cli import app
from cbo.files import atomic_write_text

MODEL_HELP = "'smollm2-135m', 'gemma3-270m' (installed by `cbo setup`), a local Hugging Face folder (pruned or not)."
TASKS_HELP = (
    "Comma-separated lm-eval tasks: the local austen_cloze, austen_choice (tag: austen), or any task of this "
    "lm-eval installation whose data is in the datasets cache."
)


def format_results(results: dict[str, dict[str, float]]) -> list[str]:
    """One line per task and metric: ``task  metric  value  ± stderr``."""
    lines = []
    width = max((len(t) for t in results), default=4)
    for task, metrics in results.items():
        n = metrics.get("n")
        for metric, value in metrics.items():
            if metric.endswith("_stderr") or metric == "n":
                continue
            err = metrics.get(f"{metric}_stderr")
            err_text = f" ± {err:.4g}" if err is not None and err == err else ""
            count = f"  (n={int(n)})" if n is not None else ""
            lines.append(f"{task:{width}}  {metric:12} {value:10.4g}{err_text}{count}")
    return lines


@app.command("eval")
def eval_tasks(
    model: str = typer.Argument("smollm2-135m", help=MODEL_HELP),
    tasks: str = typer.Option("austen_cloze,austen_choice", "--tasks", "-t", help=TASKS_HELP),
    limit: Optional[float] = typer.Option(None, "--limit", help="Items per task (an integer) or a fraction (< 1)."),
    num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", help="Examples per prompt (task default)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Requests per forward pass."),
    seed: int = typer.Option(0, "--seed", help="Seed of lm-eval's few-shot sampling."),
    include_path: Optional[Path] = typer.Option(None, "--include-path", help="A folder of further task YAML files."),
    output: Optional[Path] = typer.Option(None, "--json", help="Also write the results to this JSON file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the result lines: no bars, logs or warnings."),
) -> None:
    """Evaluate a model on lm-eval tasks (nothing is downloaded: local tasks, or cached ones)."""
    from cbo.errors import CBOError

    try:
        from cbo.downstream.harness import check_eval_options, evaluate_tasks, parse_tasks, task_manager
        from cbo.model.loading import load_model

        limit = check_eval_options(limit, num_fewshot, batch_size)
        from cbo.cli.common import claim_outputs

        with claim_outputs((output,), inputs=(model,)):
            names = parse_tasks(tasks)
            manager = task_manager(names, include_path)  # unknown names fail before the model is loaded
            if not quiet:
                typer.echo(f"loading {model} ...", err=True)
            m, tok = load_model(model, quiet=quiet)
            settings = {"limit": limit, "num_fewshot": num_fewshot, "batch_size": batch_size, "seed": seed}
            results = evaluate_tasks(m, tok, names, progress=not quiet, manager=manager, **settings)
            if output is not None:
                record = {"model": model, "tasks": names, "settings": settings, "results": results}
                atomic_write_text(output, json.dumps(record, indent=2) + "\n")
    except CBOError as exc:
        typer.echo(f"eval failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    for line in format_results(results):
        typer.echo(line)
