"""The pytest plugin: `model_endpoint`, a real `gym-failures serve model` on loopback for the session,
reset for every test, and a verdict on how the code under test recovered from the faults it met.

Install the `pytest` extra (`pip install 'gym-failures[pytest]'`); pytest loads the plugin by itself
(a `pytest11` entry point). Point the official SDKs at the endpoint, force faults, run the agent, and
ask for the verdict::

    import openai

    def test_my_agent_recovers(model_endpoint):
        client = openai.OpenAI(base_url=model_endpoint.openai_base_url, api_key=model_endpoint.api_key)
        model_endpoint.force("quota_429", retry_after=1)      # the next request: a 429, Retry-After 1
        model_endpoint.force("cut_stream", stream=True)       # the next stream: cut before its end
        my_agent.run(client, "Fix the bug")
        model_endpoint.assert_recovered()                     # waited the hint? asked again after the cut?

The fixture also sets `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL` and
`ANTHROPIC_API_KEY` for the test, so an SDK client made without arguments talks to the endpoint.

`verdict()` and `assert_recovered()` read the endpoint's journal of the test's attempts, call by
call (a call's outcome is its last attempt; attempts are one call when they send the same
`X-Gym-Call-Id`, else by the SDKs' retry count, else by a guess the verdict names), and, when the code
under test runs gym-failures (`observe_attempts` on its SDK client), its own record: the fixture
captures a `RequestFailureLog` for the test (`client_log`) and uses it when it holds anything. A log
only shows what the client SAW, and seen is not handled: a call that ended in a cut stream fails the
verdict unless a failure of the agent names the cut (pass `client=` the agent's failure, or the
collector's rows), or a later attempt of the same call succeeded. Re-issue a stream inside
`gym_failures.calls.logical_call()` and send its headers (`call_headers()`) so the retry is an attempt
of the same call. Pass `client=` to name the record yourself (a collector's rows, an agent's failure,
a `FailureReport`, event ids), or `client=None` to judge from the server's side alone.

A call that ends in a failure a retry can recover from, with fewer than `max_attempts` attempts (3:
the SDKs' 1 + 2 retries), is `gave_up`, a failure; `assert_recovered(allow_give_up=True)` makes it a
warning for a test that expects the give-up (`max_retries=0` on purpose). One that spent its attempts
passes only when a failure of the agent names the fault: the log ends the call in it, and cannot say
whether the agent then raised it or answered anyway, so a test whose agent raised passes that
failure (`assert_recovered(client=raised.value)`).

`pytest --model-endpoint-verdicts FILE` writes every test's verdict as one JSON line (`test`,
`verdict`) when the session ends.

Decisions:
- One server for the session, on 127.0.0.1 and a free port, reset (journal, scenario queue, header
  counts) before each test: starting uvicorn per test would cost more than most tests.
- The server runs in a thread of the test process, so `force` and `verdict` are plain calls, not
  requests; a test in another process reaches the same state through the control routes.
- The key is fixed and not secret (`API_KEY`): the endpoint only checks that the SDK sends one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gym_failures.failure_transport import RequestFailureLog
    from gym_failures.model_endpoint import Attempt, ModelEndpoint, Verdict

__all__ = ["API_KEY", "SETTLE_S", "ModelEndpointFixture", "model_endpoint"]

API_KEY = "gym-failures-test-key"
"""The key the session's endpoint requires (Bearer or x-api-key)."""
SETTLE_S = 10.0
_AUTO: Any = object()
_VERDICTS = pytest.StashKey[list[dict[str, Any]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gym-failures", "gym-failures model endpoint")
    group.addoption(
        "--model-endpoint-verdicts",
        metavar="FILE",
        default=None,
        help="write each test's model_endpoint verdict to FILE (JSON lines) at the end of the session",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_VERDICTS] = []


def pytest_unconfigure(config: pytest.Config) -> None:
    target = config.getoption("--model-endpoint-verdicts", default=None)
    verdicts = config.stash.get(_VERDICTS, [])
    if target:
        lines = "".join(json.dumps(entry) + "\n" for entry in verdicts)
        Path(target).write_text(lines, encoding="utf-8")


class _SessionServer:
    """`serve model` in a thread of this process, on loopback."""

    def __init__(self) -> None:
        from gym_failures._thread_server import ThreadServer, require_extra

        require_extra("model_endpoint", "pytest", ("starlette", "uvicorn"))
        from gym_failures.model_endpoint import ModelEndpoint, ModelEndpointPlan

        self.endpoint: ModelEndpoint = ModelEndpoint(plan=ModelEndpointPlan(), api_key=API_KEY)
        self._served = ThreadServer(self.endpoint.app(), name="gym-failures model endpoint")
        self.port: int = self._served.port

    def close(self) -> None:
        self._served.close()


class ModelEndpointFixture:
    """The session's endpoint, as one test sees it."""

    def __init__(self, server: _SessionServer, client_log: RequestFailureLog) -> None:
        self.endpoint: ModelEndpoint = server.endpoint
        self.url = f"http://127.0.0.1:{server.port}"
        """The endpoint's root (`/health`, the control routes under `/_gym/`)."""
        self.openai_base_url = f"{self.url}/v1"
        """The OpenAI SDK's `base_url`."""
        self.anthropic_base_url = self.url
        """The Anthropic SDK's `base_url`."""
        self.api_key = API_KEY
        self.client_log = client_log
        """The failures the code under test observed (`observe_attempts`) during this test."""

    def force(
        self,
        fault: str,
        times: int | None = 1,
        *,
        route: str | None = None,
        model: str | None = None,
        stream: bool | None = None,
        tools: bool | None = None,
        **params: object,
    ) -> None:
        """Queue `fault` for the next `times` requests (`None`: every one) matching `route`
        (`/v1/responses`, `/v1/chat/completions`, `/v1/messages`), `model`, `stream` and whether the
        request offers `tools`; `params` are the header's (`retry_after=2`, `code=529`, `after=3`,
        `delay=1`, ...)."""
        self.endpoint.force(
            fault, times=times, route=route, model=model, stream=stream, tools=tools, **params
        )

    def journal(self) -> list[Attempt]:
        """The attempts this test made, oldest first, once the replies still being sent have ended
        (at most `SETTLE_S`: a client that broke off a stream is journaled when the server sees it)."""
        self.endpoint.journal.settled(SETTLE_S)
        return self.endpoint.journal.attempts()

    def verdict(
        self, client: object = _AUTO, *, allow_give_up: bool = False, max_attempts: int | None = None
    ) -> Verdict:
        """The verdict on this test's attempts (see the module's docstring for `client`);
        `allow_give_up` and `max_attempts` as `judge`'s (`max_attempts` None: its default, 3)."""
        from gym_failures.model_endpoint import client_record, judge

        if client is _AUTO:
            client = self.client_log if not self.client_log.is_empty() else None
        self.endpoint.journal.settled(SETTLE_S)
        record = None if client is None else client_record(client)
        bounds = {} if max_attempts is None else {"max_attempts": max_attempts}
        return judge(self.endpoint.journal.attempts(), record, allow_give_up=allow_give_up, **bounds)

    def assert_recovered(
        self, client: object = _AUTO, *, allow_give_up: bool = False, max_attempts: int | None = None
    ) -> Verdict:
        """The verdict; `AssertionError` with its text (findings, calls, event ids) when a finding
        fails it."""
        verdict = self.verdict(client, allow_give_up=allow_give_up, max_attempts=max_attempts)
        if not verdict.passed:
            raise AssertionError(verdict.text())
        return verdict


@pytest.fixture(scope="session")
def _gym_failures_model_endpoint_server() -> Iterator[_SessionServer]:
    server = _SessionServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def model_endpoint(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    _gym_failures_model_endpoint_server: _SessionServer,
) -> Iterator[ModelEndpointFixture]:
    """The session's model endpoint, reset for this test (see `gym_failures.model_endpoint.pytest_plugin`)."""
    from gym_failures.failure_transport import RequestFailureLog

    server = _gym_failures_model_endpoint_server
    server.endpoint.reset()
    with RequestFailureLog.capture() as log:
        fixture = ModelEndpointFixture(server, log)
        monkeypatch.setenv("OPENAI_BASE_URL", fixture.openai_base_url)
        monkeypatch.setenv("OPENAI_API_KEY", fixture.api_key)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fixture.anthropic_base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", fixture.api_key)
        yield fixture
        verdicts = request.config.stash.get(_VERDICTS, None)
        if verdicts is not None and server.endpoint.journal.attempts():
            verdicts.append(
                {"test": request.node.nodeid, "verdict": fixture.verdict().model_dump(mode="json")}
            )
