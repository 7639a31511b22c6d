"""The pytest plugin's `proxy` fixture: a real `gym-failures serve proxy` in front of any server a test
starts, and a verdict on how the code under test recovered from the faults the proxy injected.
Install the `pytest` and `proxy` extras; pytest loads the plugin by itself (a `pytest11` entry point)::

    def test_my_agent_survives_a_flaky_verifier(proxy, my_resources_server):
        verifier = proxy(my_resources_server.url)            # a proxy in front of it, for this test
        verifier.force("status", code=503, retry_after=1)    # the next request: a 503, Retry-After 1
        verifier.add_toxic({"type": "latency", "attributes": {"latency": 200}})
        my_agent.run(verify_url=verifier.url)
        verifier.assert_recovered()                          # waited the hint? retried the 503?

`proxy(upstream, boundary="resources_server", plan=None)` starts one proxy (uvicorn, in a thread of the
test process, on 127.0.0.1 and a free port) and returns its handle; every proxy a test starts is
stopped when the test ends. `verdict()` and `assert_recovered()` judge the proxy's journal by the model
endpoint's rules (`gym_failures.model_endpoint.pytest_plugin` says how, and what `client=` takes); the
client's own record is the `RequestFailureLog` the fixture captures for the test.

Decisions:
- A proxy per call, not per session: the upstream is the test's own server, different in each test,
  and a proxy starts in a few milliseconds.
- The handle's calls are plain calls on the proxy's state (`ChaosProxy`), not requests; a test in
  another process reaches the same state through the control routes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gym_failures.failure_transport import RequestFailureLog
    from gym_failures.model_endpoint import Attempt, Verdict
    from gym_failures.proxy import ChaosProxy, ProxyPlan, Toxic

__all__ = ["SETTLE_S", "ProxyHandle", "proxy"]

SETTLE_S = 10.0
_AUTO: Any = object()


class ProxyHandle:
    """One proxy a test started: its URL, its faults and toxics, its journal and verdict."""

    def __init__(self, chaos: ChaosProxy, client_log: RequestFailureLog) -> None:
        from gym_failures._thread_server import ThreadServer

        self.chaos = chaos
        self.client_log = client_log
        self._served = ThreadServer(chaos.app(), name="gym-failures proxy", lifespan="on", own_headers=False)
        self.port: int = self._served.port
        self.url = self._served.url
        """The proxy's root: the upstream's paths under it, the control routes under `/_gym/`."""

    def close(self) -> None:
        self._served.close()

    def force(
        self,
        fault: str,
        times: int | None = 1,
        *,
        route: str | None = None,
        tool: str | None = None,
        stream: bool | None = None,
        **params: object,
    ) -> None:
        """Queue `fault` for the next `times` requests (`None`: every one) whose path matches `route`
        (a path or a glob), whose MCP tool is `tool`, that ask for a stream (`stream`); `params` are
        the header's (`code=503`, `retry_after=2`, `after=3`, `delay=1`, ...)."""
        self.chaos.force(fault, times=times, route=route, tool=tool, stream=stream, **params)

    def add_toxic(self, toxic: Toxic | dict[str, Any]) -> Toxic:
        """Add a toxic, in Toxiproxy's shape: ``{"type": "latency", "attributes": {"latency": 200}}``."""
        return self.chaos.add_toxic(toxic)

    def remove_toxic(self, name: str) -> None:
        self.chaos.toxics.remove(name)

    def journal(self) -> list[Attempt]:
        """The attempts made through this proxy, oldest first, once the replies still being sent have
        ended (at most `SETTLE_S`)."""
        self.chaos.journal.settled(SETTLE_S)
        return self.chaos.journal.attempts()

    def verdict(
        self, client: object = _AUTO, *, allow_give_up: bool = False, max_attempts: int | None = None
    ) -> Verdict:
        """The verdict on the attempts through this proxy; `client`, `allow_give_up` and `max_attempts`
        as the model endpoint fixture's."""
        from gym_failures.model_endpoint import client_record, judge

        if client is _AUTO:
            log = self.client_log
            client = log if not log.is_empty() else None
        record = None if client is None else client_record(client)
        extra = {} if max_attempts is None else {"max_attempts": max_attempts}
        return judge(self.journal(), record, allow_give_up=allow_give_up, **extra)

    def assert_recovered(
        self, client: object = _AUTO, *, allow_give_up: bool = False, max_attempts: int | None = None
    ) -> Verdict:
        """The verdict; an `AssertionError` with its text when a finding fails it."""
        verdict = self.verdict(client, allow_give_up=allow_give_up, max_attempts=max_attempts)
        if not verdict.passed:
            raise AssertionError(verdict.text())
        return verdict


@pytest.fixture
def proxy() -> Iterator[Callable[..., ProxyHandle]]:
    """Start a proxy in front of an upstream URL: `proxy(url, boundary=..., plan=...)` (see
    `gym_failures.proxy.pytest_plugin`)."""
    from gym_failures._thread_server import require_extra

    require_extra("proxy", "pytest,proxy", ("aiohttp", "starlette", "uvicorn"))
    from gym_failures.failure_transport import RequestFailureLog
    from gym_failures.proxy import ChaosProxy

    started: list[ProxyHandle] = []
    with RequestFailureLog.capture() as log:

        def start(
            upstream: str, *, boundary: str = "resources_server", plan: ProxyPlan | None = None
        ) -> ProxyHandle:
            from gym_failures.proxy import ProxyPlan

            chaos = ChaosProxy(upstream=upstream, plan=plan or ProxyPlan(), boundary=boundary)  # type: ignore[arg-type]
            handle = ProxyHandle(chaos, log)
            started.append(handle)
            return handle

        try:
            yield start
        finally:
            for handle in started:
                handle.close()
