"""The README's examples run as written: every ``cbo ...`` line names a command and options that exist, and the
Python example runs end to end on the default model (with smaller window counts, so it takes seconds). The manual
repeats the quick start word for word (``example("readme-quickstart")``: the front page and getting started), and
holds what the README held before it became the front door: the troubleshooting table is checked here, the other
examples beside their pages (tests/test_docs.py, tests/test_docs_examples.py)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main

from cbo.cli import app, register_commands

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def command_lines() -> list[str]:
    lines = []
    for block in code_blocks("bash"):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("cbo "):
                lines.append(line)
    return lines


def resolve(args: list[str]) -> tuple[Any, list[str]]:
    """The click command an argument list runs, and the arguments left for it."""
    register_commands()
    command = typer.main.get_command(app)
    while hasattr(command, "list_commands") and args and not args[0].startswith("-"):
        sub = command.get_command(command.make_context("cbo", [], resilient_parsing=True), args[0])
        assert sub is not None, f"no command {args[0]!r}"
        command, args = sub, args[1:]
    return command, args


def test_the_readme_has_examples():
    assert len(command_lines()) >= 10 and code_blocks("python")


@pytest.mark.parametrize("line", command_lines())
def test_each_command_line_parses(line):
    """The command exists, each option is one of its options, and click accepts the line as a whole."""
    command, args = resolve(shlex.split(line)[1:])
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for token in args:
        if token.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", token):
            assert token.split("=")[0] in known, f"{line}: {token} is not an option of `{command.name}`"
    ctx = command.make_context(command.name, list(args), resilient_parsing=False)  # raises on a bad line
    assert ctx is not None


def self_contained_blocks() -> list[str]:
    """The README's Python blocks: each starts from ``import cbo``, and the test below runs them all."""
    return [b for b in code_blocks("python") if b.lstrip().startswith("import cbo")]


def test_every_python_block_is_run_by_a_test():
    assert self_contained_blocks() and self_contained_blocks() == code_blocks("python")


def test_the_manual_repeats_the_quick_start_word_for_word():
    from doc_examples import example

    assert example("readme-quickstart") == self_contained_blocks()[0]


@pytest.mark.model
def test_the_python_example_runs(tmp_path, monkeypatch):
    """The README's self-contained Python block, run as written; prune_depth gets smaller window counts (and a race
    of one round), and runs the default pipeline: refine, then the race."""
    import functools

    import cbo

    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    monkeypatch.chdir(tmp_path)
    small = dict(n_calibration=4, n_validation=4, seq_len=32, progress=False, select=32)  # a short race
    monkeypatch.setattr(cbo, "prune_depth", functools.partial(cbo.prune_depth, **small), raising=False)
    for block in self_contained_blocks():
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    folder = tmp_path / "pruned"
    assert (folder / "config.json").is_file() and (folder / "report.json").is_file()
    model = cbo.load_pruned(folder)
    assert model.config.num_hidden_layers == 30 - 8
    report = json.loads((folder / "report.json").read_text())
    assert report["options"]["search"]["refine"] > 0 and report["selection"]["windows"] == 32


def test_troubleshooting_lists_every_error_type():
    """Each exception type a user can meet has a row in the troubleshooting table (docs/reference/errors.md, moved
    there from the README)."""
    errors = (ROOT / "docs" / "reference" / "errors.md").read_text()
    section = errors.split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    names = error_types(Path(__file__).resolve().parents[1] / "cbo")
    assert {"InvalidOptionError", "CacheDirError", "SourceUnavailableError", "CorruptRdbError"} <= names
    missing = sorted(name for name in names - {"CBOError"} if f"`{name}`" not in section)
    assert missing == [], f"{missing} are missing from the troubleshooting section of docs/reference/errors.md"


def error_types(package: Path) -> set[str]:
    """The names of every CBOError subclass defined anywhere in ``package`` (read from the source, so that a type
    defined beside its module, such as CacheDirError in cbo/model/loading.py, is found without importing it)."""
    import ast

    bases: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases)
    found, grew = {"CBOError"}, True
    while grew:
        new = {name for name, parents in bases.items() if parents & found} - found
        found |= new
        grew = bool(new)
    return found
