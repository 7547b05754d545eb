"""Keeps numba's on-disk cache of the enumeration kernels consistent across their modules.

numba keys a cached kernel on the source file of the function itself: a kernel that calls a function
of another file (every kernel here calls :mod:`threads` and :mod:`heap`, most call :mod:`bounds`) would
keep its cached machine code, with the old callee compiled in, after that other file changed. So a digest
of all kernel sources is kept beside the cache, and when it differs the cached kernels of every module
listed here are deleted (they compile again on first use).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: Modules of this package whose numba functions call each other.
KERNEL_MODULES = ("threads", "heap", "bounds", "tail", "fused", "generic", "seeding")
_STAMP = "kernels.sha256"


def sources_digest(folder: Path) -> str:
    """A digest of the kernel modules' sources."""
    digest = hashlib.sha256()
    for name in KERNEL_MODULES:
        digest.update(name.encode())
        digest.update((folder / f"{name}.py").read_bytes())
    return digest.hexdigest()


def drop_stale_kernels(folder: Path | None = None) -> bool:
    """Delete the cached kernels when any kernel source changed since they were cached; True if deleted.

    Only the cache next to the sources (``__pycache__``, numba's default) is handled; a failure to read
    or write it (a read-only install) leaves everything as it is.
    """
    folder = Path(__file__).resolve().parent if folder is None else folder
    cache = folder / "__pycache__"
    try:
        digest = sources_digest(folder)
        stamp = cache / _STAMP
        if stamp.exists() and stamp.read_text().strip() == digest:
            return False
        dropped = False
        for name in KERNEL_MODULES:
            for path in (*cache.glob(f"{name}.*.nbi"), *cache.glob(f"{name}.*.nbc")):
                path.unlink(missing_ok=True)
                dropped = True
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest + "\n")
        return dropped
    except OSError:
        return False
