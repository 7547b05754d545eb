"""The Ray backend of the exact enumerator: the search sharded over Ray workers, the same result.

``cbo.solve(q, M, "enumerate", backend="ray", backend_options={"workers": 8})`` runs here; the
``backend_options`` are the fields of :class:`RayBackend`. Nothing here imports Ray until it is used
(the optional extra ``cbo[ray]``); :func:`init_ray`, :func:`shutdown` and :func:`release_workers` manage
the connection and the workers kept between solves (the solver sweep, :mod:`cbo.solvers.sweep`, uses them too).

The driver prepares the search once (:func:`cbo.solvers.enumerate.plan.plan_enumeration`: block order,
seeded threshold, prefix tasks) and cuts the task list, in lexicographic order, into contiguous
chunks holding about the same number of states (the leaves below each prefix). Each worker is a
Ray actor that builds the lookup tables once and searches the chunks it is handed, with its own
numba threads; chunks go to whichever worker is free, earliest prefixes first (with blocks ordered
by ascending removal cost they hold the good states, which tightens the threshold early).

Workers share the running K-th best through a small actor (the *board*): between batches a worker
offers its local K-th best and gets back the smallest one offered by anyone. Every offered value is
the energy of K distinct states, hence an upper bound on the global K-th best, so pruning with it
never cuts a state of the true top-K; the driver merges the workers' heaps into the K best.

A local Ray instance is started when none is running and no address is given; ``address`` (or
``RAY_ADDRESS``) connects to a cluster, e.g. ``ray://head:10001``.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cbo.checks import check_int, is_number
from cbo.errors import SolverError, SolverOptionError
from cbo.extras import require
from cbo.progress import progress_bar
from cbo.qubo.block_qubo import BlockQUBO
from cbo.solvers.base import Problem, SolverOutput
from cbo.solvers.enumerate.plan import SearchOptions, only_state, plan_enumeration
from cbo.solvers.enumerate.search import TaskResult, enumerate_tasks, merge_task_results


@dataclass
class RayBackend:
    """Where and how ``solve(..., "enumerate", backend="ray")`` runs the exact enumeration.

    Attributes:
        address: a Ray cluster (``"ray://host:10001"``, ``"auto"``, ``"host:6379"``); default: the
            ``RAY_ADDRESS`` environment variable, else a local instance is started.
        workers: Ray actors searching chunks (default: the cluster's CPUs / ``worker_threads``).
        worker_threads: numba threads per worker (each worker reserves that many CPUs).
        chunks_per_worker: the task list is cut into about ``workers × chunks_per_worker`` chunks of
            equal size (more where prefixes of different depths meet); more chunks balance better,
            fewer cost less scheduling.
        split: prefixes with more than 1/(workers × chunks_per_worker × split) of all states below
            them are split into their children (recursively), so that the few subtrees holding
            most of the work can be shared out.
        num_cpus: CPUs of a local instance started here (default: ``os.cpu_count()``).
        runtime_env: Ray runtime environment for cluster workers (e.g. ``{"pip": ["cbo[ray]"]}``).
        init_options: extra keyword arguments to ``ray.init``.
        keep_workers: keep the worker actors (and their loaded kernels) for the next solve, which
            then starts in a fraction of a second; they hold their CPUs until
            :func:`release_workers` or :func:`shutdown` (default: removed after each solve). Kept
            workers are used by every later solve with the same ``worker_threads``.
        ready_timeout: seconds to wait for the workers to start (an autoscaling cluster may need
            minutes to add nodes).
    """

    address: str | None = None
    workers: int | None = None
    worker_threads: int = 1
    chunks_per_worker: int = 8
    split: int = 32
    num_cpus: int | None = None
    runtime_env: dict[str, Any] | None = None
    init_options: dict[str, Any] = field(default_factory=dict)
    keep_workers: bool = False
    ready_timeout: float = 300.0

    def __post_init__(self) -> None:
        for name in ("workers", "num_cpus"):
            check_int(f"ray backend: {name}", getattr(self, name), 1, none_ok=True, error=SolverOptionError)
        if not is_number(self.ready_timeout) or not self.ready_timeout > 0:
            raise SolverOptionError(f"ray backend: ready_timeout must be > 0 seconds, got {self.ready_timeout!r}.")
        for name in ("worker_threads", "chunks_per_worker", "split"):
            check_int(f"ray backend: {name}", getattr(self, name), 1, error=SolverOptionError)


#: What the ``enumerate`` solver's ``backend_options`` build with ``backend="ray"``.
BACKEND_OPTIONS = RayBackend


# --------------------------------------------------------------------------------------- Ray setup
def init_ray(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    runtime_env: dict[str, Any] | None = None,
    **init_options: Any,
) -> Any:
    """Connect to Ray (the running instance, ``address``, ``RAY_ADDRESS``, or a new local one); returns ``ray``.

    Example:
        >>> ray = init_ray(num_cpus=2)        # doctest: +SKIP
    """
    ray = require("ray", "distributed solving")
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {"log_to_driver": False, **init_options}
    if runtime_env is not None:
        kwargs["runtime_env"] = runtime_env
    try:
        if address and address != "local":
            ray.init(address=address, **kwargs)
        else:
            kwargs.setdefault("include_dashboard", False)
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"the Ray cluster at {address!r}" if address and address != "local" else "a local Ray instance"
        raise SolverError(
            f"could not start or reach {where}: {exc}. Check the address (ray://host:10001, auto, host:port), "
            "or unset RAY_ADDRESS to start a local instance."
        ) from exc
    return ray


def shutdown() -> None:
    """Stop the Ray connection (and the local instance, if this process started one)."""
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        release_workers()
        ray.shutdown()
    _POOL.clear()


def cluster_cpus(ray: Any) -> int:
    """Total CPUs of the connected Ray cluster."""
    return int(ray.cluster_resources().get("CPU", 0))


# --------------------------------------------------------------------------------------- actors
class ThresholdBoard:
    """The global pruning threshold: the smallest K-th best energy any worker has offered."""

    def __init__(self) -> None:
        self.value = np.inf
        self.offers = 0

    def reset(self, value: float) -> None:
        self.value = float(value)
        self.offers = 0

    def offer(self, value: float) -> float:
        self.offers += 1
        if value < self.value:
            self.value = float(value)
        return self.value

    def get(self) -> float:
        return self.value

    def count(self) -> int:
        return self.offers


class EnumerationWorker:
    """Searches chunks of one plan's tasks; keeps the plan's tables (and its own K-th best) between chunks."""

    def __init__(self, threads: int) -> None:
        self.threads = int(threads)
        self.plan: Any = None
        self.board: Any = None
        self.best = np.inf
        self.warm: set[bool] = set()

    def load(self, plan: Any, board: Any) -> bool:
        """Take a new plan: build its tables and load its numba kernel (off the clock of the chunks)."""
        self.plan, self.board, self.best = plan, board, np.inf
        plan.tables()
        if plan.fast not in self.warm:
            _warm_kernels(plan.fast, self.threads)
            self.warm.add(plan.fast)
        return True

    def search(self, tasks: np.ndarray, seconds_left: float | None, batch_seconds: float) -> dict[str, Any]:
        """Search the subtrees of ``tasks`` (prefixes of one depth) with the shared threshold."""
        import ray

        plan = self.plan
        deadline = None if seconds_left is None else time.perf_counter() + seconds_left
        start = min(self.best, float(ray.get(self.board.get.remote())))

        def share(local_kth: float) -> float:
            return float(ray.get(self.board.offer.remote(min(local_kth, self.best))))

        t0, c0 = time.perf_counter(), time.process_time()
        res = enumerate_tasks(
            plan,
            tasks,
            threads=self.threads,
            threshold=start,
            batch_seconds=batch_seconds,
            time_left=None if deadline is None else (lambda: deadline - time.perf_counter()),
            share=share,
        )
        kth = res.kth(plan.k)
        if kth < self.best:
            self.best = kth
        self.board.offer.remote(self.best)
        return {
            "energies": res.energies,
            "positions": res.positions,
            "done": res.done,
            "nodes": res.nodes,
            "states": res.states,
            "pruned": res.pruned,
            "timed_out": res.timed_out,
            "interrupted": res.interrupted,
            "seconds": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0,
            "pid": os.getpid(),
        }


def _warm_kernels(fast: bool, threads: int) -> None:
    """Load (or compile) the numba kernel a plan uses by searching a tiny instance of the same kind."""
    tiny = Problem(BlockQUBO(np.eye(8)), remove=5 if fast else 2, k=2, seed=0, time_limit=None)
    enumerate_tasks(plan_enumeration(tiny), threads=threads)


@functools.cache
def _remote_classes(ray: Any) -> tuple[Any, Any]:
    return ray.remote(num_cpus=0)(ThresholdBoard), ray.remote(EnumerationWorker)


# Workers kept between solves (keep_workers=True), per Ray job and threads per worker.
_POOL: dict[tuple[str, int], tuple[Any, list[Any]]] = {}


def _job_key(ray: Any, threads: int) -> tuple[str, int]:
    return (str(ray.get_runtime_context().get_job_id()), int(threads))


def _workers(ray: Any, count: int, threads: int, keep: bool) -> tuple[Any, list[Any], list[Any]]:
    """A board and ``count`` workers, kept ones first; returns (board, workers, the ones to remove after)."""
    Board, Worker = _remote_classes(ray)
    key = _job_key(ray, threads)
    board, pooled = _POOL.get(key, (None, []))
    temporary: list[Any] = []
    if board is None:
        board = Board.remote()
        if not keep:
            temporary.append(board)
    actors = list(pooled[:count])
    missing = count - len(actors)
    if missing:
        free = float(ray.available_resources().get("CPU", 0.0))
        if missing * threads > free and _POOL:
            raise SolverError(
                f"ray backend: {missing} more workers need {missing * threads} free CPUs but only {free:g} are free; "
                "workers kept with keep_workers=True hold theirs: call cbo.solvers.enumerate.ray.release_workers()."
            )
        fresh = [Worker.options(num_cpus=threads).remote(threads) for _ in range(missing)]
        actors += fresh
        if keep:
            _POOL[key] = (board, list(pooled) + fresh)
        else:
            temporary += fresh
    return board, actors, temporary


def kept_workers() -> int:
    """How many workers ``keep_workers=True`` keeps now (in this process's Ray jobs)."""
    return sum(len(actors) for _, actors in _POOL.values())


def release_workers() -> None:
    """Remove the workers kept by ``keep_workers=True`` (their CPUs return to the cluster)."""
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        for board, actors in _POOL.values():
            for actor in [*actors, board]:
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001 - already gone with its job
                    pass
    _POOL.clear()


# --------------------------------------------------------------------------------------- splitting
def balanced_chunks(leaves: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """Cut a task list into at most ``parts`` contiguous (lo, hi) runs with about equal leaf sums.

    A task larger than the target share is a chunk of its own; every task is in exactly one chunk.
    """
    leaves = np.asarray(leaves, dtype=np.float64)
    m = len(leaves)
    if m == 0:
        return []
    parts = max(1, min(int(parts), m))
    cum = np.cumsum(leaves)
    total = float(cum[-1])
    bounds = [0]
    for j in range(1, parts):
        # first index whose cumulative sum reaches j/parts of the total
        cut = int(np.searchsorted(cum, total * j / parts, side="left")) + 1
        cut = min(max(cut, bounds[-1] + 1), m)
        if cut < m:
            bounds.append(cut)
    bounds.append(m)
    return [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]


def subtree_leaves(n: int, r: int, prefix: tuple[int, ...]) -> float:
    """States below a prefix (removed positions in search order): ``C(n − last − 1, r − depth)``."""
    if not prefix:
        return float(math.comb(n, r))
    return float(math.comb(n - prefix[-1] - 1, r - len(prefix)))


def split_tasks(n: int, r: int, tasks: np.ndarray, max_leaves: float, max_depth: int) -> list[np.ndarray]:
    """Replace every task with more than ``max_leaves`` states below it by its children, recursively.

    With blocks in ascending order of removal cost, the subtrees of the first prefixes are both the
    largest and the ones the bound cannot prune (they hold the best states), so the work of an
    exact search sits under a few leftmost prefixes; splitting by size cuts exactly those into
    pieces that different workers can take. Returns the tasks in lexicographic (search) order as
    runs of one depth each (the kernels take prefixes of one depth per call).
    """
    runs: list[list[tuple[int, ...]]] = []

    def emit(prefix: tuple[int, ...]) -> None:
        if runs and len(runs[-1][-1]) == len(prefix):
            runs[-1].append(prefix)
        else:
            runs.append([prefix])

    stack = [tuple(int(c) for c in t) for t in tasks[::-1]]
    while stack:
        prefix = stack.pop()
        d = len(prefix)
        if d >= max_depth or subtree_leaves(n, r, prefix) <= max_leaves:
            emit(prefix)
            continue
        first = prefix[-1] + 1 if prefix else 0
        # children: one more removed position c, leaving room for the r − d − 1 after it
        stack.extend(prefix + (c,) for c in range(n - r + d, first - 1, -1))
    return [np.array(run, dtype=np.int32).reshape(len(run), len(run[0])) for run in runs]


def plan_chunks(plan: Any, parts: int, split: int) -> list[np.ndarray]:
    """The task chunks of a plan: heavy prefixes split (to at most 1/(parts·split) of all states each),
    then each run of one depth cut into pieces of about 1/parts of the states."""
    n, r = plan.n, plan.r
    total = subtree_leaves(n, r, ())
    max_depth = plan.deepest_task
    max_depth = max(max_depth, plan.task_depth)
    runs = split_tasks(n, r, plan.tasks, total / (parts * split), max_depth)
    chunks: list[np.ndarray] = []
    for run in runs:
        leaves = np.array([subtree_leaves(n, r, tuple(t)) for t in run])
        pieces = max(1, int(math.ceil(leaves.sum() / (total / parts))))
        chunks.extend(run[lo:hi] for lo, hi in balanced_chunks(leaves, pieces))
    return chunks


# --------------------------------------------------------------------------------------- the driver
def run_backend(problem: Problem, options: SearchOptions | None, backend: RayBackend) -> SolverOutput:
    """Exact top-K of ``problem`` on Ray workers (the ``enumerate`` solver's search ``options`` apply)."""
    if options is None:
        options = SearchOptions()
    if options.threads is not None:
        raise SolverError(
            "with backend='ray' set the threads per worker with backend_options={'worker_threads': ...}, "
            f"not the enumerate option threads={options.threads!r}."
        )
    t_start = time.perf_counter()
    ray = init_ray(backend.address, num_cpus=backend.num_cpus, runtime_env=backend.runtime_env, **backend.init_options)
    t_ready = time.perf_counter()
    cpus = cluster_cpus(ray)
    workers = backend.workers or max(1, cpus // backend.worker_threads)
    if workers * backend.worker_threads > cpus:
        raise SolverError(
            f"ray backend: {workers} workers × {backend.worker_threads} threads need "
            f"{workers * backend.worker_threads} CPUs but the Ray cluster has {cpus}; lower workers or worker_threads."
        )
    parts = workers * backend.chunks_per_worker
    plan = plan_enumeration(problem, options)
    info: dict[str, Any] = {
        "backend": "ray",
        "workers": workers,
        "worker_threads": backend.worker_threads,
        "threads": workers * backend.worker_threads,
        **plan.info,
        "ray_address": backend.address or os.environ.get("RAY_ADDRESS") or "local",
        "ray_connect_s": round(t_ready - t_start, 3),
    }
    if plan.trivial:
        info.update(states=1, nodes=0, pruned=0)
        return SolverOutput(only_state(problem), exact=True, info=info)

    chunks = plan_chunks(plan, parts, backend.split)
    info["chunks"] = len(chunks)
    info["chunk_depths"] = sorted({int(c.shape[1]) for c in chunks})
    n_tasks = sum(len(c) for c in chunks)
    info["tasks"] = n_tasks
    board, actors, temporary = _workers(ray, workers, backend.worker_threads, backend.keep_workers)
    plan_ref = ray.put(plan)
    results: list[TaskResult] = []
    pending = list(chunks)
    running: dict[Any, Any] = {}
    interrupted = timed_out = failed = False
    t_loaded = time.perf_counter()
    done = 0
    desc = f"enumerate C({plan.n},{plan.r}) on Ray"
    bar = progress_bar(problem.progress, eta=False, total=n_tasks, unit="tasks", desc=desc, dynamic_ncols=True)
    totals = {"nodes": 0, "states": 0, "pruned": 0}
    cpu: dict[int, float] = {}  # CPU seconds of each worker process

    def collect(ref: Any) -> None:
        nonlocal done, timed_out, interrupted
        out = ray.get(ref)
        running.pop(ref)
        results.append(
            TaskResult(
                energies=out["energies"],
                positions=out["positions"],
                done=out["done"],
                timed_out=out["timed_out"],
                interrupted=out["interrupted"],
            )
        )
        done += out["done"]
        for key in totals:
            totals[key] += int(out[key])
        timed_out |= bool(out["timed_out"])
        interrupted |= bool(out["interrupted"])
        cpu[out["pid"]] = cpu.get(out["pid"], 0.0) + float(out["cpu_s"])
        bar.update(out["done"])

    def submit(actor: Any) -> None:
        tasks = pending.pop(0)
        left = problem.time_left()
        ref = actor.search.remote(tasks, None if math.isinf(left) else max(left, 0.0), options.batch_seconds)
        running[ref] = actor

    try:
        ray.get(board.reset.remote(plan.cap))
        loading = [a.load.remote(plan_ref, board) for a in actors]
        started, _ = ray.wait(loading, num_returns=len(loading), timeout=backend.ready_timeout)
        if len(started) < len(loading):
            raise SolverError(
                f"ray backend: only {len(started)} of {len(loading)} workers started within {backend.ready_timeout:g} s; "
                f"the cluster has {float(ray.available_resources().get('CPU', 0.0)):g} free CPUs. Lower workers, "
                "wait for the autoscaler (raise ready_timeout), or call cbo.solvers.enumerate.ray.release_workers()."
            )
        ray.get(loading)
        t_loaded = time.perf_counter()
        info["ray_workers_ready_s"] = round(t_loaded - t_ready, 3)
        for actor in actors:
            if pending:
                submit(actor)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            actor = running[ready[0]]
            collect(ready[0])
            if problem.time_left() <= 0:
                timed_out = timed_out or bool(pending)
                continue
            if pending:
                submit(actor)
    except ray.exceptions.RayError as exc:
        failed = True
        release_workers()  # a kept worker may be the one that died
        raise SolverError(
            f"a Ray worker failed: {exc}. On a cluster every node needs cbo and its dependencies: install "
            "them in the nodes' environment or pass backend_options={'runtime_env': {...}}."
        ) from exc
    except KeyboardInterrupt:
        interrupted = True
        # keep what already finished
        if running:
            ready, _ = ray.wait(list(running), num_returns=len(running), timeout=0)
            for ref in ready:
                collect(ref)
    finally:
        bar.close()
        if not (interrupted or failed):
            info["board_offers"] = int(ray.get(board.count.remote()))
        for actor in temporary:
            try:
                ray.kill(actor)
            except ray.exceptions.RayError:
                pass  # already gone

    E, S = merge_task_results(plan, results)
    info.update(
        nodes=totals["nodes"],
        states=totals["states"],
        pruned=totals["pruned"],
        tasks_done=done,
        interrupted=interrupted,
        timed_out=timed_out,
        worker_processes=len(cpu),
        worker_cpu_s=sorted((round(c, 3) for c in cpu.values()), reverse=True),
        search_s=round(time.perf_counter() - t_loaded, 3),
    )
    if not len(E) and plan.side:
        info["hint"] = "no state satisfies the caps and the parameter budget together"
    exact = not (interrupted or timed_out) and done == n_tasks
    return SolverOutput(plan.states(S), exact=exact, info=info)
