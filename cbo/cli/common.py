"""What every command module shares: the consoles, the one way an error ends a command, the parsers of
``KEY=VALUE`` options and block lists, and the one rule every writing command applies to its outputs before its
work (:func:`claim_outputs`).
Command modules import these instead of keeping their own copies.

Text that comes from the user or from an error message (paths, model and block names, ``pip install 'cbo[gpu]'``)
goes through rich escaped (:func:`plain`), so brackets in it print as they are instead of being read as markup.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

from cbo.errors import CBOError

# no emoji codes: a user's name such as "synthetic:abc:1" must print as it is, not as "synthetic🔤1"
console = Console(emoji=False)
err_console = Console(stderr=True, soft_wrap=True, emoji=False)

MODEL_HELP = "'smollm2-135m' (the default, installed by `cbo setup`), a local Hugging Face folder, or a hub id."
TEXT_HELP = "Text: a file, a folder of .txt files, or a .jsonl; default: the six Austen novels."


OVERWRITE_HELP = "Write into a non-empty folder CBO did not write (only files of the same names are replaced)."
OVERWRITE_FILES_HELP = "Replace output files that already exist."

# the help of the options several commands share
GRANULARITY_HELP = "layer, or sublayer (mixer and MLP halves: attention or Mamba, MLP or MoE)."
CALIBRATION_HELP = "Calibration windows."
SEQ_LEN_HELP = "Tokens per window."
BATCH_HELP = "Windows per forward pass."
CACHE_HELP = (
    "Reuse and store work under CBO_HOME/cache: Hessians and their checkpoints, measured losses and refine "
    "checkpoints (--no-cache: compute afresh, write nothing there)."
)
QUIET_HELP = "No progress output."


def plain(value: Any) -> str:
    """``value`` as text that rich prints literally (``[bold]`` stays ``[bold]``)."""
    return escape(str(value))


def fail(exc: Exception) -> NoReturn:
    """Print ``exc`` as the command's error and exit with status 2."""
    err_console.print(f"[bold red]error:[/] {plain(exc)}")
    raise typer.Exit(2)


def say(quiet: bool, message: str) -> None:
    """A progress message on stderr (printed literally), unless ``--quiet``."""
    if not quiet:
        err_console.print(plain(message))


def check_outputs(
    files: tuple[Optional[Path], ...] = (),
    folders: tuple[Optional[Path], ...] = (),
    *,
    overwrite: bool = False,
    make_parents: bool = False,
    replace_files: bool | None = None,
) -> None:
    """Check every output of a command before its work starts (:mod:`cbo.files`): files that cannot be written
    (or whose folder is missing, unless the command creates it: ``make_parents``; or that exist, when
    ``replace_files`` is False: the command's ``--overwrite`` not given), and folders that cannot be written or
    hold files CBO did not write (refused unless ``overwrite``), raise OutputPathError. ``None`` entries
    (outputs not asked for) are skipped."""
    from cbo.errors import OutputPathError
    from cbo.files import check_output_dir, check_output_file

    for path in files:
        if path is not None:
            check_output_file(path, make_parents=make_parents)
            if replace_files is False and path.exists():
                raise OutputPathError(f"{str(path)!r} exists; pass --overwrite to replace it, or choose another name.")
    for path in folders:
        if path is not None:
            check_output_dir(path, overwrite=overwrite)


def input_paths(inputs: tuple[Any, ...]) -> list[Path]:
    """Where the inputs of a command lie: an installable model's folder for its name (``smollm2-135m``), the path
    itself for a file or folder that exists; hub ids, ``synthetic:...`` instances and ``None`` are skipped."""
    from cbo.model.loading import MODEL_ASSETS, model_dir

    paths = []
    for item in inputs:
        if item is None:
            continue
        name = str(item)
        if name in MODEL_ASSETS:
            paths.append(model_dir(name))
        elif Path(name).expanduser().exists():
            paths.append(Path(name).expanduser())
    return paths


@contextlib.contextmanager
def claim_outputs(
    files: tuple[Optional[Path], ...] = (),
    folders: tuple[Optional[Path], ...] = (),
    *,
    inputs: tuple[Any, ...] = (),
    texts: tuple[Any, ...] = (),
    overwrite: bool = False,
    make_parents: bool = False,
    replace_files: bool | None = None,
) -> Iterator[None]:
    """The one rule of every command that writes, applied before its work and held while the block runs:

    * an output that is, holds or lies inside an input (``inputs``: model names or folders, GGUF and QUBO files)
      or that is one of the ``texts`` it reads is refused, ``--overwrite`` or not;
    * the outputs are checked (:func:`check_outputs`: writable, tried with a real file; no foreign folder);
    * each output is held (:func:`cbo.files.output_lock`), so that a second run writing it meanwhile is refused
      before its work instead of both reporting success.

    Raises:
        OutputPathError: any of these fails (the locks taken so far are released).
    """
    from cbo.errors import OutputPathError
    from cbo.files import check_apart, output_lock

    outputs = [p for p in (*files, *folders) if p is not None]
    sources = input_paths(inputs)
    for path in outputs:
        if path in files and path.is_dir():
            continue  # a folder given for a file: check_outputs says so
        check_apart(path, sources, "output folder" if path in folders else "output file")
        for text in texts:
            if text is not None and Path(text).expanduser().resolve() == Path(path).expanduser().resolve():
                raise OutputPathError(f"the output {str(path)!r} is the text the command reads; choose another name.")
    check_outputs(files, folders, overwrite=overwrite, make_parents=make_parents, replace_files=replace_files)
    with contextlib.ExitStack() as locks:
        for path in dict.fromkeys(outputs):
            locks.enter_context(output_lock(path))
        yield


def parse_options(items: list[str], what: str = "option") -> dict[str, Any]:
    """``["samples=4", "clip=false", "keep=[0,29]"]`` -> a dict: values parsed as JSON when they can be (numbers,
    true/false, lists), else kept as text."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise CBOError(f"{what} {item!r} must look like KEY=VALUE, e.g. samples=4.")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def parse_blocks(spec: Optional[str]) -> list[int | str]:
    """``'0,29'`` or ``'layers.0,layers.29'`` -> ``[0, 29]`` / names; empty -> ``[]``."""
    if not spec:
        return []
    return [int(p) if p.strip().lstrip("-").isdigit() else p.strip() for p in spec.split(",") if p.strip()]
