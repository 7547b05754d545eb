"""Exception types raised by CBO. Every message names the bad value and what would be valid."""

from __future__ import annotations


class CBOError(Exception):
    """Base class of every error CBO raises on purpose."""


class InvalidQUBOError(CBOError, ValueError):
    """A QUBO's matrices, names, sizes or constraints are malformed."""


class InfeasibleError(CBOError, ValueError):
    """The constraints (M, keep, force, caps, budget) admit no state."""


class CorruptFileError(CBOError, IOError):
    """A saved file is truncated, edited or not a CBO file."""


class SolverError(CBOError, RuntimeError):
    """A solver was asked for something it cannot do, or failed."""


class UnknownNameError(CBOError, KeyError):
    """No implementation (solver, estimator, width score, baseline, ...) is registered under that name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class InvalidOptionError(CBOError, ValueError):
    """A registered implementation has no such option, or the option's value is not valid."""


class UnknownSolverError(UnknownNameError, SolverError):
    """No solver is registered under that name."""


class SolverOptionError(InvalidOptionError, SolverError):
    """A solver has no such option, or the option's value is not valid."""


class SolverUnavailableError(SolverError):
    """The solver exists but cannot run here (missing extra, no GPU, too large)."""


class MissingExtraError(CBOError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


class ModelError(CBOError, ValueError):
    """A model cannot be handled (unknown architecture, bad block list, ...)."""


class DataError(CBOError, ValueError):
    """Text or token data is unusable (too short, wrong tokenizer, ...)."""


class OutputPathError(CBOError, OSError):
    """An output file or folder cannot be written, or is a folder of other files that CBO must not replace."""
