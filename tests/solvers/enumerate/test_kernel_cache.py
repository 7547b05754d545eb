"""The kernel cache guard: cached kernels are dropped when any kernel module's source changes."""

from __future__ import annotations

from cbo.solvers.enumerate.kernel_cache import KERNEL_MODULES, drop_stale_kernels


def _package(tmp_path):
    for name in KERNEL_MODULES:
        (tmp_path / f"{name}.py").write_text(f"# {name}\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    return cache


def _cached(cache):
    files = {
        "fused.batch_fused-300.py311.nbi",
        "fused.batch_fused-300.py311.1.nbc",
        "bounds.relax_bound-108.py311.nbi",
        "other.kernel-1.py311.nbi",  # not a kernel module of the package: never touched
        "fused.cpython-311.pyc",
    }
    for f in files:
        (cache / f).write_text("x")
    return files


def test_changed_sources_drop_the_cached_kernels_of_every_kernel_module(tmp_path):
    cache = _package(tmp_path)
    _cached(cache)
    assert drop_stale_kernels(tmp_path)  # no stamp yet: whatever is cached may be stale
    left = {p.name for p in cache.iterdir()}
    assert left == {"other.kernel-1.py311.nbi", "fused.cpython-311.pyc", "kernels.sha256"}
    files = _cached(cache)
    assert not drop_stale_kernels(tmp_path)  # sources unchanged: the cache stays
    assert files <= {p.name for p in cache.iterdir()}
    (tmp_path / "heap.py").write_text("# heap, edited\n")  # a callee of every kernel changes
    assert drop_stale_kernels(tmp_path)
    assert not any(p.name.startswith(("fused.", "bounds.")) and p.suffix in (".nbi", ".nbc") for p in cache.iterdir())
    assert not drop_stale_kernels(tmp_path)


def test_an_unreadable_package_leaves_everything_as_it_is(tmp_path):
    assert drop_stale_kernels(tmp_path / "missing") is False
