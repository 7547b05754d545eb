"""A local 2-CPU Ray instance shared by the distributed tests (started once; startup takes seconds)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_local():
    pytest.importorskip("ray")
    import ray

    from cbo.distributed import init_ray, shutdown

    started = not ray.is_initialized()
    init_ray(num_cpus=2, include_dashboard=False)
    yield ray
    if started:
        shutdown()
