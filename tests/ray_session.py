"""A local 2-CPU Ray instance shared by the tests that use Ray (started once; startup takes seconds).

Test modules import the fixture (``from ray_session import ray_local``); it is not in a conftest.py
because test modules elsewhere import names from the top-level ``conftest``, which a second
conftest module would shadow.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_local():
    pytest.importorskip("ray")
    import ray

    from cbo.solvers.enumerate.ray import init_ray, shutdown

    started = not ray.is_initialized()
    init_ray(num_cpus=2, include_dashboard=False)
    yield ray
    if started:
        shutdown()
