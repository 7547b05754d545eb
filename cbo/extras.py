"""Optional dependencies: one table from each importable module to the extra that installs it.

``require("qiskit", "QAOA")`` imports the module or raises :class:`MissingExtraError` whose message gives the
exact command, ``pip install 'cbo[qaoa]'``. Solvers and the QUBO core import without any extra.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from cbo.errors import MissingExtraError

# top-level module -> the extra of ``pyproject.toml`` that installs it ("core": a base dependency)
EXTRAS: dict[str, str] = {
    "numpy": "core",
    "numba": "core",
    "dimod": "core",
    "dwave": "core",
    "torch": "torch",
    "transformers": "torch",
    "accelerate": "torch",
    "gguf": "torch",
    "safetensors": "torch",
    "qiskit": "qaoa",
    "qiskit_optimization": "qaoa",
    "qiskit_aer": "qaoa",
    "ortools": "cpsat",
    "cupy": "gpu",
    "ray": "ray",
    "matplotlib": "plot",
    "peft": "peft",
    "pandas": "data",
    "scipy": "data",
    "lm_eval": "eval",
    "datasets": "eval",
}


def extra_of(module: str) -> str:
    """The extra that installs ``module`` (by its top-level package)."""
    return EXTRAS.get(module.split(".")[0], "all")


def install_command(module: str) -> str:
    """The pip command that installs ``module`` for this project."""
    extra = extra_of(module)
    return "pip install cbo" if extra == "core" else f"pip install 'cbo[{extra}]'"


def require(module: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise MissingExtraError naming the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = f" for {purpose}" if purpose else ""
        raise MissingExtraError(
            f"'{module}' is needed{why} but is not installed ({exc}). Install it with: {install_command(module)}"
        ) from exc


def has_module(module: str) -> bool:
    """True when ``module`` can be imported (without importing it twice on failure)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
