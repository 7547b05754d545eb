"""The house rules of ``cbo/`` (STYLE.md), checked on the source: no import cycles, no private names imported
across modules, no oversized files, and the QUBO core importable without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "cbo"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    if not node.level:
        return node.module
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def import_edges() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Static imports between cbo modules (``{importer: {imported}}``) and the private names imported."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(mod, node, path.name == "__init__.py")
                if not target or not target.startswith("cbo"):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in mods:
                        edges[mod].add(sub)
                    else:
                        edges[mod].add(target)
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            private.append((mod, target, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("cbo"):
                        edges[mod].add(alias.name)
    return {m: {t for t in ts if t in mods and t != m} for m, ts in edges.items()}, private


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (the import cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    edges, _ = import_edges()
    assert strongly_connected(edges) == []


def test_no_private_names_imported_across_modules():
    _, private = import_edges()
    assert private == []


def test_no_oversized_files():
    big = {
        str(p.relative_to(ROOT.parent)): n
        for p in ROOT.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert big == {}


@pytest.mark.parametrize(
    "module", ["cbo", "cbo.solvers", "cbo.qubo.block_qubo", "cbo.qubo.states", "cbo.qubo.instances", "cbo.registry"]
)
def test_core_imports_without_torch(module):
    code = (
        "import sys, importlib\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'transformers'): raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"importlib.import_module({module!r})\n"
        "import cbo; cbo.solve(cbo.BlockQUBO([[1.0, 0.0], [0.0, 2.0]]), 1, 'enumerate')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_test_files_have_unique_basenames():
    # pytest imports test files by basename (no packages under tests/): two files of one name stop collection
    tests = Path(__file__).resolve().parent
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
