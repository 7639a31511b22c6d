"""The faults a test tool needs, through the official SDKs and the session endpoint (`model_endpoint`,
the pytest plugin): every fault marked in its reply, any status, a context window, cut points,
stalls, paced and slow streams, tool-call faults, sub-second waits, `none`, the scenario queue, and a
quiet log. Waits are asserted as lower bounds only."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest

from gym_failures.client import observe_attempts, observed_failure, sdk_failure
from gym_failures.failure_kinds import MODEL_CONTEXT_LIMIT, PROVIDER_QUOTA_EXHAUSTED, PROVIDER_UNAVAILABLE
from gym_failures.model_endpoint import EVENT_HEADER, FAULTS, INJECTED_HEADER

if TYPE_CHECKING:  # imported by pytest as a plugin, below: an import here would come first
    from gym_failures.model_endpoint.pytest_plugin import ModelEndpointFixture

pytest_plugins = ["gym_failures.model_endpoint.pytest_plugin"]

MESSAGES: list[Any] = [{"role": "user", "content": "What is 2 + 2?"}]
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
]


@pytest.fixture
def http(model_endpoint: ModelEndpointFixture) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {model_endpoint.api_key}"}
    with httpx.Client(base_url=model_endpoint.url, headers=headers, timeout=60) as client:
        yield client


@pytest.fixture
def oai(model_endpoint: ModelEndpointFixture) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        max_retries=0, http_client=observe_attempts(openai.DefaultHttpxClient())
    ) as client:  # base URL and key from the fixture's environment
        yield client


@pytest.fixture
def claude(model_endpoint: ModelEndpointFixture) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        max_retries=0, http_client=observe_attempts(anthropic.DefaultHttpxClient())
    ) as client:
        yield client


def _chat(http: httpx.Client, fault: str, **body: Any) -> httpx.Response:
    return http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": MESSAGES, **body},
        headers={"X-Gym-Fault": fault},
    )


def _events(reply: httpx.Response) -> list[str]:
    return [block for block in reply.text.split("\n\n") if block.strip()]


@pytest.mark.parametrize(
    "fault",
    [
        "slow; delay=0",
        "slow_first_token; delay=0",
        "stall; delay=0",
        "paced; interval=0",
        "truncated",
        "empty",
        "bad_tool_arguments",
        "unknown_tool",
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_every_fault_that_answers_is_marked_in_the_reply(
    model_endpoint: ModelEndpointFixture, http: httpx.Client, fault: str, stream: bool
) -> None:
    reply = _chat(http, fault, stream=stream)
    assert reply.status_code == 200
    name = fault.partition(";")[0]
    (attempt,) = model_endpoint.journal()
    assert reply.headers[INJECTED_HEADER] == name == attempt.fault
    assert reply.headers[EVENT_HEADER] == attempt.event_id
    assert model_endpoint.endpoint.fault_counts[name] >= 1


def test_a_failed_reply_names_the_failures_own_event(
    model_endpoint: ModelEndpointFixture, http: httpx.Client
) -> None:
    reply = _chat(http, "server_500")
    report = json.loads(reply.headers["X-NG-Failure-Report"])
    assert reply.headers[EVENT_HEADER] == report["failure_id"] == model_endpoint.journal()[0].event_id


def test_none_passes_whatever_is_queued(model_endpoint: ModelEndpointFixture, http: httpx.Client) -> None:
    model_endpoint.force("server_500")
    assert _chat(http, "none").status_code == 200
    assert INJECTED_HEADER not in _chat(http, "none").headers
    assert _chat(http, "none; times=1").status_code == 200
    reply = http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert reply.status_code == 500  # the queued fault, still waiting for a request without a header


@pytest.mark.parametrize("code", [400, 404, 408, 422, 429, 500, 502, 503, 529, 599])
def test_any_status_through_the_openai_sdk(
    model_endpoint: ModelEndpointFixture, oai: openai.OpenAI, code: int
) -> None:
    model_endpoint.force("status", code=code)
    with pytest.raises(openai.APIStatusError) as raised:
        oai.chat.completions.create(model="m", messages=MESSAGES)
    assert raised.value.status_code == code
    failure = sdk_failure(raised.value)
    assert failure.http_status == code
    assert failure.event_id == model_endpoint.journal()[0].event_id


def test_529_is_anthropics_overloaded_error(
    model_endpoint: ModelEndpointFixture, claude: anthropic.Anthropic
) -> None:
    model_endpoint.force("status", code=529, retry_after=1)
    with pytest.raises(anthropic.APIStatusError) as raised:
        claude.messages.create(model="c", max_tokens=16, messages=MESSAGES)
    assert raised.value.status_code == 529
    assert raised.value.response.headers["retry-after"] == "1"
    assert sdk_failure(raised.value).failure_kind == PROVIDER_UNAVAILABLE


def test_the_context_window_is_a_bad_request_of_its_kind(
    model_endpoint: ModelEndpointFixture, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    model_endpoint.force("context_window", times=2)
    with pytest.raises(openai.BadRequestError) as raised:
        oai.responses.create(model="m", input="a very long prompt")
    assert sdk_failure(raised.value).failure_kind == MODEL_CONTEXT_LIMIT
    assert "context window" in raised.value.message
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="c", max_tokens=16, messages=MESSAGES)
    assert sdk_failure(refused.value).failure_kind == MODEL_CONTEXT_LIMIT


@pytest.mark.parametrize("after", [0, 1, 3])
def test_a_cut_stream_breaks_after_n_events(http: httpx.Client, after: int) -> None:
    reply = _chat(http, f"cut_stream; after={after}", stream=True)
    assert len(_events(reply)) == after


def test_a_failed_stream_breaks_after_n_events_then_its_failure_event(http: httpx.Client) -> None:
    events = _events(_chat(http, "stream_failed; after=2", stream=True))
    assert len(events) == 4  # two chunks, the error chunk, [DONE]
    assert '"error"' in events[2]


def test_a_failed_responses_stream_is_observed_though_the_sdk_raises_nothing(
    model_endpoint: ModelEndpointFixture, oai: openai.OpenAI
) -> None:
    model_endpoint.force("stream_failed")
    stream = oai.responses.create(model="m", input="hi", stream=True)
    assert [event.type for event in stream][-1] == "response.failed"
    failure = observed_failure(stream)
    assert failure is not None
    assert failure.event_id == model_endpoint.journal()[0].event_id


def test_a_cut_noticed_by_the_hook_keeps_the_endpoints_event_id(
    model_endpoint: ModelEndpointFixture, claude: anthropic.Anthropic
) -> None:
    model_endpoint.force("cut_stream", after=2)
    stream = claude.messages.create(model="c", max_tokens=16, messages=MESSAGES, stream=True)
    list(stream)
    failure = observed_failure(stream)
    assert failure is not None
    assert failure.event_id == model_endpoint.journal()[0].event_id
    assert failure.event_id in model_endpoint.client_log.report.events


@pytest.mark.parametrize("api", ["responses", "chat", "messages"])
def test_a_malformed_chunk_raises_in_each_sdk(
    model_endpoint: ModelEndpointFixture, oai: openai.OpenAI, claude: anthropic.Anthropic, api: str
) -> None:
    model_endpoint.force("malformed_chunk", after=2)
    streams: dict[str, Any] = {
        "responses": lambda: oai.responses.create(model="m", input="hi", stream=True),
        "chat": lambda: oai.chat.completions.create(model="m", messages=MESSAGES, stream=True),
        "messages": lambda: claude.messages.create(model="c", max_tokens=16, messages=MESSAGES, stream=True),
    }
    stream = streams[api]()
    with pytest.raises(json.JSONDecodeError):
        list(stream)
    assert model_endpoint.journal()[0].outcome == "malformed"


def test_a_stall_holds_the_stream_at_least_its_delay(
    model_endpoint: ModelEndpointFixture, oai: openai.OpenAI
) -> None:
    model_endpoint.force("stall", after=3, delay=0.4)
    started = time.monotonic()
    chunks = list(oai.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert time.monotonic() - started >= 0.4
    assert chunks[-1].choices[0].finish_reason == "stop"  # then the stream goes on to its end
    assert model_endpoint.journal()[0].outcome == "ok"


def test_a_stall_longer_than_the_read_timeout_is_a_timeout(
    model_endpoint: ModelEndpointFixture, oai: openai.OpenAI
) -> None:
    """The openai SDK raises `APITimeoutError`, or, when the timeout strikes while the stream's body
    is being read, the raw timeout of the HTTP library under it (httpx2's or httpcore2's: seen both
    ways on the same machine); `sdk_failure` reads each as a timeout."""
    import httpcore2
    import httpx2

    model_endpoint.force("stall", after=2, delay=30)
    started = time.monotonic()

    # The timeout may strike before the stream's first bytes, or after them.
    def read() -> None:
        # speed-ok: fires: the stream stalls 30 s, 100 times the timeout
        list(oai.with_options(timeout=0.3).chat.completions.create(model="m", messages=MESSAGES, stream=True))

    timeouts = (openai.APITimeoutError, httpx2.TimeoutException, httpcore2.TimeoutException)
    with pytest.raises(timeouts) as raised:
        read()
    assert time.monotonic() - started >= 0.3
    assert sdk_failure(raised.value).failure_kind == "transport_timeout"


def test_a_slow_first_token_and_paced_events(
    model_endpoint: ModelEndpointFixture, http: httpx.Client
) -> None:
    started = time.monotonic()
    with http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "m", "messages": MESSAGES, "stream": True},
        headers={"X-Gym-Fault": "slow_first_token; delay=0.3"},
    ) as reply:
        headers_at = time.monotonic()
        first = next(reply.iter_raw())
        first_at = time.monotonic()
    assert first
    assert first_at - started >= 0.3
    assert reply.headers[INJECTED_HEADER] == "slow_first_token"
    assert headers_at <= first_at
    started = time.monotonic()
    events = _events(_chat(http, "paced; interval=0.05", stream=True))
    assert time.monotonic() - started >= 0.05 * (len(events) - 1)


def test_tool_call_faults(model_endpoint: ModelEndpointFixture, oai: openai.OpenAI) -> None:
    model_endpoint.force("bad_tool_arguments")
    model_endpoint.force("unknown_tool")
    (bad,) = (
        oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS).choices[0].message.tool_calls
        or []
    )
    assert bad.function.name == "lookup"  # type: ignore[union-attr]
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad.function.arguments)  # type: ignore[union-attr]
    (unknown,) = (
        oai.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS).choices[0].message.tool_calls
        or []
    )
    assert unknown.function.name not in {"lookup"}  # type: ignore[union-attr]


def test_retry_after_ms_is_a_sub_second_wait_the_sdk_keeps(
    model_endpoint: ModelEndpointFixture, oai: openai.OpenAI
) -> None:
    model_endpoint.force("quota_429", retry_after_ms=300)
    oai.with_options(max_retries=1).chat.completions.create(model="m", messages=MESSAGES)
    refused, answered = model_endpoint.journal()
    assert refused.retry_after_s == 0.3
    assert refused.answered_s is not None
    assert answered.started_s - refused.answered_s >= 0.3
    assert model_endpoint.assert_recovered().findings == []


def test_the_429_says_the_wait_its_retry_after_sends(http: httpx.Client) -> None:
    reply = _chat(http, "quota_429; retry_after=2")
    assert reply.headers["retry-after"] == "2"
    assert "retry after 2 s" in reply.json()["error"]["message"]
    assert " UTC" not in reply.json()["error"]["message"]
    assert "retry-after-ms" not in reply.headers
    half = _chat(http, "quota_429; retry_after=0.5")
    assert (half.headers["retry-after"], half.headers["retry-after-ms"]) == ("1", "500")


def test_the_401_says_where_the_key_goes_unredacted(model_endpoint: ModelEndpointFixture) -> None:
    with (
        openai.OpenAI(api_key="wrong", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError) as raised,
    ):
        client.models.list()
    message = raised.value.message
    assert "[REDACTED]" not in message
    assert "Bearer" in message
    assert "x-api-key" in message


@pytest.mark.parametrize(
    ("scenario", "misses", "hits"),
    [
        ({"route": "/v1/messages"}, "chat", "messages"),
        ({"stream": True}, "chat", "chat_stream"),
        ({"model": "target"}, "chat", "chat_target"),
        ({"tools": True}, "chat", "chat_tools"),
    ],
)
def test_the_scenario_queue_matches_route_model_and_stream(
    model_endpoint: ModelEndpointFixture, http: httpx.Client, scenario: dict[str, Any], misses: str, hits: str
) -> None:
    model_endpoint.force("server_503", times=2, **scenario)

    def send(kind: str) -> int:
        if kind == "messages":
            anthropic_body = {"model": "m", "max_tokens": 8, "messages": MESSAGES}
            return http.post("/v1/messages", json=anthropic_body).status_code
        body: dict[str, Any] = {"model": "target" if kind == "chat_target" else "m", "messages": MESSAGES}
        if kind == "chat_tools":
            body["tools"] = TOOLS
        return http.post("/v1/chat/completions", json={**body, "stream": kind == "chat_stream"}).status_code

    assert send(misses) == 200
    assert [send(hits), send(hits), send(hits)] == [503, 503, 200]  # times=2, then the queue is empty


def test_the_queue_and_the_journal_through_the_control_routes(
    model_endpoint: ModelEndpointFixture, http: httpx.Client
) -> None:
    queued = http.post("/_gym/faults", json={"fault": "quota_429", "times": 1, "params": {"retry_after": 3}})
    assert queued.json()["queued"][0]["fault"] == "quota_429"
    assert _chat(http, "none").status_code == 200
    assert http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES}).status_code == 429
    journal = http.get("/_gym/journal").json()["attempts"]
    assert [a["fault"] for a in journal] == [None, "quota_429"]
    verdict = http.get("/_gym/verdict").json()["verdict"]
    # Two calls of one body (no call identity: grouped by guess; nobody retries a success), the
    # second ended in a 429 nobody retried.
    assert (verdict["calls"], verdict["calls_by_basis"]["guess"]) == (2, 2)
    assert [(f["finding"], f["severity"]) for f in verdict["findings"]] == [("gave_up", "failure")]
    assert "gave_up" in http.get("/_gym/verdict", params={"format": "text"}).text
    judged = http.post("/_gym/verdict", json={"client_event_ids": [journal[1]["event_id"]]}).json()
    assert judged["verdict"]["client_record"] is True
    assert http.post("/_gym/faults", json={"fault": "nope"}).status_code == 400
    assert http.post("/_gym/faults", json=[1]).status_code == 400
    assert http.post("/_gym/reset").json() == {"reset": True}
    assert http.get("/_gym/journal").json()["attempts"] == []


def test_the_control_routes_need_the_key(model_endpoint: ModelEndpointFixture) -> None:
    for method, path in [("GET", "/_gym/journal"), ("GET", "/_gym/verdict"), ("POST", "/_gym/reset")]:
        assert httpx.request(method, model_endpoint.url + path).status_code == 401


def test_asked_for_faults_log_once_at_info_and_real_failures_at_error(
    model_endpoint: ModelEndpointFixture, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _chat(http, "quota_429")
    with pytest.raises(httpx.RemoteProtocolError):
        _chat(http, "drop_connection", stream=True)
    _chat(http, "cut_stream", stream=True)
    model_endpoint.journal()  # waits for the replies still being sent
    injected = [r for r in caplog.records if r.name == "gym_failures.model_endpoint"]
    assert [r.levelno for r in injected] == [logging.INFO] * 3
    assert [r.args[0] for r in injected] == ["quota_429", "drop_connection", "cut_stream"]  # type: ignore[index]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    caplog.clear()
    assert (
        http.post(
            "/v1/chat/completions", content=b"{", headers={"content-type": "application/json"}
        ).status_code
        == 400
    )
    assert [r.levelno for r in caplog.records if r.name == "gym_failures.asgi"] == [logging.ERROR]


def test_every_fault_is_named_in_the_faults_table() -> None:
    assert "none" in FAULTS
    assert {"status", "context_window", "malformed_chunk", "stall", "slow_first_token", "paced"} <= set(
        FAULTS
    )
    assert PROVIDER_QUOTA_EXHAUSTED  # the kind the quotas answer with (test_quota.py)


def test_the_verdict_command_reads_a_running_endpoint(
    model_endpoint: ModelEndpointFixture, http: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    from gym_failures.cli import main

    # Attempts 1 and 2 of one logical call: the second came at once, not 60 s later.
    for attempt in ("1", "2"):
        headers = {
            "X-Gym-Fault": "quota_429; retry_after=60",
            "X-Gym-Call-Id": "c1",
            "X-Gym-Call-Attempt": attempt,
        }
        http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES}, headers=headers)
    assert main(["verdict", model_endpoint.url, "--api-key", model_endpoint.api_key]) == 1
    out = capsys.readouterr().out
    assert "failure: retry_after_ignored" in out
    assert "2 attempts of 1 call;" in out
    assert main(["verdict", model_endpoint.url]) == 2  # no key: the endpoint answers 401
    assert "answered 401" in capsys.readouterr().err
