"""Each HTTP fault of the proxy (`gym_failures.proxy.HTTP_FAULTS`) does on the wire what it documents,
seen by real clients (httpx, aiohttp, raw sockets) through a real proxy (the `proxy` fixture) in front
of real upstreams: the demo's resources server and an SSE server of ours (tests/proxy/upstreams.py).

Each reply a fault shaped carries `X-Gym-Fault-Injected` and `X-Gym-Fault-Event`, and the journal
keeps the exchange's outcome under that event. Waits are asserted as lower bounds, from the test's
own readings or the proxy's journal; what comes before what is shown by an order of events.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Literal

import aiohttp
import httpx
import pytest

from gym_failures._header import FailureHeader
from gym_failures.failure_kinds import (
    INFRASTRUCTURE_ERROR,
    INVALID_REQUEST_PARAMETER,
    MODEL_REQUEST_ERROR,
    PROVIDER_QUOTA_EXHAUSTED,
    PROVIDER_UNAVAILABLE,
    TRANSPORT_UNREACHABLE,
)
from gym_failures.failure_records import FailureBoundary, FailureEvent
from gym_failures.model_endpoint import Attempt
from gym_failures.proxy import INJECTED_TYPE, PlannedFault, ProxyPlan
from gym_failures.proxy.pytest_plugin import ProxyHandle
from tests.processes import free_port
from tests.proxy.upstreams import (
    HANG_GUARD_S,
    SEED_BODY,
    SEED_PREFIX,
    RawReply,
    Resources,
    json_events,
    raw_exchange,
    seen,
    sse_data,
)

Proxy = Callable[..., ProxyHandle]
ALL_EVENTS: list[object] = [0, 1, 2, 3, 4, "[DONE]"]


def _client() -> httpx.Client:
    return httpx.Client(timeout=HANG_GUARD_S)


def _seed(client: httpx.Client, base: str, resources: Resources, fault: str | None = None) -> httpx.Response:
    headers = resources.headers if fault is None else {**resources.headers, "X-Gym-Fault": fault}
    return client.post(f"{base}/seed_session", content=SEED_BODY, headers=headers)


def _raw_seed(
    base: str, resources: Resources, fault: str, until: Literal["eof", "complete", "head"] = "eof"
) -> RawReply:
    headers = {**resources.headers, "X-Gym-Fault": fault}
    return raw_exchange(base, "/seed_session", method="POST", headers=headers, body=SEED_BODY, until=until)


def _indices(text: str) -> list[object]:
    """Each event's `i`, `[DONE]` as it is."""
    return [event if event == "[DONE]" else event["i"] for event in json_events(text)]


def _read_text(reply: httpx.Response) -> tuple[str, httpx.RemoteProtocolError | None]:
    """The body's text as far as it came, and the error that broke it off."""
    text = ""
    try:
        for piece in reply.iter_text():
            text += piece
    except httpx.RemoteProtocolError as error:
        return text, error
    return text, None


def _only(handle: ProxyHandle) -> Attempt:
    [attempt] = handle.journal()
    return attempt


def _marked(headers: httpx.Headers | dict[str, str], attempt: Attempt, fault: str) -> None:
    """The reply names the injected fault and its event, the journal's."""
    assert headers["x-gym-fault-injected"] == fault
    assert attempt.fault == fault
    assert attempt.event_id is not None
    assert headers["x-gym-fault-event"] == attempt.event_id


def _report(headers: httpx.Headers) -> FailureEvent:
    report = FailureHeader.decode(headers)
    assert report is not None
    assert report.failure_id is not None
    return report.events[report.failure_id]


# --- status ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "boundary", "code", "kind", "wait_s", "retry_after", "retry_after_ms"),
    [
        ("status", "resources_server", 503, PROVIDER_UNAVAILABLE, 1.0, "1", None),
        ("status; code=503; retry_after=2", "resources_server", 503, PROVIDER_UNAVAILABLE, 2.0, "2", None),
        ("status; code=429; retry_after_ms=1500", "sandbox", 429, PROVIDER_QUOTA_EXHAUSTED, 1.5, "2", "1500"),
        (
            "status; code=503; retry_after=0.25",
            "resources_server",
            503,
            PROVIDER_UNAVAILABLE,
            0.25,
            "1",
            "250",
        ),
        ("status; code=500", "resources_server", 500, INFRASTRUCTURE_ERROR, None, None, None),
        ("status; code=404", "model", 404, MODEL_REQUEST_ERROR, None, None, None),
    ],
)
def test_status_answers_a_failure_report_of_the_proxys_boundary(
    proxy: Proxy,
    resources: Resources,
    fault: str,
    boundary: str,
    code: int,
    kind: str,
    wait_s: float | None,
    retry_after: str | None,
    retry_after_ms: str | None,
) -> None:
    handle = proxy(resources.url, boundary=boundary)
    with _client() as client:
        reply = _seed(client, handle.url, resources, fault)
    assert reply.status_code == code
    assert reply.headers.get("retry-after") == retry_after
    assert reply.headers.get("retry-after-ms") == retry_after_ms
    failure = _report(reply.headers)
    assert failure.boundary is FailureBoundary(boundary)
    assert (failure.failure_kind, failure.http_status, failure.exception_type) == (kind, code, INJECTED_TYPE)
    assert failure.failure_reason.startswith("[proxy] injected")
    assert failure.event_id == reply.headers["x-gym-fault-event"]
    attempt = _only(handle)
    _marked(reply.headers, attempt, "status")
    assert (attempt.outcome, attempt.status) == ("failed", code)
    assert attempt.retry_after_s == wait_s


def test_status_never_reaches_the_upstream(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    before = seen(events_url, "/echo")
    with _client() as client:
        injected = client.post(f"{handle.url}/echo", content=b"{}", headers={"X-Gym-Fault": "status"})
        passed = client.post(f"{handle.url}/echo", content=b"{}")
    assert (injected.status_code, passed.status_code) == (503, 200)
    assert seen(events_url, "/echo") == before + 1
    assert [a.outcome for a in handle.journal()] == ["failed", "ok"]


def test_a_plan_draws_a_status_on_its_route_only(proxy: Proxy, resources: Resources) -> None:
    planned = PlannedFault(fault="status", rate=1.0, route="/seed_*", params={"code": 502})
    handle = proxy(resources.url, plan=ProxyPlan(faults=[planned]))
    with _client() as client:
        drawn = _seed(client, handle.url, resources)
        other = client.get(f"{handle.url}/health", headers=resources.headers)
    assert drawn.status_code == 502
    assert _report(drawn.headers).failure_reason.startswith("[proxy] injected 502")
    assert other.status_code == 200
    assert "x-gym-fault-injected" not in other.headers


# --- drop_connection, cut_stream ---------------------------------------------------------------------------


@pytest.mark.parametrize("after", [0, 20])
def test_drop_connection_closes_after_n_bytes(proxy: Proxy, resources: Resources, after: int) -> None:
    handle = proxy(resources.url)
    reply = _raw_seed(handle.url, resources, f"drop_connection; after={after}")
    assert reply.status == 200
    assert reply.header("content-length") == "46"
    assert reply.body == SEED_PREFIX[:after]
    assert reply.eof
    assert not reply.reset
    attempt = _only(handle)
    _marked(dict(_headers(reply)), attempt, "drop_connection")
    assert attempt.outcome == "dropped"


def _headers(reply: RawReply) -> list[tuple[str, str]]:
    lines = reply.head.decode("latin-1").split("\r\n")[1:]
    return [
        (name.strip().lower(), value.strip()) for name, _, value in (line.partition(":") for line in lines)
    ]


def test_drop_connection_closes_a_stream_after_n_events(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    headers = {"X-Gym-Fault": "drop_connection; after=2"}
    with _client() as client, client.stream("GET", f"{handle.url}/events", headers=headers) as reply:
        text, broken = _read_text(reply)
    assert isinstance(broken, httpx.RemoteProtocolError)  # the chunked body never ended
    assert _indices(text) == [0, 1]
    attempt = _only(handle)
    _marked(reply.headers, attempt, "drop_connection")
    assert (attempt.outcome, attempt.stream) == ("dropped", True)


@pytest.mark.parametrize(
    ("fault", "events"), [("cut_stream", [0, 1, 2, 3, 4]), ("cut_stream; after=2", [0, 1])]
)
def test_cut_stream_ends_a_stream_cleanly_without_its_last_event(
    proxy: Proxy, events_url: str, fault: str, events: list[object]
) -> None:
    handle = proxy(events_url)
    with _client() as client:
        reply = client.get(f"{handle.url}/events", headers={"X-Gym-Fault": fault})  # no error: a clean end
    assert reply.status_code == 200
    assert _indices(reply.text) == events
    attempt = _only(handle)
    _marked(reply.headers, attempt, "cut_stream")
    assert attempt.outcome == "cut"


def test_cut_stream_on_a_plain_body_drops_the_connection(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    reply = _raw_seed(handle.url, resources, "cut_stream; after=5")
    assert reply.body == SEED_PREFIX[:5]
    assert reply.eof
    assert _only(handle).outcome == "dropped"


# --- slow, slow_first_byte, stall ------------------------------------------------------------------------


def test_slow_holds_the_request_before_the_upstream(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    with _client() as client:
        sent = time.time()
        reply = client.post(f"{handle.url}/echo", content=b"{}", headers={"X-Gym-Fault": "slow; delay=0.3"})
    assert reply.json()["started"] - sent >= 0.3  # the upstream saw it late
    attempt = _only(handle)
    _marked(reply.headers, attempt, "slow")
    assert (attempt.outcome, attempt.delay_s) == ("ok", 0.3)


def test_slow_first_byte_sends_the_head_at_once(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    # The body waits 60 s; the head is read, with no byte of the body, and the client leaves.
    reply = _raw_seed(handle.url, resources, "slow_first_byte; delay=60", until="head")
    assert reply.status == 200
    assert reply.body == b""
    attempt = _only(handle)  # the proxy's wait ended when the client left
    _marked(dict(_headers(reply)), attempt, "slow_first_byte")
    assert attempt.outcome == "disconnected"


def test_slow_first_byte_holds_the_body(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    reply = _raw_seed(handle.url, resources, "slow_first_byte; delay=0.3", until="complete")
    assert reply.complete
    assert reply.body.startswith(SEED_PREFIX)
    assert reply.ended_at - reply.started >= 0.3
    attempt = _only(handle)
    assert attempt.answered_s is not None
    assert attempt.ended_s - attempt.answered_s >= 0.3  # the proxy's clock: the head, then the wait
    assert (attempt.outcome, attempt.delay_s) == ("ok", 0.3)


def test_stall_holds_a_stream_after_n_events_then_goes_on(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    received: list[tuple[float, str]] = []
    headers = {"X-Gym-Fault": "stall; after=2; delay=0.3"}
    with _client() as client, client.stream("GET", f"{handle.url}/events", headers=headers) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                received.append((time.time(), line[len("data: ") :]))
    assert [data for _, data in received][-1] == "[DONE]"
    events = [(at, json.loads(data)) for at, data in received[:-1]]
    assert [event["i"] for _, event in events] == [0, 1, 2, 3, 4]
    at, third = events[2]
    assert at - third["at"] >= 0.3  # the stall came before it: it reached the proxy, then waited
    attempt = _only(handle)
    _marked(reply.headers, attempt, "stall")
    assert (attempt.outcome, attempt.delay_s) == ("ok", 0.3)


def test_stall_holds_a_body_after_n_bytes(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    reply = _raw_seed(handle.url, resources, "stall; after=10; delay=0.3", until="complete")
    assert reply.complete
    assert json.loads(reply.body)["session_id"].startswith("sess_")
    assert reply.ended_at - reply.started >= 0.3
    assert _only(handle).outcome == "ok"


# --- malformed_json, oversized_header --------------------------------------------------------------------


def test_malformed_json_cuts_a_body_keeping_its_length(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    with _client() as client:
        reply = _seed(client, handle.url, resources, "malformed_json")
    assert reply.status_code == 200
    assert reply.headers["content-length"] == str(len(reply.content)) == "23"
    assert reply.content == SEED_PREFIX + reply.content[len(SEED_PREFIX) :]
    with pytest.raises(json.JSONDecodeError):
        json.loads(reply.content)
    attempt = _only(handle)
    _marked(reply.headers, attempt, "malformed_json")
    assert attempt.outcome == "malformed"


def test_malformed_json_on_a_stream_spoils_the_event_after_n(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    with _client() as client:
        reply = client.get(f"{handle.url}/events", headers={"X-Gym-Fault": "malformed_json; after=2"})
    data = sse_data(reply.text)
    assert len(data) == 6
    assert data[-1] == "[DONE]"
    with pytest.raises(json.JSONDecodeError):
        json.loads(data[2])
    assert [json.loads(data[i])["i"] for i in (0, 1, 3, 4)] == [0, 1, 3, 4]
    attempt = _only(handle)
    _marked(reply.headers, attempt, "malformed_json")
    assert attempt.outcome == "malformed"


def test_oversized_header_is_refused_by_httpx_past_its_limit(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    with _client() as client:
        small = _seed(client, handle.url, resources, "oversized_header; size=100")
        assert small.headers["x-gym-oversized"] == "a" * 100
        with pytest.raises(httpx.RemoteProtocolError):
            _seed(client, handle.url, resources, "oversized_header; size=200000")  # h11's limit: 100 KiB


def test_oversized_header_is_refused_by_aiohttp(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)

    async def call() -> None:
        async with aiohttp.ClientSession() as session:
            headers = {**resources.headers, "X-Gym-Fault": "oversized_header"}
            async with session.post(f"{handle.url}/seed_session", data=SEED_BODY, headers=headers):
                pass

    with pytest.raises(aiohttp.ClientResponseError, match="8190 bytes"):
        asyncio.run(call())


def test_oversized_header_by_default_is_refused_by_httpx(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    with _client() as client, pytest.raises(httpx.RemoteProtocolError):
        _seed(client, handle.url, resources, "oversized_header")


# --- none, a bad header, times ------------------------------------------------------------------------------


def test_none_passes_whatever_is_queued(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    handle.force("status", code=503)
    with _client() as client:
        passed = _seed(client, handle.url, resources, "none")
        queued = _seed(client, handle.url, resources)
    assert passed.status_code == 200
    assert "x-gym-fault-injected" not in passed.headers
    assert queued.status_code == 503  # the queued fault waited for the next request
    assert [(a.outcome, a.fault) for a in handle.journal()] == [("ok", None), ("failed", "status")]


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("bogus", "unknown fault 'bogus'"),
        ("status; code=99", "parameter 'code'"),
        ("stall; after=-1", "parameter 'after'"),
        ("slow; wat=1", "unknown parameter 'wat'"),
    ],
)
def test_a_bad_fault_header_is_refused_with_its_reason(
    proxy: Proxy, events_url: str, fault: str, reason: str
) -> None:
    handle = proxy(events_url)
    before = seen(events_url, "/echo")
    with _client() as client:
        reply = client.post(f"{handle.url}/echo", content=b"{}", headers={"X-Gym-Fault": fault})
    assert reply.status_code == 400
    assert "x-gym-fault-injected" not in reply.headers
    failure = _report(reply.headers)
    assert failure.failure_kind == INVALID_REQUEST_PARAMETER
    assert failure.failure_reason.startswith("[proxy] ")
    assert reason in failure.failure_reason
    assert seen(events_url, "/echo") == before
    assert _only(handle).outcome == "failed"


def test_times_applies_a_fault_that_many_times(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    handle.force("status", times=2, code=500)
    with _client() as client:
        header = [
            _seed(client, handle.url, resources, "status; code=503; times=1").status_code for _ in range(2)
        ]
        queued = [_seed(client, handle.url, resources).status_code for _ in range(3)]
    assert header == [503, 200]
    assert queued == [500, 500, 200]


# --- every reply a fault shaped is marked ----------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        "status",
        "drop_connection; after=1",
        "cut_stream",
        "slow; delay=0",
        "slow_first_byte; delay=0",
        "stall; delay=0",
        "malformed_json",
        "oversized_header; size=10",
    ],
)
def test_every_reply_a_fault_shaped_names_it_and_its_event(proxy: Proxy, events_url: str, fault: str) -> None:
    handle = proxy(events_url)
    headers = {"X-Gym-Fault": fault, "Connection": "close"}
    reply = raw_exchange(handle.url, "/events", headers=headers)
    name = fault.partition(";")[0]
    attempt = _only(handle)
    _marked(dict(_headers(reply)), attempt, name)
    outcomes = {
        "status": "failed",
        "drop_connection": "dropped",
        "cut_stream": "cut",
        "malformed_json": "malformed",
    }
    assert attempt.outcome == outcomes.get(name, "ok")
    # And a reply no fault shaped is not marked.
    plain = raw_exchange(handle.url, "/events", headers={"Connection": "close"})
    assert "x-gym-fault-injected" not in dict(_headers(plain))
    assert [(a.fault, a.event_id) for a in handle.journal()[1:]] == [(None, None)]


def test_an_upstream_the_proxy_cannot_reach_is_a_real_502_not_an_injected_one(proxy: Proxy) -> None:
    handle = proxy(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with _client() as client:
        reply = client.get(f"{handle.url}/verify?token=secret")
    assert reply.status_code == 502
    assert "x-gym-fault-injected" not in reply.headers
    failure = _report(reply.headers)
    assert failure.boundary is FailureBoundary.RESOURCES_SERVER
    assert failure.failure_kind == TRANSPORT_UNREACHABLE
    assert failure.exception_type != INJECTED_TYPE
    assert "injected" not in failure.failure_reason
    assert "secret" not in failure.failure_reason  # the request's URL is never quoted
    assert (_only(handle).outcome, _only(handle).fault) == ("failed", None)
