"""Each search thread's max-heap of the K best states, and the pruning threshold all threads share.

Each thread keeps its own max-heap of K states (``heap_e`` energies, ``heap_s`` removed positions,
``heap_n`` sizes); the pruning threshold is the smallest K-th best over all threads (each an upper bound on
the global K-th best) or the plan's seeded cap. A thread publishes its K-th best once its heap is full.
"""

from __future__ import annotations

from numba import njit

from cbo.solvers.enumerate.threads import PAD, load_shared, store_shared


# Sifting in a max-heap of keys, one step at a time: the callers move their own payload (indices, states) with
# each key, so the step only says which slot moves. Inlined, they cost what the loops written out did.
@njit(cache=True, inline="always", _nrt=False)
def larger_child(keys, i, size, key):
    """The child of slot ``i`` of the max-heap ``keys[0:size]`` that moves up while ``key`` sifts down from ``i``
    (its larger child, when that exceeds ``key``), or -1 when ``key`` belongs at ``i``."""
    ch = 2 * i + 1
    if ch >= size:
        return -1
    if ch + 1 < size and keys[ch + 1] > keys[ch]:
        ch += 1
    return ch if keys[ch] > key else -1


@njit(cache=True, inline="always", _nrt=False)
def smaller_parent(keys, i, key):
    """The parent of slot ``i`` that moves down while ``key`` sifts up from ``i`` (when it is below ``key``), or
    -1 when ``key`` belongs at ``i``."""
    if i == 0:
        return -1
    p = (i - 1) // 2
    return p if keys[p] < key else -1


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
    keys = heap_e[tid]
    if nh < K:
        i = nh
        p = smaller_parent(keys, i, e)
        while p >= 0:
            keys[i] = keys[p]
            for q in range(r):
                heap_s[tid, i, q] = heap_s[tid, p, q]
            i, p = p, smaller_parent(keys, p, e)
        nh += 1
        heap_n[tid * PAD] = nh
    else:
        if e >= keys[0]:
            return
        i = 0
        ch = larger_child(keys, 0, K, e)
        while ch >= 0:
            keys[i] = keys[ch]
            for q in range(r):
                heap_s[tid, i, q] = heap_s[tid, ch, q]
            i, ch = ch, larger_child(keys, ch, K, e)
    keys[i] = e
    for q in range(r):
        heap_s[tid, i, q] = cur[q]
    if nh == K:
        store_shared(thr, tid * PAD, keys[0])
