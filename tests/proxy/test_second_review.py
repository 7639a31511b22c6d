"""What a second review found and the proxy now does: an upstream toxic that paces the request keeps
its `Content-Length` (the upstream reads the whole body, and the next request on the connection is
its own); a request target that is not a path leaves none of itself in the journal or the verdict;
`reset_peer` resets a connection whose reply would end before its time; a queued fault's route is a
glob with `?` and `[...]` as a toxic's is; the control routes refuse a `toxicity` that is not a
number and a `params` that holds the scenario's own fields."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gym_failures.model_endpoint import ModelEndpoint, ModelEndpointPlan
from gym_failures.proxy import ChaosProxy
from gym_failures.proxy.pytest_plugin import ProxyHandle
from tests.proxy.threaded import serve_in_thread
from tests.proxy.upstreams import HANG_GUARD_S, raw_exchange

Proxy = Callable[..., ProxyHandle]
SECRET = "S3cr3tT0k3nXYZcanary"
_MISPLACED = "`params` holds `{field}`, a field of the scenario itself (beside `params`)"


def _posts_on_one_connection(base_url: str, bodies: list[bytes]) -> list[dict[str, Any]]:
    """POST each body to `/echo` in turn on one kept-alive connection; each reply's JSON."""
    with httpx.Client(timeout=HANG_GUARD_S, limits=httpx.Limits(max_connections=1)) as client:
        return [client.post(f"{base_url}/echo", content=body).json() for body in bodies]


@pytest.mark.parametrize(
    "toxic",
    [
        {"type": "bandwidth", "stream": "upstream", "attributes": {"rate": 1000}},
        {"type": "slicer", "stream": "upstream", "attributes": {"average_size": 3, "delay": 10}},
        {"type": "slow_close", "stream": "upstream", "attributes": {"delay": 10}},
    ],
    ids=lambda toxic: str(toxic["type"]),
)
def test_an_upstream_toxic_that_paces_the_request_keeps_its_length(
    proxy: Proxy, events_url: str, toxic: dict[str, Any]
) -> None:
    handle = proxy(events_url)
    handle.add_toxic(toxic)
    bodies = [b'{"answer": 42}', b"x" * 100, b'{"answer": 43}']
    replies = _posts_on_one_connection(handle.url, bodies)
    assert [reply["size"] for reply in replies] == [len(body) for body in bodies]
    # Framed as the client framed it: an upstream that reads no chunked body reads it too.
    assert [reply["content-length"] for reply in replies] == [str(len(body)) for body in bodies]
    assert [reply["transfer-encoding"] for reply in replies] == [None] * 3
    assert [attempt.outcome for attempt in handle.journal()] == ["ok"] * 3


def _absolute_form_scope() -> dict[str, Any]:
    """A request whose target is an absolute URL with user info, as h11 hands it on."""
    target = f"http://user:{SECRET}@127.0.0.1:9/echo"
    return {
        "type": "http",
        "method": "GET",
        "path": target,
        "raw_path": target.encode(),
        "query_string": b"",
        "headers": [(b"host", b"x")],
    }


def test_a_target_that_is_not_a_path_leaves_nothing_of_itself_in_the_journal() -> None:
    proxy = ChaosProxy(upstream="http://127.0.0.1:9")
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for _ in range(3):
        asyncio.run(proxy.serve(_absolute_form_scope(), receive, send))
    assert sent[0]["status"] == 400
    attempts = proxy.journal.attempts()
    assert [attempt.route for attempt in attempts] == ["(not a path)"] * 3
    verdict = proxy.verdict()
    everything = json.dumps([a.model_dump() for a in attempts]) + json.dumps(verdict.model_dump()) + str(sent)
    assert SECRET not in everything
    assert "user:" not in everything


@pytest.mark.parametrize("how", ["client leaves mid-body", "body too large"])
def test_a_target_that_is_not_a_path_is_never_journaled_however_the_exchange_ends(how: str) -> None:
    """Found by a second review: the exchanges that end before the target is refused (the client
    leaving mid-body, a body past the bound) journaled the target too."""
    from gym_failures.proxy._exchange import MAX_REQUEST_BYTES

    proxy = ChaosProxy(upstream="http://127.0.0.1:9")

    async def receive() -> dict[str, Any]:
        if how == "client leaves mid-body":
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": b"x" * (MAX_REQUEST_BYTES + 1), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    asyncio.run(proxy.serve(_absolute_form_scope(), receive, send))
    attempts = proxy.journal.attempts()
    assert [attempt.route for attempt in attempts] == ["(not a path)"]
    everything = json.dumps([a.model_dump() for a in attempts]) + json.dumps(proxy.verdict().model_dump())
    assert SECRET not in everything


def test_reset_peer_resets_a_reply_that_would_end_before_its_time(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "reset_peer", "attributes": {"timeout": 400}})
    # 20 bytes, written at once: the reply would be whole long before the reset.
    reply = raw_exchange(handle.url, "/bytes?n=20")
    assert reply.status == 200
    assert reply.header("content-length") is None  # its end is held: the reply is never whole
    assert reply.reset
    assert not reply.eof
    # uvloop's timer reads whole milliseconds; the proxy then waits out the rest on the monotonic clock.
    assert reply.ended_at - reply.started >= 0.4 - 0.001
    assert [(a.outcome, a.fault) for a in handle.journal()] == [("dropped", "reset_peer")]


def test_reset_peer_on_a_client_that_leaves_first_is_its_leaving(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "reset_peer", "attributes": {"timeout": 3_600_000}})
    parts = urllib.parse.urlsplit(handle.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(b"GET /bytes?n=20 HTTP/1.1\r\nHost: x\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + HANG_GUARD_S  # speed-ok: a hang guard, not a measure
    while not handle.journal() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(a.outcome, a.fault) for a in handle.journal()] == [("disconnected", "reset_peer")]


@pytest.mark.parametrize("route", ["/byte?", "/[ab]ytes", "/b*"])
def test_a_queued_faults_route_is_a_glob_with_any_of_its_marks(
    proxy: Proxy, events_url: str, route: str
) -> None:
    handle = proxy(events_url)
    handle.force("status", code=503, route=route)
    with httpx.Client(timeout=HANG_GUARD_S) as client:
        assert client.get(f"{handle.url}/echoes").status_code == 404  # another route: passed on
        assert client.get(f"{handle.url}/bytes?n=1").status_code == 503
        assert client.get(f"{handle.url}/bytes?n=1").status_code == 200  # once


@pytest.mark.parametrize("toxicity", ["0.5", True, None, [0.5]])
def test_a_toxicity_that_is_not_a_number_is_refused(events_url: str, toxicity: object) -> None:
    proxy = ChaosProxy(upstream=events_url)
    with serve_in_thread(proxy.app()) as url:
        body = {"type": "latency", "toxicity": toxicity, "attributes": {"latency": 1}}
        reply = httpx.post(f"{url}/_gym/toxics", json=body, timeout=HANG_GUARD_S)
    assert reply.status_code == 400, reply.text
    assert "toxicity" in reply.text
    assert proxy.toxics.listed() == []


@pytest.mark.parametrize("field", ["fault", "times", "route", "stream"])
def test_the_proxys_queue_refuses_params_holding_a_scenarios_field(events_url: str, field: str) -> None:
    proxy = ChaosProxy(upstream=events_url)
    with serve_in_thread(proxy.app()) as url:
        body = {"fault": "status", "params": {"code": 503, field: 2}}
        reply = httpx.post(f"{url}/_gym/faults", json=body, timeout=HANG_GUARD_S)
    assert reply.status_code == 400
    assert reply.json()["error"] == _MISPLACED.format(field=field)
    assert "keyword argument" not in reply.text


@pytest.mark.parametrize("field", ["fault", "times", "model", "tools"])
def test_the_model_endpoints_queue_refuses_params_holding_a_scenarios_field(field: str) -> None:
    endpoint = ModelEndpoint(ModelEndpointPlan())
    with serve_in_thread(endpoint.app()) as url:
        body = {"fault": "quota_429", "params": {field: 2}}
        reply = httpx.post(f"{url}/_gym/faults", json=body, timeout=HANG_GUARD_S)
    assert reply.status_code == 400
    assert _MISPLACED.format(field=field) in reply.text
    assert "keyword argument" not in reply.text


def test_an_idle_upstream_connection_is_dropped_before_uvicorns_keep_alive_ends() -> None:
    """A POST on a pooled connection the upstream was closing came back 502 (aiohttp retries such a
    failure only for idempotent methods), seen in the proxy benchmark: the proxy keeps an idle
    connection for less than uvicorn's keep-alive, so it never reuses one the upstream is closing."""
    import uvicorn

    from gym_failures.proxy._forward import UPSTREAM_KEEPALIVE_S

    assert 0 < UPSTREAM_KEEPALIVE_S < uvicorn.Config(app="unused:app").timeout_keep_alive
