"""MkDocs hooks of the CBO manual (``mkdocs.yml``: ``hooks:``).

* The benchmark figures stay where the benchmarks write them (``benchmarks/results/**/*.png``): they are added to
  the site as ``benchmarks/results/...``, so a study page (``docs/benchmarks/NAME.md``) shows one as
  ``![...](results/search/full/search-layer-8-s0.png)`` and a missing figure is a broken link (a strict-build error).
* The project's docstrings head their examples ``Example:`` (STYLE.md); griffe's Google parser knows only
  ``Examples:`` as the section whose ``>>>`` lines render as code, so the singular is mapped to it here.
* Docstrings cross-reference in Sphinx's roles (``:func:`cbo.solve```), which Markdown leaves as text: the role
  is dropped from the rendered page and the name stays as code.
* The CLI reference is generated from the typer app at build time: a page holding ``<!-- cli-reference -->`` gets the
  Markdown that typer's own ``typer cbo.cli utils docs`` writes, for every registered command.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CLI_MARKER = "<!-- cli-reference -->"
SPHINX_ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|exc|obj):(?=<code>)")


def on_config(config):
    if str(ROOT) not in sys.path:  # the CLI reference documents this tree's cbo, whatever the venv has installed
        sys.path.insert(0, str(ROOT))
    try:  # griffe has no public option for the section title; without it an example renders as plain text
        from griffe import DocstringSectionKind
        from griffe._internal.docstrings import google

        google._section_kind.setdefault("example", DocstringSectionKind.examples)
    except (ImportError, AttributeError):  # another griffe: examples render as text, the build still passes
        pass
    return config


def on_files(files, config):
    for png in sorted(RESULTS.rglob("*.png")):
        src_uri = png.relative_to(ROOT).as_posix()  # benchmarks/results/...: beside docs/benchmarks/*.md
        files.append(File(src_uri, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def cli_reference() -> str:
    """Markdown for every ``cbo`` command: usage, arguments, options (typer's own docs generator)."""
    import typer
    import typer.main
    from typer.cli import get_docs_for_click

    from cbo.cli import app, register_commands

    register_commands()
    command = typer.main.get_command(app)
    assert Path(sys.modules["cbo"].__file__).resolve().parents[1] == ROOT, "the CLI reference of another tree's cbo"
    text = get_docs_for_click(obj=command, ctx=typer.Context(command), name="cbo", title="`cbo`")
    return text.split("\n", 1)[1]  # the page has its own title


def on_page_markdown(markdown, page, config, files):
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown


def on_page_content(html, page, config, files):
    return SPHINX_ROLE.sub("", html)
