"""`cbo heal`: recovery fine-tuning of a saved pruned model by distillation from the unpruned one."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Optional

import typer

from cbo.cli import app
from cbo.cli.common import MODEL_HELP, QUIET_HELP, TEXT_HELP, claim_outputs, console, err_console, fail, plain, say
from cbo.errors import CBOError, InvalidOptionError

CHECKPOINT_FOLDER = "heal-checkpoint"  # inside --out, until the healed model is saved
RECORD_FILE = "heal.json"  # what HealResult.save writes beside the model


def written_by_heal(folder: Path) -> bool:
    """True when ``folder`` holds only what an earlier `cbo heal` wrote (a checkpoint or a healed model)."""
    return (folder / CHECKPOINT_FOLDER).is_dir() or (folder / RECORD_FILE).is_file()


def check_out(out: Path, resume: bool) -> None:
    """Refuse an --out that is a file, or a non-empty folder that `cbo heal` did not write (before any work)."""
    if out.exists() and not out.is_dir():
        raise InvalidOptionError(f"--out {str(out)!r} is a file; give a folder (new or empty)")
    if out.is_dir() and any(out.iterdir()):
        if not written_by_heal(out):
            raise InvalidOptionError(
                f"--out {str(out)!r} is a non-empty folder that `cbo heal` did not write; give a new or empty folder"
            )
        if not resume:
            what = "an unfinished heal" if (out / CHECKPOINT_FOLDER).is_dir() else "a healed model"
            raise InvalidOptionError(
                f"--out {str(out)!r} already holds {what}; pass --resume to continue (or redo) it, or give another "
                "folder"
            )


@app.command()
def heal(
    pruned: Path = typer.Argument(..., help="A saved pruned model folder (cbo prune / cbo compress --out)."),
    teacher: str = typer.Option(..., "--teacher", "-t", help=f"The unpruned model to distil from: {MODEL_HELP}"),
    steps: int = typer.Option(..., "--steps", "-n", help="Optimizer steps (each on --batch-size windows)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder of the healed model (new, empty, or a heal's own)."),
    lora: bool = typer.Option(True, "--lora/--full", help="Train LoRA adapters (merged at the end) or every weight."),
    resume: bool = typer.Option(False, "--resume", help="Continue the heal whose checkpoint is in --out."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate (default 2e-4 for LoRA, 2e-5 for --full)."),
    batch_size: int = typer.Option(4, help="Windows per step."),
    schedule: str = typer.Option("linear", help="Learning-rate schedule: constant, linear or cosine."),
    warmup: int = typer.Option(0, help="Warm-up steps."),
    temperature: float = typer.Option(1.0, help="Distillation temperature."),
    lora_rank: int = typer.Option(8, help="LoRA rank."),
    text: Optional[str] = typer.Option(None, "--text", help=TEXT_HELP),
    seq_len: int = typer.Option(128, help="Tokens per training window."),
    n_calibration: int = typer.Option(64, help="Training windows (the calibration split of the text)."),
    checkpoint_every: Optional[int] = typer.Option(None, help="Steps between checkpoints (default: a tenth)."),
    seed: int = typer.Option(0, help="Seed of the windows and the batch order."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
) -> None:
    """Heal a pruned model: distil the unpruned model's next-token distributions into it, save it to --out."""
    from cbo.recovery.healing import check_heal_options
    from cbo.recovery.healing import heal as run_heal

    method = "lora" if lora else "full"
    # the heal's settings, checked here (before any loading) and then passed to the heal itself
    settings = dict(steps=steps, method=method, lr=lr, batch_size=batch_size, schedule=schedule, warmup=warmup)
    settings |= dict(temperature=temperature, lora_rank=lora_rank, seed=seed)
    held = contextlib.ExitStack()  # --out, held until the command ends
    try:
        check_heal_options(**settings)
        if checkpoint_every is not None and checkpoint_every < 1:
            raise InvalidOptionError(f"--checkpoint-every must be >= 1, got {checkpoint_every}")
        if seq_len < 2 or n_calibration < 1:
            raise InvalidOptionError(f"--seq-len must be >= 2 and --n-calibration >= 1, got {seq_len}, {n_calibration}")
        if not (pruned / "config.json").is_file():
            raise InvalidOptionError(f"{str(pruned)!r} is not a saved model folder (no config.json)")
        if text is not None and not Path(text).exists():
            raise InvalidOptionError(f"--text {text!r} does not exist; give a text file, a folder or a .jsonl")
        # --out: apart from the inputs, writable, and held until the command ends (check_out: heal's own rule of
        # which non-empty folders it writes into)
        held.enter_context(claim_outputs(folders=(out,), inputs=(pruned, teacher), texts=(text,), overwrite=True))
        check_out(out, resume)
    except BaseException as exc:
        held.close()
        if isinstance(exc, CBOError):
            fail(exc)
        raise

    from cbo.data.windows import make_splits
    from cbo.model.loading import load_model, quiet_loading
    from cbo.recovery.healing import Checkpoint

    ckpt = out / CHECKPOINT_FOLDER
    if resume and not Checkpoint(ckpt).exists():  # said even with -q: the run does not do what was asked
        done = "a healed model but no unfinished heal" if (out / RECORD_FILE).is_file() else "no unfinished heal"
        err_console.print(f"--resume: {plain(out)} holds {done} (no checkpoint); training from step 0.")
        resume = False
    last = {"step": 0}
    try:
        say(quiet, f"loading {pruned} and the teacher {teacher}")
        with quiet_loading(quiet):  # -q: no weight-writing bars, transformers messages or Python warnings
            student, tokenizer = load_model(pruned, quiet=quiet)
            reference, _ = load_model(teacher, quiet=quiet)
            splits = make_splits(
                tokenizer, text, seq_len=seq_len, n_calibration=n_calibration, n_validation=0, n_test=0, seed=seed,
                model=student,
            )  # fmt: skip
            result = run_heal(
                student,
                reference,
                splits.calibration,
                **settings,
                checkpoint_dir=ckpt,
                checkpoint_every=checkpoint_every,
                resume=resume,
                progress=not quiet,
                on_step=lambda step, loss: last.update(step=step),
            )
            result.teacher = teacher
            result.model.config.cbo_recovery = result.record()
            result.save(out, tokenizer)
            shutil.rmtree(ckpt, ignore_errors=True)  # the healed model is saved: the resumable state is not needed
    except KeyboardInterrupt:
        err_console.print(
            f"[bold yellow]interrupted[/] after step {last['step']} of {steps}; the checkpoint in {ckpt} keeps it. "
            "Resume with the same command and --resume."
        )
        raise typer.Exit(130) from None
    except CBOError as exc:
        fail(exc)
    finally:
        held.close()
    first, final = (result.losses[0], result.losses[-1]) if result.losses else (float("nan"), float("nan"))
    say(quiet, f"distillation loss {first:.4f} -> {final:.4f} over {result.steps} steps ({result.seconds:.0f} s)")
    console.print(f"saved the healed model to {out} (load with cbo.load_pruned)")
