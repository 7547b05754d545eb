"""How a command shows Python warnings: one line ``warning: MESSAGE`` on stderr, each message once per command,
without the ``file.py:123: UserWarning:`` prefix and the source line that Python's default format adds (those
name CBO's internals, not anything the user can act on)."""

from __future__ import annotations

import warnings
from typing import Any

import typer

from cbo.cli.common import err_console, plain


def show_warnings_plainly(ctx: typer.Context) -> None:
    """Print warnings as plain one-line messages (each once) until the command ``ctx`` closes."""
    previous = warnings.showwarning
    seen: set[str] = set()

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None):
        text = " ".join(str(message).split())
        if text in seen:
            return
        seen.add(text)
        label = "warning" if issubclass(category, UserWarning) else f"warning ({category.__name__})"
        err_console.print(f"[yellow]{label}:[/] {plain(text)}")

    warnings.showwarning = show
    ctx.call_on_close(lambda: setattr(warnings, "showwarning", previous))
