"""What every command module shares: the consoles, the one way an error ends a command, and the parsers of
``KEY=VALUE`` options and block lists. Command modules import these instead of keeping their own copies."""

from __future__ import annotations

import json
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console

from cbo.errors import CBOError

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

MODEL_HELP = "'smollm2-135m' (the default, installed by `cbo setup`), a local Hugging Face folder, or a hub id."
TEXT_HELP = "Text: a file, a folder of .txt files, or a .jsonl; default: the six Austen novels."


def fail(exc: Exception) -> NoReturn:
    """Print ``exc`` as the command's error and exit with status 2."""
    err_console.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(2)


def say(quiet: bool, message: str) -> None:
    """A progress message on stderr, unless ``--quiet``."""
    if not quiet:
        err_console.print(message)


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
