"""Running a plan's tasks: the kernels on numba threads in a worker thread, and merging results.

Tasks are handed out to the threads dynamically (an atomic counter); every thread keeps its own max-heap
of K states, and the pruning threshold is the smallest K-th best over all threads or the plan's seeded cap
(:mod:`cbo.solvers.enumerate.heap`, :mod:`cbo.solvers.enumerate.threads`). The search runs in a worker
thread (the kernels release the GIL) while the caller watches the time limit and Ctrl-C; either sets a
flag that every thread checks at each node, and the best states found so far come back marked inexact.
Without caps or a parameter budget and for r >= 3 the fused kernel runs
(:mod:`cbo.solvers.enumerate.fused`), else the generic one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numba
import numpy as np

from cbo.errors import SolverError
from cbo.solvers.enumerate.fused import batch_fused
from cbo.solvers.enumerate.generic import batch_generic
from cbo.solvers.enumerate.plan import EnumerationPlan
from cbo.solvers.enumerate.threads import NSTATS, PAD

# How often the caller checks the time limit while the search runs in its worker thread.
POLL_SECONDS = 0.02


@dataclass
class TaskResult:
    """What :func:`enumerate_tasks` found: at most ``k`` states per thread with their reduced energies.

    Attributes:
        energies: (B,) reduced energies (without the plan's ``const``), ascending.
        positions: (B, r) removed positions in search order (``plan.states`` maps them to full states).
        done: how many of the given tasks were searched completely.
        nodes / states / pruned: search statistics.
        interrupted / timed_out: why the search stopped early, if it did.
        relaxations / relax_pruned: convex relaxations solved, and nodes they pruned.
    """

    energies: np.ndarray
    positions: np.ndarray
    done: int
    nodes: int = 0
    states: int = 0
    pruned: int = 0
    interrupted: bool = False
    timed_out: bool = False
    relaxations: int = 0
    relax_pruned: int = 0

    def kth(self, k: int) -> float:
        """The k-th best energy found (an upper bound on the true k-th best), or inf with fewer states."""
        return float(self.energies[k - 1]) if len(self.energies) >= k else np.inf


def enumerate_tasks(
    plan: EnumerationPlan,
    tasks: np.ndarray | None = None,
    *,
    threads: int | None = None,
    threshold: float = np.inf,
    batch_seconds: float = 0.2,
    time_left: Callable[[], float] | None = None,
    share: Callable[[float], float] | None = None,
    progress: Callable[[int], Any] | None = None,
    stop: Callable[[], bool] | None = None,
) -> TaskResult:
    """Search the subtrees of ``tasks`` (default: all of the plan's) and return the best states found.

    Only states below the pruning threshold are kept: the smaller of the plan's seeded cap, the
    ``threshold`` given (an upper bound on the global K-th best, e.g. from other workers), and the
    K-th best found so far. The search runs in a worker thread while the calling thread watches the
    time limit and Ctrl-C; either stops it within a node, keeping the states found so far. With
    ``progress`` or ``share``, tasks run in batches of about ``batch_seconds``; after each, ``progress``
    is told, and ``share(local K-th best)`` returns a new global threshold, so that searches on other
    processes prune with each other's finds. Without them, all tasks run in one parallel region.

    Args:
        plan: from :func:`plan_enumeration`.
        tasks: (T, task_depth) prefixes, a subset of ``plan.tasks``.
        threads: numba threads (default: ``numba.get_num_threads()``).
        threshold: starting threshold in reduced energy (without ``plan.const``).
        batch_seconds: target duration of one batch.
        time_left: seconds left (a callable); the search stops, marked ``timed_out``, at 0.
        share: called between batches with the local K-th best (inf until K states are found);
            returns the threshold to prune with.
        progress: called with the number of tasks finished in each batch.
        stop: polled while the search runs; True stops it, marked ``interrupted`` (e.g. after Ctrl-C).
    """
    tasks = plan.tasks if tasks is None else np.ascontiguousarray(tasks, dtype=np.int32)
    ntasks = len(tasks)
    r, K = plan.r, plan.k
    deepest = plan.deepest_task
    if tasks.ndim != 2 or tasks.shape[1] > deepest:
        raise SolverError(
            f"tasks must be a 2-D array of prefixes of depth <= {deepest} for this plan, got shape {tasks.shape}."
        )
    nth = int(threads) if threads is not None else numba.get_num_threads()
    Q, fast, use_bound, slack = plan.Q, plan.fast, plan.use_bound, plan.slack
    T, pairs, rx, tl = plan.tables()
    sa = plan.side_arrays
    heap_e = np.full((nth, K), np.inf)
    heap_s = np.zeros((nth, K, r), dtype=np.int32)
    heap_n = np.zeros(nth * PAD, dtype=np.int64)
    thr = np.full(nth * PAD, np.inf)
    stats = np.zeros((nth, NSTATS), dtype=np.int64)
    counter = np.zeros(1, dtype=np.int64)
    halt = np.zeros(1, dtype=np.int64)
    stop_requested = stop
    failure: list[BaseException] = []

    def run_batch(lo: int, hi: int, cap: float) -> None:
        counter[0] = 0
        if fast:
            pa, pb, QP, W, woff = pairs
            batch_fused(
                Q, T, QP, W, woff, pa, pb, r, tasks, lo, hi, counter, use_bound, heap_e, heap_s, heap_n, thr, nth,
                cap, slack, stats, halt, rx, tl,
            )  # fmt: skip
        else:
            batch_generic(
                Q, T, r, tasks, lo, hi, counter, use_bound, plan.side, sa["kind"], sa["capk"], sa["size"], sa["pmin"],
                sa["pmax"], sa["minsum"], sa["maxsum"], sa["avail"], heap_e, heap_s, heap_n, thr, nth, cap, slack,
                stats, halt, rx,
            )  # fmt: skip

    def left() -> float:
        return float("inf") if time_left is None else time_left()

    def work() -> None:
        # runs in its own thread so that the caller stays responsive to the time limit and Ctrl-C;
        # the kernels release the GIL and stop within a node of ``halt`` being set
        try:
            numba.set_num_threads(nth)  # per-thread setting
            cap = min(plan.cap, float(threshold))
            done = 0
            # batches only serve progress reports and threshold sharing (the stop flag handles the
            # time limit); without either, one parallel region runs every task
            batch = ntasks if progress is None and share is None else min(ntasks, 2 * nth)
            while done < ntasks and halt[0] == 0:
                hi = min(ntasks, done + batch)
                t0 = time.perf_counter()
                run_batch(done, hi, cap)
                dt = time.perf_counter() - t0
                if halt[0] != 0:
                    break
                if progress is not None:
                    progress(hi - done)
                step = hi - done
                done = hi
                if share is not None:
                    cap = min(cap, float(share(float(thr[::PAD].min()))))
                budget = min(batch_seconds, max(left(), 1e-3))
                rate = step / max(dt, 1e-6)
                batch = int(min(max(rate * budget, nth), 4 * step + nth))
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
            halt[0] = 1

    interrupted = timed_out = False
    worker = threading.Thread(target=work, name="cbo-enumerate", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(timeout=POLL_SECONDS)
            if worker.is_alive() and stop_requested is not None and stop_requested():
                interrupted = True
                halt[0] = 1
            elif worker.is_alive() and left() <= 0:
                timed_out = True
                halt[0] = 1
    except KeyboardInterrupt:
        interrupted = True
        halt[0] = 1
        worker.join()
    if failure:
        raise failure[0]

    # merge the per-thread heaps
    counts = heap_n[::PAD]
    E = np.concatenate([heap_e[t, : counts[t]] for t in range(nth)])
    S = np.concatenate([heap_s[t, : counts[t]] for t in range(nth)]).reshape(-1, r)
    order = np.argsort(E, kind="stable")[:K]
    tot = stats.sum(0)
    complete = int(tot[3]) == ntasks
    return TaskResult(
        energies=E[order],
        positions=S[order],
        done=int(tot[3]),
        nodes=int(tot[0]),
        states=int(tot[1]),
        pruned=int(tot[2]),
        interrupted=interrupted and not complete,
        timed_out=timed_out and not complete,
        relaxations=int(tot[4]),
        relax_pruned=int(tot[5]),
    )


def merge_task_results(plan: EnumerationPlan, results: Iterable[TaskResult]) -> tuple[np.ndarray, np.ndarray]:
    """The K best (reduced energies, positions) over several results; with a warm start, only those
    at or below it."""
    results = list(results)
    # the heuristic's states take part: a search stopped early may not have reached its threshold
    E = np.concatenate([plan.seed_energies] + [res.energies for res in results])
    S = np.concatenate(
        [plan.seed_positions.reshape(-1, plan.r)] + [res.positions.reshape(-1, plan.r) for res in results]
    )
    S = np.sort(S, axis=1).astype(np.int32)
    if len(S):
        S, first = np.unique(S, axis=0, return_index=True)
        E = E[first]
    order = np.argsort(E, kind="stable")[: plan.k]
    E, S = E[order], S[order]
    if plan.warm_start is not None:
        keep = E + plan.const <= plan.warm_start + plan.slack
        E, S = E[keep], S[keep]
    return E, S
