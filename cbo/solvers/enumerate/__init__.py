"""Exact top-K enumeration: depth-first branch and bound over all states with Σx = M.

The free blocks (not kept, not forced) are reordered (by ascending diagonal by default, so that good
states come early) and the states are visited in lexicographic order of their removed positions. Every
node keeps the field ``f_j = Q_jj + Σ_{i chosen} Q_ij`` of each candidate ``j``, so adding ``j`` costs
``f_j``; lower bounds prune prefixes whose every completion is worse than the K-th best found so far.

Modules:

* :mod:`.solver` — the ``enumerate`` solver; it runs the search on a backend: ``local`` (numba threads),
  ``ray`` (:mod:`.ray`, sharded over Ray workers) or ``gpu`` (:mod:`.gpu`, full enumeration on CUDA,
  also the ``enumerate-gpu`` solver; kernel source and CPU emulator in :mod:`.gpu_kernel`).
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
