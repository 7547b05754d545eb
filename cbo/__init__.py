"""CBO: compress LLMs by removing blocks chosen with constrained binary optimization.

The public API is re-exported here; nothing is defined in this module. Model-side functions
(torch/transformers) are imported lazily so that the QUBO core and solvers import without torch.
"""

from cbo.errors import (
    CBOError,
    CorruptFileError,
    DataError,
    InfeasibleError,
    InvalidOptionError,
    InvalidQUBOError,
    MissingExtraError,
    ModelError,
    SolverError,
    SolverUnavailableError,
    UnknownNameError,
    UnknownSolverError,
)
from cbo.lazy import lazy_getattr
from cbo.qubo.block_qubo import BlockQUBO, Constraints
from cbo.qubo.states import RankedStates, State
from cbo.solvers.base import solve

__version__ = "0.1.0"

# Model-side API, imported on first use so that `import cbo` does not import torch.
_LAZY = {
    "estimate_hessian": "cbo.hessian",
    "Measurer": "cbo.measure.measurer",
    "prune_depth": "cbo.pipeline",
    "compress": "cbo.pipeline",
    "DepthReport": "cbo.pipeline",
    "Data": "cbo.pipeline",
    "Estimate": "cbo.pipeline",
    "Search": "cbo.pipeline",
    "Run": "cbo.pipeline",
    "load_model": "cbo.model.loading",
    "remove_blocks": "cbo.surgery.depth",
    "save_pruned": "cbo.surgery.io",
    "load_pruned": "cbo.surgery.io",
    "heal": "cbo.recovery.healing",
    "evaluate_tasks": "cbo.downstream.harness",
    "convert_gguf": "cbo.data.convert",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "BlockQUBO",
    "CBOError",
    "Constraints",
    "CorruptFileError",
    "DataError",
    "InfeasibleError",
    "InvalidOptionError",
    "InvalidQUBOError",
    "MissingExtraError",
    "ModelError",
    "RankedStates",
    "SolverError",
    "SolverUnavailableError",
    "State",
    "UnknownNameError",
    "UnknownSolverError",
    "solve",
]
