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
    "Comma-separated lm-eval tasks or groups: zeroshot (arc_easy, arc_challenge, hellaswag, piqa, winogrande, "
    "boolq, lambada_openai), mmlu (57 subjects), selection (validation splits for decisions), any of their tasks; "
    "the local austen_cloze, austen_choice (group: austen); or any task of this lm-eval installation whose data "
    "is in the datasets cache."
)


def format_results(results: dict[str, dict[str, float]]) -> list[str]:
    """One line per task and metric: ``task  metric  value  ± stderr``."""
    lines = []
    width = max((len(t) for t in results), default=4)
    for task, metrics in results.items():
        n = metrics.get("n")
        for metric, value in metrics.items():
            if metric.endswith("_stderr") or metric in ("n", "of"):
                continue
            err = metrics.get(f"{metric}_stderr")
            err_text = f" ± {err:.4g}" if err is not None and err == err else ""
            of = metrics.get("of")
            count = "" if n is None else f"  (n={int(n)} of {int(of)})" if of not in (None, n) else f"  (n={int(n)})"
            lines.append(f"{task:{width}}  {metric:12} {value:10.4g}{err_text}{count}")
    from cbo.downstream.scores import suite_average

    average = suite_average(results)
    if average is not None:
        lines.append(f"{'zeroshot':{width}}  {'average':12} {average:10.4g}  (the seven tasks' reported metrics)")
    return lines


@app.command("eval")
def eval_tasks(
    model: str = typer.Argument("smollm2-135m", help=MODEL_HELP),
    tasks: str = typer.Option("austen_cloze,austen_choice", "--tasks", "-t", help=TASKS_HELP),
    limit: Optional[float] = typer.Option(
        None, "--limit", help="Items per task (an integer) or a fraction (< 1): a seeded random subset of CBO's tasks."
    ),
    num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", help="Examples per prompt (task default)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Requests per forward pass."),
    seed: int = typer.Option(0, "--seed", help="Seed of the --limit subset and of lm-eval's few-shot sampling."),
    include_path: Optional[Path] = typer.Option(None, "--include-path", help="A folder of further task YAML files."),
    output: Optional[Path] = typer.Option(
        None, "--json", help="Also write the results to this JSON file (after each task: a stopped run keeps them)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the result lines: no bars, logs or warnings."),
) -> None:
    """Evaluate a model on lm-eval tasks: the standard suite, MMLU, the local tasks (nothing is downloaded)."""
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

            def save(_name: str, done: dict) -> None:
                if output is not None:
                    record = {"model": model, "tasks": names, "settings": settings, "results": done}
                    atomic_write_text(output, json.dumps(record, indent=2) + "\n")

            results = evaluate_tasks(m, tok, names, progress=not quiet, manager=manager, on_task=save, **settings)
    except CBOError as exc:
        typer.echo(f"eval failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    for line in format_results(results):
        typer.echo(line)
