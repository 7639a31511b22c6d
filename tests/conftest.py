"""Fixtures shared across the test packages."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.processes import serve_module

ROOT = Path(__file__).resolve().parents[1]

# The collector's backoff and readiness wait are off in the tests that do not test them (and in the
# commands they run): a retry waits no real second, nothing listening is tried at once. The tests of
# issue 21 (tests/collection/test_recovery.py) set both in their configs, on their own clock.
os.environ.setdefault("GYM_FAILURES_BACKOFF_INITIAL_S", "0")
os.environ.setdefault("GYM_FAILURES_WAIT_READY_S", "0")


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
