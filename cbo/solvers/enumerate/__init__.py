"""Exact top-K: depth-first branch and bound over all states with Σx = M, by one of two strategies.

*Lexicographic*: the free blocks (not kept, not forced) are reordered (by ascending diagonal by default, so
that good states come early) and the states are visited in lexicographic order of their removed positions.
Every node keeps the field ``f_j = Q_jj + Σ_{i chosen} Q_ij`` of each candidate ``j``, so adding ``j`` costs
``f_j``; lower bounds prune prefixes whose every completion is worse than the K-th best found so far.
*Relaxation*: blocks are decided one at a time and every node is bounded by a shifted least-squares
relaxation with the cardinality constraint (a sphere decoder); it proves the large Fisher-type QUBOs the
lexicographic search cannot. :mod:`.strategy` chooses between them from the size of the space.

Modules:

* :mod:`.solver` — the ``enumerate`` solver; it picks the strategy and runs the search on a backend:
  ``local`` (numba threads), ``ray`` (:mod:`.ray`, the lexicographic search sharded over Ray workers) or
  ``gpu`` (:mod:`.gpu`, full enumeration on CUDA, also the ``enumerate-gpu`` solver; kernel source and CPU
  emulator in :mod:`.gpu_kernel`).
* :mod:`.strategy` — which search runs; :mod:`.relaxation_run` — the relaxation strategy for a ``Problem``
  (seeded by ``auto``'s heuristic, :mod:`cbo.solvers.heuristic`); :mod:`.relaxation` — the bound and the Shor
  shift (numpy); :mod:`.relaxation_search` — the resumable search, its subtrees and threads;
  :mod:`.relaxation_kernel` — its numba kernel.
* :mod:`.plan` — the plan/task API: :func:`plan_enumeration` prepares a search whose tasks (prefixes)
  partition the states; :mod:`.search` runs any subset of them (``enumerate_tasks``) and merges results
  (``merge_task_results``), for sharding over processes or machines.
* :mod:`.seeding` — states known in advance and the pruning threshold they prove.
* :mod:`.bounds` — the lower bounds (per-row, convex relaxation) and their interface.
* numba kernels: :mod:`.fused` (no caps/budget, r ≥ 3), :mod:`.generic` (caps, budget, small r),
  :mod:`.tail` (flat enumeration of the last blocks), :mod:`.heap` (per-thread heaps, shared threshold),
  :mod:`.threads` (atomics, task hand-out, work arrays).

Example:
    >>> import numpy as np, cbo
    >>> from cbo.solvers.base import Problem
    >>> problem = Problem(cbo.BlockQUBO(np.diag([3.0, 1.0, 2.0, 0.5])), remove=2, k=2, seed=0, time_limit=None)
    >>> plan = plan_enumeration(problem)
    >>> energies, positions = merge_task_results(plan, [enumerate_tasks(plan)])
    >>> plan.states(positions).tolist()
    [[0, 1, 0, 1], [0, 0, 1, 1]]
"""

from cbo.solvers.enumerate.kernel_cache import drop_stale_kernels

# before any kernel loads: cached kernels compiled against an older version of a callee are dropped
drop_stale_kernels()

from cbo.solvers.enumerate.plan import EnumerationPlan, SearchOptions, plan_enumeration  # noqa: E402
from cbo.solvers.enumerate.search import TaskResult, enumerate_tasks, merge_task_results  # noqa: E402
from cbo.solvers.enumerate.solver import EnumerateSolver  # noqa: E402

__all__ = [
    "EnumerateSolver",
    "EnumerationPlan",
    "SearchOptions",
    "TaskResult",
    "enumerate_tasks",
    "merge_task_results",
    "plan_enumeration",
]
