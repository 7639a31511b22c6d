"""Fixtures shared across the test packages."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.processes import free_port, stop, wait_listening

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def agent_url() -> Iterator[str]:
    """The collection tests' agent server (`tests.collection.agent_app`), as a real process; it keeps
    no state between requests, so one serves every test."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.collection.agent_app", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


# `make fuzz` runs the property tests with this profile (HYPOTHESIS_PROFILE=fuzz); `make test` uses
# hypothesis's default budget. Neither has a per-example deadline: hypothesis's default 200 ms fails a
# property test on a busy machine (seen under load), and no test may depend on the machine's speed.
settings.register_profile("ci", deadline=None)
settings.register_profile("fuzz", max_examples=20_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
