"""One real local Ray for the Ray tests: started once per session with two CPUs, shut down after."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """The address of a local Ray started for the session (two CPUs), for drivers in subprocesses."""
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield str(context.address_info["gcs_address"])  # type: ignore[attr-defined]
    finally:
        ray.shutdown()
