"""The manual's hybrid example and architecture table (moved from the README): the `cbo prune ... --keep-kind mamba`
line of docs/guides/hybrid.md runs as written on a tiny hybrid model (only the model and M replaced), its Python twin
(`example("caps")`) runs in tests/test_docs_examples.py, and every hybrid family of `cbo.model.families` has its row
in the table of docs/concepts/kinds.md, whose kinds include those the family's blocks carry."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from cbo.model.families import ARCHITECTURES, hybrid_families, kind_parts

DOCS = Path(__file__).resolve().parents[1] / "docs"
GUIDE = (DOCS / "guides" / "hybrid.md").read_text()
TABLE = (DOCS / "concepts" / "kinds.md").read_text()


def _hybrid_line() -> list[str]:
    lines = [ln for ln in GUIDE.splitlines() if ln.startswith("cbo prune") and "--keep-kind" in ln]
    assert len(lines) == 1, "docs/guides/hybrid.md should hold one `cbo prune ... --keep-kind` line"
    return shlex.split(lines[0].split("  #")[0])


def _table_rows() -> dict[str, list[str]]:
    rows = {}
    for line in TABLE.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1].startswith("`"):
            for model_type in re.findall(r"`([a-z0-9_]+)`", cells[1]):
                rows[model_type] = cells
    return rows


pytestmark = pytest.mark.usefixtures("quiet_kernel_fallbacks")  # see tests/conftest.py


def test_every_hybrid_family_has_its_row():
    rows = _table_rows()
    for name, model_type, _fields in hybrid_families():
        assert model_type in rows, f"the architecture table of docs/concepts/kinds.md lacks {name} ({model_type})"
        assert rows[model_type][0] == name


@pytest.mark.parametrize("model_type", [t for _, t, _ in hybrid_families()])
def test_the_table_lists_the_kinds_of_the_family_blocks(model_type):
    from tiny_models import build_tiny_hybrid

    from cbo.model.blocks import find_blocks

    row = _table_rows()[model_type]
    model = build_tiny_hybrid(model_type, n_layers=4)
    for column, granularity in ((2, "layer"), (3, "sublayer")):
        listed = set(re.findall(r"`([a-z+]+)`", row[column]))
        if "the same" in row[column]:
            listed = set(re.findall(r"`([a-z+]+)`", row[2]))
        kinds = {b.kind for b in find_blocks(model, granularity)}
        assert kinds <= listed, (granularity, kinds, row[column])
        assert all(kind_parts(k) <= {"attention", "mamba", "mlp", "moe"} for k in listed)


def test_the_hybrid_command_line_runs(tmp_path, monkeypatch):
    from tiny_models import build_tiny_hybrid
    from tiny_texts import synthetic_novel
    from tiny_tokenizers import byte_level_tokenizer
    from typer.testing import CliRunner

    from cbo.cli import app, register_commands

    folder, text = tmp_path / "tiny-hybrid", tmp_path / "novel.txt"
    build_tiny_hybrid("granitemoehybrid", n_layers=4, vocab_size=260).save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    text.write_text(synthetic_novel())
    monkeypatch.setenv("CBO_HOME", str(tmp_path / "home"))
    register_commands()
    argv = _hybrid_line()[1:]  # drop "cbo"
    assert argv[0] == "prune" and ARCHITECTURES["granitemoehybrid"].hybrid
    argv[1] = str(folder)
    argv[argv.index("--remove") + 1] = "3"  # 8 halves, 2 of them Mamba: a tiny model cannot lose 6
    out = tmp_path / "out"
    small = ["--text", str(text), "--seq-len", "16", "--n-calibration", "4", "--n-validation", "3", "--top", "3"]
    res = CliRunner().invoke(app, [*argv, *small, "--validate", "2", "--solver", "enumerate", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    names = report["chosen"]["removed_names"]
    assert len(names) == 3 and not any("mamba" in n for n in names)
    assert sum(n.endswith(".attn") for n in names) <= 2
