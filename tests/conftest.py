"""Fixtures shared across the test packages."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.processes import serve_module

ROOT = Path(__file__).resolve().parents[1]
RAY_TESTS = "tests/on_ray"

# The collector's backoff and readiness wait are off in the tests that do not test them (and in the
# commands they run): a retry waits no real second, nothing listening is tried at once. The tests of
# issue 21 (tests/collection/test_recovery.py) set both in their configs, on their own clock.
os.environ.setdefault("GYM_FAILURES_BACKOFF_INITIAL_S", "0")
os.environ.setdefault("GYM_FAILURES_WAIT_READY_S", "0")

# A shell starts a background job (`make test &`, a CI step's script) with Ctrl-C (SIGINT) ignored, and
# every process it starts inherits that: a command a test interrupts would ignore the Ctrl-C, and never
# stop. This process takes SIGINT back (its handler is the default again in what it starts), so each
# test that sends one sees the command act as in a terminal, whatever started pytest.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make unit` runs the tests on two xdist workers, each test file whole on one of them
    (`-n 2 --dist loadfile`): a module's servers start once. The Ray tests (tests/on_ray) go to one
    worker together, as if one file, so one local Ray of two CPUs runs (`ray_address`,
    tests/on_ray/conftest.py), as those tests expect, not one per worker. (xdist's own `xdist_group`
    mark does not group tests under pytest 9.2: it rewrites a node id pytest no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class ByFileRayTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return RAY_TESTS if path.startswith(f"{RAY_TESTS}/") else path

    return ByFileRayTogether(config, log)


@pytest.fixture(scope="session")
def agent_url() -> Iterator[str]:
    """The collection tests' agent server (`tests.collection.agent_app`), as a real process; it keeps
    no state between requests, so one serves every test."""
    with serve_module("tests.collection.agent_app") as url:
        yield url


# `make fuzz` runs the property tests with this profile (HYPOTHESIS_PROFILE=fuzz); `make test` uses
# hypothesis's default budget. Neither has a per-example deadline: hypothesis's default 200 ms fails a
# property test on a busy machine (seen under load), and no test may depend on the machine's speed.
settings.register_profile("ci", deadline=None)
settings.register_profile("fuzz", max_examples=20_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
