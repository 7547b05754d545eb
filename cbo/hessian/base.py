"""The estimator interface and its registry.

An estimator is a small class with an explicit lifecycle:

Lifecycle:
    1. ``init_state()``: zeroed float64 accumulators (checkpointed after every batch);
    2. ``accumulate(state, batch_index, tokens, tick)``: one calibration batch, the gates already attached;
    3. ``finalize(state)``: (H, g, metadata).

The driver (:func:`cbo.hessian.driver.estimate_hessian`) owns everything else: block discovery, the gates
(always removed, also on error), the progress bar, the per-batch checkpoint, finiteness checks that name the
batch, the work accounting and the on-disk cache. A new estimator is one module in ``cbo/hessian/`` with a
class decorated with :func:`register`, and its module name in ``ESTIMATORS``'s built-ins.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from cbo.errors import DataError
from cbo.measure.losses import LOSSES
from cbo.model.forward import model_logits
from cbo.model.gates import Gates
from cbo.registry import Registry

ESTIMATORS: Registry[type[Estimator]] = Registry(
    "estimator",
    builtins=(
        "cbo.hessian.fisher",
        "cbo.hessian.paper",
        "cbo.hessian.exact",
        "cbo.hessian.pairwise",
        "cbo.hessian.hybrid",
        "cbo.hessian.singles",
        "cbo.hessian.fit",
        "cbo.hessian.trust",
    ),
)


@dataclass
class Run:
    """What an estimator sees of the run: the model with its gates, the loss, the batching and the work done.

    ``passes`` and ``fpe`` count the current batch's work (the driver sums them over batches):
    passes by kind, and forward work in forward-pass equivalents (one full forward over all calibration
    windows is 1; a measured removal set costs a fraction of one, see :class:`cbo.measure.measurer.Measurer`).
    """

    model: torch.nn.Module
    blocks: list
    gates: Gates
    loss: str
    seed: int
    seq_len: int
    n_sequences: int
    n_batches: int
    device: torch.device
    batch_size: int = 8
    passes: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0})
    fpe: float = 0.0
    # estimators whose batches are long (many passes each) call ``save_partial(state, batch_index)`` inside a
    # batch, with state that records how far the batch got; the driver checkpoints it at most every
    # PARTIAL_SAVE_INTERVAL_S seconds, and a resumed run re-enters that batch with that state
    save_partial: Callable[[dict[str, np.ndarray], int], None] = field(default=lambda state, batch_index: None)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of the gated model (counted as one forward pass over these tokens)."""
        self.passes["forward"] += 1
        self.fpe += tokens.shape[0] / self.n_sequences
        return model_logits(self.model, tokens)

    def count_backward(self, n: int = 1) -> None:
        self.passes["backward"] += n

    def measurer(self, tokens: torch.Tensor, cache: Any = None) -> Any:
        """A :class:`~cbo.measure.measurer.Measurer` of removal sets on ``tokens`` (one or more calibration
        batches) whose forward-pass equivalents are in this run's unit (all calibration windows)."""
        from cbo.measure.measurer import Measurer

        return Measurer(
            self.model,
            self.blocks,
            tokens,
            batch_size=self.batch_size,
            cache=cache,
            unit_windows=self.n_sequences,
        )

    def count_measured(self, work: Any) -> None:
        """Add a measurer's work (a :class:`~cbo.measure.measurer.Work`, or a difference of two) to this batch."""
        self.passes["forward"] += work.original_passes + work.full_passes
        self.fpe += work.fpe

    def check_finite(self, value: torch.Tensor | float, batch_index: int, what: str = "loss") -> None:
        """Raise DataError naming the batch when ``value`` holds NaN or inf."""
        t = torch.as_tensor(value)
        if not bool(torch.isfinite(t).all()):
            raise DataError(
                f"non-finite {what} in calibration batch {batch_index} (of {self.n_batches}): the model produced "
                "NaN/inf. Check the weights, use float32 or bfloat16 instead of float16, or drop that text."
            )

    def generator(self, *parts: int) -> torch.Generator:
        """A generator on the model's device seeded by the run seed and ``parts`` (batch, draw, ...)."""
        return seeded_generator(self.seed, *parts, device=self.device)


def seeded_generator(seed: int, *parts: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator whose seed is a hash of ``seed`` and ``parts``: independent of the batching history,
    so a resumed run draws the same labels as an uninterrupted one."""
    h = hashlib.sha256(json.dumps([int(seed), *[int(p) for p in parts]]).encode()).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(h[:8], "little") & ((1 << 63) - 1))
    return gen


class Estimator(ABC):
    """Base class of every Hessian estimator; subclasses register with :func:`register`."""

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    cost: ClassVar[str] = ""  # passes per calibration batch, for users choosing an estimator
    losses: ClassVar[tuple[str, ...]] = LOSSES
    needs_grad: ClassVar[bool] = True
    # whether it measures removal losses (then the measurer's version is part of its cache key)
    measures: ClassVar[bool] = False
    # options the pipeline fills in for estimators that refine their QUBO for one target (``fit``, ``trust``):
    # ``remove`` (M) and ``keep`` (blocks never removed), when the Options dataclass has those fields
    target_options: ClassVar[tuple[str, ...]] = ()

    @dataclass
    class Options:
        pass

    def __init__(self, run: Run, options: Any) -> None:
        self.run = run
        self.options = options

    def units_per_batch(self) -> int:
        """Progress-bar steps per batch (``accumulate`` calls ``tick`` that many times)."""
        return 1

    @abstractmethod
    def init_state(self) -> dict[str, np.ndarray]:
        """Zeroed float64 accumulators (saved in the checkpoint after each batch)."""

    @abstractmethod
    def accumulate(
        self, state: dict[str, np.ndarray], batch_index: int, tokens: torch.Tensor, tick: Callable[[], None]
    ) -> None:
        """Add one calibration batch to ``state`` in place; call ``tick()`` per progress unit."""

    @abstractmethod
    def finalize(self, state: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """(H, g, extra metadata) from the accumulated state."""


def register(cls: type[Estimator]) -> type[Estimator]:
    """Class decorator: add an estimator to :data:`ESTIMATORS` under its ``name`` (and ``aliases``)."""
    return ESTIMATORS.register(cls)


def names() -> list[str]:
    """Registered estimator names."""
    return ESTIMATORS.names()


def get(name: str) -> type[Estimator]:
    """The estimator class registered under ``name`` (UnknownNameError, listing the valid names, otherwise)."""
    return ESTIMATORS.get(name)


def describe() -> dict[str, dict[str, str]]:
    """Every estimator with its description, cost and supported losses."""
    return {
        n: {"description": c.description, "cost": c.cost, "losses": ", ".join(c.losses)} for n, c in ESTIMATORS.items()
    }
