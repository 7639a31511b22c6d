"""gym_failures.agent: the /run route made from one coroutine, what it replies for each request and
each thing `run` returns or raises, and that no request body makes it crash."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from gym_failures.agent import agent_app, run_route
from gym_failures.failure_records import BaseEpisodeResponse
from gym_failures.failure_transport import FailureHeader
from gym_failures.failures import AgentFailure, ModelFailure
from gym_failures.reply import episode_response

REQUEST = {"task": {"q": 1}, "rollout_id": "0:0", "attempt": 1}


def _client(returned: Any = None, raised: BaseException | None = None) -> TestClient:
    seen: list[tuple[Any, ...]] = []

    async def run(task: dict[str, Any], rollout_id: str, attempt: int) -> Any:
        seen.append((task, rollout_id, attempt))
        if raised is not None:
            raise raised
        return returned

    client = TestClient(agent_app(run), raise_server_exceptions=False)
    client.seen = seen  # type: ignore[attr-defined]
    return client


def test_run_gets_the_requests_three_fields() -> None:
    client = _client({"reward": 1.0})
    client.post("/run", json=REQUEST)
    assert client.seen == [({"q": 1}, "0:0", 1)]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("returned", "result"),
    [
        ({"reward": 1.0, "response": "4"}, {"reward": 1.0, "response": "4"}),
        (0.5, {"reward": 0.5}),
        (1, {"reward": 1}),
        (episode_response(result={"reward": 0.0}), {"reward": 0.0}),
    ],
)
def test_what_run_returns_is_the_episodes_result(returned: Any, result: dict[str, Any]) -> None:
    reply = _client(returned).post("/run", json=REQUEST)
    assert reply.status_code == 200
    assert BaseEpisodeResponse.model_validate(reply.json()).result == result


def test_a_terminal_failure_returned_is_sent_as_it_is() -> None:
    failure = AgentFailure(failure_kind="environment_prepare_failed", failure_reason="no prompt")
    reply = _client(episode_response(failure=failure, terminal=True)).post("/run", json=REQUEST)
    episode = BaseEpisodeResponse.model_validate(reply.json())
    assert (reply.status_code, episode.failure and episode.failure.terminal) == (200, True)


def test_a_gym_failure_raised_is_the_episodes_failure_retried() -> None:
    failure = ModelFailure(failure_kind="model_server_error", failure_reason="503", http_status=503)
    reply = _client(raised=failure).post("/run", json=REQUEST)
    episode = BaseEpisodeResponse.model_validate(reply.json())
    assert reply.status_code == 200
    assert episode.failure is not None
    assert (episode.failure.failure_kind, episode.failure.terminal) == ("model_server_error", False)
    assert episode.failure_report is not None
    assert failure.event_id in episode.failure_report.events


@pytest.mark.parametrize("returned", [None, "1.0", True, float("nan"), [1.0]])
def test_anything_else_returned_is_the_agents_own_fault_a_500_with_its_report(returned: Any) -> None:
    reply = _client(returned).post("/run", json=REQUEST)
    assert reply.status_code == 500
    assert FailureHeader.NAME in reply.headers


def test_an_exception_raised_is_a_500_with_its_report() -> None:
    reply = _client(raised=RuntimeError("boom")).post("/run", json=REQUEST)
    assert reply.status_code == 500
    assert FailureHeader.NAME in reply.headers


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1]",
        json.dumps({**REQUEST, "task": "q"}).encode(),
        json.dumps({**REQUEST, "rollout_id": 1}).encode(),
        json.dumps({**REQUEST, "attempt": 0}).encode(),
        json.dumps({**REQUEST, "attempt": True}).encode(),
        json.dumps({"task": {}}).encode(),
    ],
)
def test_a_request_that_is_not_the_protocols_is_a_400_naming_the_violation(body: bytes) -> None:
    client = _client({"reward": 1.0})
    reply = client.post("/run", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400
    assert reply.json()["failure_kind"] == "environment_protocol_violation"
    assert FailureHeader.NAME in reply.headers
    assert client.seen == []  # type: ignore[attr-defined]


def test_the_route_takes_its_path() -> None:
    async def run(task: dict[str, Any], rollout_id: str, attempt: int) -> float:
        return 1.0

    assert run_route(run, path="/episodes/run").path == "/episodes/run"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(
    body=st.one_of(
        st.binary(max_size=64),
        _JSON.map(lambda value: json.dumps(value).encode()),
        st.fixed_dictionaries({"task": _JSON, "rollout_id": _JSON, "attempt": _JSON}).map(
            lambda value: json.dumps(value).encode()
        ),
    )
)
def test_no_request_body_makes_the_route_crash(body: bytes) -> None:
    reply = _client({"reward": 1.0}).post("/run", content=body, headers={"content-type": "application/json"})
    assert reply.status_code in (200, 400)
    if reply.status_code == 200:
        assert BaseEpisodeResponse.model_validate(reply.json()).result == {"reward": 1.0}
    else:
        assert reply.json()["failure_kind"] == "environment_protocol_violation"


def test_a_fastapi_app_takes_the_route_as_the_page_says() -> None:
    from fastapi import FastAPI

    from gym_failures.asgi import FailureReportMiddleware

    async def run(task: dict[str, Any], rollout_id: str, attempt: int) -> float:
        return 1.0

    app = FastAPI()
    app.router.routes.append(run_route(run))
    app.add_middleware(FailureReportMiddleware, boundary="agent")
    assert TestClient(app).post("/run", json=REQUEST).json() == {"result": {"reward": 1.0}}
