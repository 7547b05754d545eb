"""Exact top-K enumeration on the CPU (placeholder replaced by the numba enumerator)."""
