"""Each search thread's max-heap of the K best states, and the pruning threshold all threads share.

Each thread keeps its own max-heap of K states (``heap_e`` energies, ``heap_s`` removed positions,
``heap_n`` sizes); the pruning threshold is the smallest K-th best over all threads (each an upper bound on
the global K-th best) or the plan's seeded cap. A thread publishes its K-th best once its heap is full.
"""

from __future__ import annotations

from numba import njit

from cbo.solvers.enumerate.threads import PAD, load_shared, store_shared


@njit(cache=True, inline="always", _nrt=False)
def shared_threshold(thr, nth, cap):
    """The pruning threshold: the smallest K-th best over all threads, or the seeded cap."""
    m = cap
    for t in range(nth):
        v = load_shared(thr, t * PAD)
        if v < m:
            m = v
    return m


@njit(cache=True, _nrt=False)
def heap_push(heap_e, heap_s, heap_n, thr, tid, e, cur):
    """Offer a state (energy ``e``, removed indices ``cur``) to thread ``tid``'s max-heap of size K."""
    K = heap_e.shape[1]
    r = heap_s.shape[2]
    nh = heap_n[tid * PAD]
    if nh < K:
        i = nh
        while i > 0:
            p = (i - 1) // 2
            if heap_e[tid, p] >= e:
                break
            heap_e[tid, i] = heap_e[tid, p]
            for q in range(r):
                heap_s[tid, i, q] = heap_s[tid, p, q]
            i = p
        nh += 1
        heap_n[tid * PAD] = nh
    else:
        if e >= heap_e[tid, 0]:
            return
        i = 0
        while True:
            left = 2 * i + 1
            if left >= K:
                break
            ch = left
            if left + 1 < K and heap_e[tid, left + 1] > heap_e[tid, left]:
                ch = left + 1
            if heap_e[tid, ch] <= e:
                break
            heap_e[tid, i] = heap_e[tid, ch]
            for q in range(r):
                heap_s[tid, i, q] = heap_s[tid, ch, q]
            i = ch
    heap_e[tid, i] = e
    for q in range(r):
        heap_s[tid, i, q] = cur[q]
    if nh == K:
        store_shared(thr, tid * PAD, heap_e[tid, 0])
