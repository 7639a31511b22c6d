"""The real upstreams of the proxy's wire tests (`tests.proxy.upstreams`), one process each per session
(no test depends on their state: `/seen` is read before and after), and the proxy's `probe`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.processes import serve_module
from tests.proxy.upstreams import HANG_GUARD_S, SEED_BODY, Probe, Resources, one_write_server


@pytest.fixture(scope="session")
def resources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Resources]:
    """The demo's resources server, as a process, with a session to run sandbox commands in."""
    run_dir = tmp_path_factory.mktemp("resources_run")
    with serve_module("tests.proxy.upstreams", "resources", str(run_dir)) as url:
        unseeded = Resources(url, "")
        seeded = httpx.post(
            f"{url}/seed_session", content=SEED_BODY, headers=unseeded.headers, timeout=HANG_GUARD_S
        )
        seeded.raise_for_status()
        yield Resources(url, seeded.json()["session_id"])


@pytest.fixture(scope="session")
def events_url() -> Iterator[str]:
    """The SSE (and echo) server of tests.proxy.upstreams, as a process."""
    with serve_module("tests.proxy.upstreams", "events") as url:
        yield url


@pytest.fixture(scope="session")
def one_write_url() -> Iterator[str]:
    """The one-write server of tests.proxy.upstreams, in a thread."""
    with one_write_server() as url:
        yield url


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Probe:
    """Record the proxy's waits and sent pieces, its stages on the held clock (`Probe`)."""
    from gym_failures.proxy import _exchange, _forward, _pipes

    held = Probe()
    real_sleep = _pipes.Waits.sleep
    real_send = _exchange.send_pipe

    async def sleep(self: _pipes.Waits, seconds: float) -> bool:
        held.waits.append(seconds)
        left = await real_sleep(self, seconds)
        held.now += max(0.0, seconds)
        return left

    async def send_pipe(
        pipe: _pipes.Pipe, send: Any, waits: _pipes.Waits, closed: Callable[[], bool], **options: bool
    ) -> bool:
        async def recorded() -> _pipes.Pipe:
            async for piece in pipe:
                held.pieces.append(piece)
                yield piece

        return await real_send(recorded(), send, waits, closed, **options)

    monkeypatch.setattr(_pipes.Waits, "sleep", sleep)
    monkeypatch.setattr(_pipes, "time", held)
    monkeypatch.setattr(_forward, "time", held)
    monkeypatch.setattr(_forward, "send_pipe", send_pipe)
    return held
