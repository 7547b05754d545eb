"""Batched measurements of removal sets on a pool of token windows: in this process, or on a Ray pool of replicas.

The search methods (``cbo.baselines.evopress``, ``cbo.baselines.blockpruner``, ``cbo.search.refine``) ask one question: the per-window loss
(KL to the original model, or next-token cross-entropy) of many removal sets on some windows of a fixed pool.
:class:`Measurements` answers it, keeps every answer (so no (set, window) pair is measured twice and an
interrupted search loses nothing it checkpointed), and counts the work in forward-pass equivalents. The work
itself goes to an executor:

* :class:`InProcessExecutor` (default) measures in this process;
* :class:`RayExecutor` spreads the windows of a batch over Ray actors, each holding its own model replica (one
  per worker: one per device for users with many), and gives the same numbers: each window is measured the same
  way wherever it runs.

:class:`WindowLosses` is the one adapter to the measurer (``cbo.measure.measurer.RemovalLosses``): one
``RemovalLosses`` per window, kept in a small least-recently-used store so that its original pass (teacher
log-probabilities, the stream entering every layer) is paid once per window while it stays there.

Cost unit: one forward-pass equivalent (FPE) is one full forward pass of the model over one window. A
measurement costs what the measurer counts: each decoder-layer call and head run weighted by its parameters
against the whole model's (a layer replayed without a half by the parameters that stay), a full gated pass 1;
a window's setup (its original pass and the replay's check) is charged once per window by Measurements.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from cbo.checks import check_int
from cbo.errors import CBOError
from cbo.files import CheckpointFile

LOSSES = ("kl", "ce")
SetKey = tuple[int, ...]


def set_key(removed: Sequence[int]) -> SetKey:
    """The canonical key of a removal set: sorted distinct block indices."""
    return tuple(sorted({int(i) for i in removed}))


class WindowLosses:
    """Per-window losses of removal sets on a pool of windows, measured by ``cbo.measure.measurer``.

    Args:
        model: the causal LM (eval mode).
        blocks: the block list (``cbo.model.blocks.find_blocks``).
        windows: (W, T) token windows: the pool.
        keep_windows: how many windows keep their original pass in memory (each holds the teacher
            probabilities, T × vocabulary floats, and the stream entering each layer).
    """

    def __init__(self, model: Any, blocks: Sequence[Any], windows: Any, *, keep_windows: int = 32) -> None:
        import torch

        from cbo.model.forward import input_device

        self.model = model
        self.blocks = list(blocks)
        self.windows = torch.as_tensor(windows)
        if self.windows.ndim != 2 or self.windows.shape[0] < 1:
            raise CBOError(f"windows must be a (W, T) token tensor with W >= 1, got shape {tuple(self.windows.shape)}")
        self.keep_windows = max(1, int(keep_windows))
        self.device = input_device(model)
        self._meters: OrderedDict[int, Any] = OrderedDict()
        self.fpe = 0.0

    @property
    def n_windows(self) -> int:
        return int(self.windows.shape[0])

    def _meter(self, w: int) -> Any:
        from cbo.measure.measurer import RemovalLosses

        if w in self._meters:
            self._meters.move_to_end(w)
            return self._meters[w]
        meter = RemovalLosses(self.model, self.blocks, self.windows[w : w + 1].to(self.device))
        self._meters[w] = meter
        while len(self._meters) > self.keep_windows:
            self._meters.popitem(last=False)
        return meter

    def clear(self) -> None:
        """Drop every window's original pass (frees the memory; measuring again recomputes them)."""
        self._meters.clear()

    def measure(self, window: int, sets: Sequence[SetKey]) -> tuple[np.ndarray, np.ndarray, float]:
        """(KL, CE) of each set on one window, and the FPE spent (the window's original pass not included)."""
        if not 0 <= window < self.n_windows:
            raise CBOError(f"window {window} is out of range 0..{self.n_windows - 1}")
        meter = self._meter(window)
        # the window's setup (the original pass: teacher and streams, and the replay's check against it) is
        # charged by Measurements, once per window, so that the count does not depend on which replica still holds
        # a window; each set costs what the measurer counts (each call weighted by its parameters)
        meter.base  # noqa: B018 - runs the setup
        before = meter.cost
        values = meter.losses(sets)
        cost = meter.cost - before
        self.fpe += cost
        kl = np.array([float(v["kl"][0]) for v in values])
        ce = np.array([float(v["ce"][0]) for v in values])
        return kl, ce, cost


Request = tuple[int, list[SetKey]]  # (window, sets to measure on it)


class Executor(Protocol):
    """Measures a batch of requests; ``n_windows`` is the pool size every replica holds."""

    n_windows: int

    def run(self, requests: Sequence[Request]) -> list[tuple[np.ndarray, np.ndarray, float]]: ...

    def close(self) -> None: ...


class InProcessExecutor:
    """Measures in this process with one :class:`WindowLosses`."""

    def __init__(self, model: Any, blocks: Sequence[Any], windows: Any, *, keep_windows: int = 32) -> None:
        self.losses = WindowLosses(model, blocks, windows, keep_windows=keep_windows)
        self.n_windows = self.losses.n_windows

    def run(self, requests: Sequence[Request]) -> list[tuple[np.ndarray, np.ndarray, float]]:
        return [self.losses.measure(w, sets) for w, sets in requests]

    def close(self) -> None:
        self.losses.clear()


class _Replica:
    """A Ray actor body: one model replica and its window pool, built by the factory on the worker."""

    def __init__(self, factory: Callable[[], tuple[Any, Sequence[Any], Any]], keep_windows: int) -> None:
        model, blocks, windows = factory()
        self.losses = WindowLosses(model, blocks, windows, keep_windows=keep_windows)

    def n_windows(self) -> int:
        return self.losses.n_windows

    def run(self, requests: Sequence[Request]) -> list[tuple[np.ndarray, np.ndarray, float]]:
        return [self.losses.measure(w, sets) for w, sets in requests]


class RayExecutor:
    """A pool of Ray actors, one model replica each; a batch's windows are spread over them.

    Args:
        factory: a picklable callable returning ``(model, blocks, windows)`` on the worker (e.g. loads the model
            onto that worker's device); every replica must hold the same model and pool.
        workers: number of actors.
        address: Ray cluster address (None: start or join a local Ray).
        num_cpus / num_gpus: resources of each actor.
        keep_windows: windows each replica keeps its original pass for.

    Example:
        >>> ex = RayExecutor(make_replica, workers=4, num_gpus=1)   # doctest: +SKIP
        >>> m = Measurements(ex)                                    # doctest: +SKIP
    """

    def __init__(
        self,
        factory: Callable[[], tuple[Any, Sequence[Any], Any]],
        *,
        workers: int = 2,
        address: str | None = None,
        num_cpus: float = 1,
        num_gpus: float = 0,
        keep_windows: int = 32,
    ) -> None:
        from cbo.extras import require

        ray = require("ray", "the Ray pool of model replicas")
        check_int("workers", workers, 1)
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": max(workers, 1)}
            ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False, **kwargs)
        actor = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(_Replica)
        self.ray = ray
        self.actors = [actor.remote(factory, keep_windows) for _ in range(workers)]
        sizes = ray.get([a.n_windows.remote() for a in self.actors])
        if len(set(sizes)) != 1:
            raise CBOError(
                f"the replicas hold different window pools (sizes {sizes}); the factory must be deterministic"
            )
        self.n_windows = int(sizes[0])

    def run(self, requests: Sequence[Request]) -> list[tuple[np.ndarray, np.ndarray, float]]:
        # a window always goes to the same actor, so its original pass is made once and stays in that replica
        shares: list[list[int]] = [[] for _ in self.actors]
        for k, (w, _) in enumerate(requests):
            shares[w % len(self.actors)].append(k)
        futures = [
            (idx, actor.run.remote([requests[k] for k in idx])) for actor, idx in zip(self.actors, shares) if idx
        ]
        out: list[Any] = [None] * len(requests)
        for idx, future in futures:
            for k, value in zip(idx, self.ray.get(future)):
                out[k] = value
        return out

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []


class Measurements:
    """Every (set, window) loss measured so far, and the work spent; the measuring callable of the searches.

    ``m(sets, windows)`` returns the (n_sets, n_windows) KL matrix (``loss="ce"``: cross-entropy), measuring only
    the pairs not seen before as one batch handed to the executor. ``state()`` / ``restore()`` carry everything
    into a checkpoint, so that a resumed search reuses each finished measurement and counts the same cost.

    Args:
        executor: an :class:`InProcessExecutor` or :class:`RayExecutor`.
    """

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.n_windows = int(executor.n_windows)
        self.values: dict[SetKey, dict[int, tuple[float, float]]] = {}
        self.fpe = 0.0
        self.pairs = 0  # (set, window) pairs measured
        self.original: set[int] = set()  # windows whose original pass has been charged (1 FPE each)

    def __call__(self, sets: Sequence[Sequence[int]], windows: Sequence[int], loss: str = "kl") -> np.ndarray:
        if loss not in LOSSES:
            raise CBOError(f"unknown loss {loss!r}; valid: {list(LOSSES)}")
        keys = [set_key(s) for s in sets]
        windows = [int(w) for w in windows]
        bad = [w for w in windows if not 0 <= w < self.n_windows]
        if bad:
            raise CBOError(f"windows {bad} are out of range 0..{self.n_windows - 1}")
        todo: dict[int, list[SetKey]] = {}
        for key in dict.fromkeys(keys):
            have = self.values.get(key, {})
            for w in windows:
                if w not in have:
                    todo.setdefault(w, []).append(key)
        if todo:
            requests = [(w, sorted(todo[w])) for w in sorted(todo)]
            for (w, batch), (kl, ce, cost) in zip(requests, self.executor.run(requests)):
                for key, a, b in zip(batch, kl, ce):
                    self.values.setdefault(key, {})[w] = (float(a), float(b))
                self.fpe += float(cost) + (0.0 if w in self.original else 1.0)
                self.original.add(w)
                self.pairs += len(batch)
        col = 0 if loss == "kl" else 1
        return np.array([[self.values[k][w][col] for w in windows] for k in keys], dtype=np.float64).reshape(
            len(keys), len(windows)
        )

    def known(self, removed: Sequence[int]) -> list[int]:
        """The windows a set has been measured on."""
        return sorted(self.values.get(set_key(removed), {}))

    def state(self) -> dict[str, Any]:
        return {
            "fpe": self.fpe,
            "pairs": self.pairs,
            "original": sorted(self.original),
            "values": [[list(k), [[w, a, b] for w, (a, b) in sorted(v.items())]] for k, v in self.values.items()],
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.fpe = float(state["fpe"])
        self.pairs = int(state["pairs"])
        self.original = {int(w) for w in state.get("original", [])}
        self.values = {tuple(k): {int(w): (float(a), float(b)) for w, a, b in v} for k, v in state["values"]}
        self.original |= {w for v in self.values.values() for w in v}  # a measured window had its original pass


class SearchCheckpoint(CheckpointFile):
    """One JSON file holding a search's state (and its :class:`Measurements`), written atomically.

    A run writes it after each finished step (generation, round); a run started with the same ``identity`` reads
    it back and continues; a run whose identity differs (other options, other data) starts over.
    """

    def __init__(self, path: Any, identity: dict[str, Any]) -> None:
        super().__init__(path)
        self.identity = json_round_trip(identity)

    def load(self) -> dict[str, Any] | None:
        import json

        try:
            raw = self.read()
            data = json.loads(raw) if raw is not None else None
        except (OSError, ValueError) as exc:
            self.starting_over("unreadable", exc)
            return None
        if data is None:
            return None
        if not isinstance(data, dict) or data.get("identity") != self.identity or "state" not in data:
            self.starting_over("another run's")
            return None
        return data["state"]

    def save(self, state: dict[str, Any]) -> None:
        import json

        self.write(json.dumps({"identity": self.identity, "state": state}).encode())


def json_round_trip(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), so identities compare equal after a reload."""
    import json

    return json.loads(json.dumps(value))
