"""Fixtures of the caller-side tests: one Gym server per test module, and each HTTP library in turn."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.client.servers import CLIENTS, ClientName, gym_app, serving


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serving(gym_app()) as url:
        yield url


@pytest.fixture(params=CLIENTS)
def client(request: pytest.FixtureRequest) -> ClientName:
    name: ClientName = request.param
    return name
