"""The manual (docs/, mkdocs.yml) builds with ``mkdocs build --strict``: a broken link or anchor, a page missing from
the nav, or a docstring that no longer renders fails here. Its code blocks each run in a test, parse, or say why they
cannot (tests/doc_examples.py); the README stays the short front door, its links resolve, and the site's front page
holds the README's quick start and results table."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from doc_examples import ROOT, all_blocks, cbo_lines, example, shell_lines
from test_readme import resolve

README = ROOT / "README.md"
MAX_README_BYTES = 8 * 1024


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once with --strict (about 5-10 s)."""
    pytest.importorskip("mkdocs", reason="the manual needs the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    warnings = [line for line in res.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert res.returncode == 0 and warnings == [], res.stderr[-4000:]
    return out


def html(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text() if page else (site / "index.html").read_text()


def text_of(markup: str, sep: str = " ") -> str:
    """The text of a page, tags replaced by ``sep`` ("" keeps highlighted code whole: ``cbo.solve``)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", sep, markup))


def test_the_api_reference_shows_the_parameters_of_prune_depth(site):
    import inspect

    from cbo.pipeline.depth import prune_depth

    page = html(site, "reference/api/pipeline")
    assert 'id="cbo.pipeline.depth.prune_depth"' in page
    section = page.split('id="cbo.pipeline.depth.prune_depth"', 1)[1].split('class="doc doc-object doc-', 1)[0]
    assert "Parameters:" in text_of(section)
    documented = ("model", "tokenizer", "text", "remove", "method", "granularity", "keep", "caps")
    assert set(documented) <= set(inspect.signature(prune_depth).parameters)
    for name in documented:
        assert f"<code>{name}</code>" in section, f"prune_depth's parameter {name!r} is not rendered"


def command_paths() -> list[str]:
    """Every command of the typer app, as ``cbo qubo info``."""
    import typer.main

    from cbo.cli import app, register_commands

    register_commands()
    found = []

    def walk(command, path):
        if hasattr(command, "list_commands"):
            ctx = command.make_context(path[-1], [], resilient_parsing=True)
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), [*path, name])
        else:
            found.append(" ".join(path))

    walk(typer.main.get_command(app), ["cbo"])
    return found


def test_the_cli_reference_lists_every_command(site):
    page = text_of(html(site, "reference/cli"))
    commands = command_paths()
    assert len(commands) >= 15 and "cbo qubo info" in commands
    missing = [c for c in commands if f"$ {c} " not in page and f"$ {c}\n" not in page]
    assert missing == [], f"the CLI reference lacks {missing}"


def test_the_front_page_holds_the_quick_start_and_the_results_table(site):
    page = text_of(html(site, ""), sep="")
    assert "Quick start" in page and "cbo.prune_depth" in page and "cbo.solve" in page
    assert "Does it work?" in page and "CBO default" in page and "EvoPress" in page and "346.1" in page


def test_the_benchmark_figures_are_served(site):
    for page in ("benchmarks/grid", "benchmarks/width", "concepts/states"):
        images = re.findall(r'<img [^>]*src="([^"]+\.png)"', html(site, page))
        assert images, page
        for src in images:
            assert (site / page / src).resolve().is_file(), (page, src)


def test_every_code_block_runs_parses_or_says_why_not():
    unmarked = []
    for block in all_blocks():
        if block.language not in ("python", "bash", "sh", "console"):
            continue
        if block.marker == "not-run":
            assert len(block.detail) > 10, f"{block.where()}: a not-run block needs its reason"
        elif block.marker == "example":
            assert block.name, f"{block.where()}: an example needs a name"
        elif block.language == "python" or not all(line.startswith("cbo ") for line in shell_lines(block.code)):
            unmarked.append(block.where())
    assert unmarked == [], f"blocks neither run, parsed, nor marked `<!-- not-run: why -->`: {unmarked}"


def test_every_named_example_is_run_by_a_test():
    names = sorted({b.name for b in all_blocks() if b.marker == "example"})
    for name in names:
        example(name)  # one code per name: a repeated example is repeated word for word
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    missing = [n for n in names if f'example("{n}")' not in sources]
    assert missing == [], f"no test calls example(...) for {missing}"


@pytest.mark.parametrize("where, line", cbo_lines())
def test_each_docs_command_line_parses(where, line):
    """As the README's: the command exists, each option is one of its options, click accepts the whole line."""
    command, args = resolve(shlex.split(line)[1:])
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for token in args:
        if token.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", token):
            assert token.split("=")[0] in known, f"{where}: {token} is not an option of `{command.name}`"
    assert command.make_context(command.name, list(args), resilient_parsing=False) is not None


def test_the_benchmark_commands_name_existing_scripts():
    modules = set()
    for block in all_blocks():
        modules |= set(re.findall(r"-m (benchmarks\.[a-z_]+)", block.code))
        for script in re.findall(r"(benchmarks/drivers/[\w.]+\.sh)", block.code):
            assert (ROOT / script).is_file(), f"{block.where()}: {script}"
    assert len(modules) >= 15
    assert [m for m in sorted(modules) if importlib.util.find_spec(m) is None] == []


def test_the_readme_is_the_short_front_door():
    text = README.read_text()
    assert len(text.encode()) <= MAX_README_BYTES, f"README.md is {len(text.encode())} bytes"
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block.start() < 200, "the two commands open the README"
    first, second = first_block.group(1).splitlines()[:2]
    assert first.startswith("make demo ") and second.startswith("make test ")


def test_the_front_page_copies_the_readme():
    """The site's index.md holds the README's quick start and results table word for word."""
    readme, index = README.read_text(), (ROOT / "docs" / "index.md").read_text()
    quick = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert f"```python\n{quick}```" in index
    table = re.search(r"\n(\| method \|.*?)\n\n", readme, re.S).group(1)
    assert table in index


@pytest.mark.parametrize("path", ["README.md", "BENCHMARKS.md", "notebooks/README.md"])
def test_links_outside_the_site_resolve(path):
    """mkdocs checks the links inside docs/; these files are read on GitHub and beside the code."""
    source = ROOT / path
    broken = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", source.read_text()):
        if not target.startswith(("http://", "https://", "mailto:")) and not (source.parent / target).exists():
            broken.append(target)
    assert broken == []
