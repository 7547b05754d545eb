"""The house rules of ``cbo/`` (STYLE.md), checked on the source: no import cycles, no private names imported
across modules, no oversized files, and the QUBO core importable without torch."""

from __future__ import annotations

import ast
import inspect
import re
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


# ---------------------------------------------------------------------------------------- the second step of the house
MAX_PARAMETERS = 16
GROUND_FLOOR = 12


def _compiled(node: ast.FunctionDef) -> bool:
    """A numba kernel (``@njit``/``@jit``, bare or called): its parameter list is its ABI, exempt from the limit."""
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("njit", "jit"):
            return True
    return False


def long_signatures(root: Path) -> dict[str, int]:
    """``{"file:line name": parameter count}`` of the functions outside ``cli/`` with too many parameters."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        if "cli" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _compiled(node):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            n = len(params) + (a.vararg is not None) + (a.kwarg is not None)
            n -= bool(params) and params[0].arg in ("self", "cls")
            if n > MAX_PARAMETERS:
                out[f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"] = n
    return out


def test_the_signature_checker_counts_parameters(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    many = ", ".join(f"a{i}" for i in range(MAX_PARAMETERS))
    (pkg / "m.py").write_text(
        f"def ok(self, {many}): pass\ndef bad({many}, *, extra): pass\n@njit(cache=True)\ndef kernel({many}, x): pass\n"
    )
    assert long_signatures(pkg) == {"pkg/m.py:2 bad": MAX_PARAMETERS + 1}


def test_no_long_parameter_lists_outside_the_cli():
    assert long_signatures(ROOT) == {}


def test_a_top_level_of_rooms():
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(loose) <= GROUND_FLOOR, loose


def test_measurement_lives_in_its_own_package():
    hessian = {p.stem for p in (ROOT / "hessian").glob("*.py")}
    assert not hessian & {"measure", "measurer", "measure_cache", "replay", "executors"}
    assert {"measurer", "cache", "replay", "executors"} <= {p.stem for p in (ROOT / "measure").glob("*.py")}


# an argument check written inline instead of with cbo.checks (is_int / is_number / check_int / check_float ...)
INLINE_CHECK = re.compile(
    r"isinstance\([^()]*,\s*bool\)\s+or\s+not\s+isinstance"
    r"|isinstance\([^()]*\)\s+and\s+not\s+isinstance\([^()]*,\s*bool\)"
    r"|not\s+isinstance\([^()]*,\s*bool\)\s+and\s+isinstance"
)


def _source_files() -> dict[str, str]:
    return {str(p.relative_to(ROOT.parent)): p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def test_argument_checks_live_in_one_module():
    inline = [
        f"{name}:{i}"
        for name, text in _source_files().items()
        if name != "cbo/checks.py"
        for i, line in enumerate(text.splitlines(), 1)
        if INLINE_CHECK.search(line)
    ]
    assert inline == []
    assert INLINE_CHECK.search("if isinstance(v, bool) or not isinstance(v, int) or v < 1:")


def test_one_checkpoint_writer_one_null_bar_one_device_helper():
    """Every checkpoint class writes through cbo.files.CheckpointFile (atomic); no other tmp + rename writes; one
    null progress bar and one place that makes bars (cbo.progress); one helper for the device a model's inputs go
    to (cbo.model.forward)."""
    checkpoints, bars, devices, renames = {}, [], [], []
    for name, text in _source_files().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Checkpoint"):
                checkpoints[f"{name}:{node.name}"] = [ast.unparse(b) for b in node.bases]
            if isinstance(node, ast.ClassDef) and ("NoBar" in node.name or "NullBar" in node.name):
                bars.append(f"{name}:{node.name}")
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_device") and "device" in node.name:
                devices.append(f"{name}:{node.name}")
        if name != "cbo/files.py" and "os.replace(" in text:
            renames.append(name)
        if name != "cbo/progress.py" and "from tqdm" in text:
            bars.append(f"{name}: tqdm")
    assert len(checkpoints) >= 3 and all(bases == ["CheckpointFile"] for bases in checkpoints.values()), checkpoints
    assert bars == ["cbo/progress.py:NullBar"] and renames == []
    assert [d for d in devices if d.endswith((":model_device", ":input_device"))] == [
        "cbo/model/forward.py:input_device"
    ]


def test_every_measured_loss_comes_through_one_of_the_two_doors_the_measure_package_names():
    """cbo/measure/__init__.py says every measured loss comes from the replay engine through the Measurer or the
    search executors; no other module builds the engine (the text said "through the Measurer" while EvoPress,
    BlockPruner and refine went through the executors)."""
    builders = sorted(
        name for name, text in _source_files().items() if "RemovalLosses(" in text and name != "cbo/measure/replay.py"
    )
    assert builders == ["cbo/measure/executors.py", "cbo/measure/measurer.py"]
    doc = (ROOT / "measure" / "__init__.py").read_text()
    assert "Measurer" in doc and "Measurements" in doc and "EvoPress, BlockPruner and refine" in doc


DOC_SECTION = re.compile(
    r"^(Args|Returns|Raises|Yields|Example|Examples|Note|Notes|Attributes|Lifecycle|Class attributes):\s*$"
)


def stray_paragraphs(doc: str) -> list[str]:
    """Unindented prose lines inside a docstring's Args section (prose belongs above Args or in a section)."""
    stray, in_args = [], False
    for line in inspect.cleandoc(doc).splitlines():
        if DOC_SECTION.match(line):
            in_args = line.startswith("Args")
        elif in_args and line.strip() and not line.startswith(" "):
            stray.append(line)
            in_args = False
    return stray


def test_no_prose_splits_an_args_section():
    assert stray_paragraphs("One line.\n\nArgs:\n    a: x.\n\nCtrl-C stops it.\n\nExample:\n    >>> f()") == [
        "Ctrl-C stops it."
    ]
    found = [
        f"{name}:{node.lineno} {node.name}"
        for name, text in _source_files().items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        and (doc := ast.get_docstring(node, clean=False))
        and stray_paragraphs(doc)
    ]
    assert found == []


@pytest.mark.parametrize("folder", ["benchmarks", "scripts"])
def test_no_oversized_files_beside_the_package(folder):
    base = ROOT.parent / folder
    big = {
        str(p.relative_to(ROOT.parent)): n
        for p in base.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert big == {}


def test_the_results_tree_holds_summaries_only():
    """What BENCHMARKS.md cites (JSON summaries, Markdown, PNG); checkpoints, caches, logs and runs go to out/."""
    repo = ROOT.parent
    tracked = subprocess.run(
        ["git", "ls-files", "benchmarks"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.split()
    results = [p for p in tracked if p.startswith("benchmarks/results/")]
    leftovers = [
        p
        for p in results
        if not p.endswith((".json", ".md", ".png"))
        or ".ckpt" in p
        or any(part in ("cache", "run", "runs", "out", "logs") for part in p.split("/"))
    ]
    assert leftovers == []
    machine_paths = [
        p
        for p in tracked
        if p.endswith((".sh", ".py"))
        and any(s in (repo / p).read_text() for s in ("/tmp/", "/work/", "/root/", "/home/"))
    ]
    assert machine_paths == []
