"""Each of Toxiproxy's toxics does on the wire what Toxiproxy documents (the summary in
src/gym_failures/proxy/_toxics.py), seen by real clients (httpx, raw sockets) through a real proxy (the
`proxy` fixture) in front of real upstreams: the demo's resources server and an SSE server of ours
(tests/proxy/upstreams.py).

Waits are asserted as lower bounds, from the test's own readings. That a toxic waited no more than it
should is shown by the waits the proxy asked for on a held clock (`probe`, tests/proxy/conftest.py);
what waits for what is shown by an order of events, never by a deadline.
"""

from __future__ import annotations

import errno
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Literal

import httpx
import pytest

from gym_failures.proxy import ProxyPlan, Toxic
from gym_failures.proxy.pytest_plugin import ProxyHandle
from tests.proxy.upstreams import (
    HANG_GUARD_S,
    ONE_WRITE_BODY,
    SEED_BODY,
    SEED_PREFIX,
    Probe,
    RawReply,
    Resources,
    body_of,
    json_events,
    raw_exchange,
    seen,
)

Proxy = Callable[..., ProxyHandle]


def _client() -> httpx.Client:
    return httpx.Client(timeout=HANG_GUARD_S)


def _seed(base: str, resources: Resources, until: Literal["eof", "complete", "head"] = "eof") -> RawReply:
    """`POST /seed_session` on a raw socket, kept alive."""
    return raw_exchange(
        base, "/seed_session", method="POST", headers=resources.headers, body=SEED_BODY, until=until
    )


def _is_reset(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is a connection reset (ECONNRESET)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ECONNRESET:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _outcomes(handle: ProxyHandle) -> list[tuple[str, str | None]]:
    return [(attempt.outcome, attempt.fault) for attempt in handle.journal()]


# --- latency -------------------------------------------------------------------------------------------


def test_latency_delays_the_resources_servers_reply(proxy: Proxy, resources: Resources, probe: Probe) -> None:
    handle = proxy(resources.url)
    handle.add_toxic({"type": "latency", "attributes": {"latency": 200}})
    with _client() as client:
        started = time.monotonic()
        reply = client.post(f"{handle.url}/seed_session", content=SEED_BODY, headers=resources.headers)
        done = time.monotonic()
    assert reply.status_code == 200
    assert reply.content.startswith(SEED_PREFIX)
    assert done - started >= 0.2
    assert probe.positive_waits[0] == pytest.approx(0.2)  # the head's
    assert reply.headers["x-gym-fault-injected"] == "latency"
    [attempt] = handle.journal()
    assert (attempt.outcome, attempt.fault, attempt.delay_s) == ("ok", "latency", 0.2)
    assert attempt.event_id == reply.headers["x-gym-fault-event"]


def test_latency_is_applied_once_to_a_plain_reply(proxy: Proxy, one_write_url: str, probe: Probe) -> None:
    handle = proxy(one_write_url)
    handle.add_toxic({"type": "latency", "attributes": {"latency": 200}})
    reply = raw_exchange(handle.url, "/verify", method="POST", body=b"{}", until="complete")
    assert reply.body == ONE_WRITE_BODY
    assert reply.ended_at - reply.started >= 0.2
    # The head waited the latency; the body, which came with it, had waited as long by then: it does
    # not wait again (Toxiproxy's pipelining), nor does it wait per piece.
    assert probe.positive_waits == pytest.approx([0.2])


def test_latency_with_jitter_draws_within_latency_plus_or_minus_jitter(
    proxy: Proxy, one_write_url: str, probe: Probe
) -> None:
    handle = proxy(one_write_url)
    handle.add_toxic({"type": "latency", "attributes": {"latency": 200, "jitter": 100}})
    for _ in range(3):
        probe.waits.clear()
        reply = raw_exchange(handle.url, "/verify", method="POST", body=b"{}", until="complete")
        assert reply.body == ONE_WRITE_BODY
        assert reply.ended_at - reply.started >= 0.1
        head, *body = probe.positive_waits
        assert 0.1 - 1e-9 <= head <= 0.3 + 1e-9
        # The body, which came with the head, leaves its own draw after that: by latency + jitter.
        assert head + sum(body) <= 0.3 + 1e-9


def test_latency_delays_every_event_of_a_stream(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "latency", "attributes": {"latency": 200}})
    received: list[tuple[float, str]] = []
    with _client() as client, client.stream("GET", f"{handle.url}/events?n=4&gap_ms=50") as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                received.append((time.time(), line[len("data: ") :]))
    assert [data for _, data in received][-1] == "[DONE]"
    events = [(at, json.loads(data)) for at, data in received[:-1]]
    assert [event["i"] for _, event in events] == [0, 1, 2, 3]
    for at, event in events:
        assert at - event["at"] >= 0.2, event  # every event, not only the first: written -> read


@pytest.mark.parametrize("stream", ["upstream", "downstream"])
def test_latency_upstream_delays_the_request_downstream_the_reply(
    proxy: Proxy, events_url: str, stream: str
) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "latency", "stream": stream, "attributes": {"latency": 200}})
    with _client() as client:
        sent = time.time()
        reply = client.post(f"{handle.url}/echo", content=b"x" * 100)
        received = time.time()
    echo = reply.json()
    assert echo["size"] == 100
    if stream == "upstream":
        assert echo["started"] - sent >= 0.2  # the request reached the upstream late
    else:
        assert received - echo["arrived"] >= 0.2  # the reply reached the client late
    assert _outcomes(handle) == [("ok", "latency")]


# --- bandwidth -----------------------------------------------------------------------------------------


def test_bandwidth_limits_a_body_to_its_rate(proxy: Proxy, events_url: str, probe: Probe) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "bandwidth", "attributes": {"rate": 16}})
    reply = raw_exchange(handle.url, "/bytes?n=4000", until="complete")
    assert reply.status == 200
    assert reply.body == body_of(4000)
    # 4000 bytes at 16 KB/s: the last byte comes 0.25 s after the first could have.
    assert reply.ended_at - reply.started >= 4000 / 16_000
    assert sum(probe.positive_waits) == pytest.approx(4000 / 16_000)
    assert max(len(piece) for piece in probe.pieces) <= 1600  # a tenth of a second's worth at most


def test_bandwidth_paces_the_resources_servers_reply_whole(
    proxy: Proxy, resources: Resources, probe: Probe
) -> None:
    handle = proxy(resources.url)
    handle.add_toxic({"type": "bandwidth", "attributes": {"rate": 32}})
    with _client() as client:
        started = time.monotonic()
        reply = client.post(
            f"{handle.url}/sandbox/run", json=resources.big_request(), headers=resources.headers
        )
        done = time.monotonic()
    assert reply.status_code == 200
    assert reply.json()["stdout"] == str(10**4000) + "\n"
    assert done - started >= len(reply.content) / 32_000
    assert sum(probe.positive_waits) == pytest.approx(len(reply.content) / 32_000)


def test_bandwidth_upstream_paces_the_request_body(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "bandwidth", "stream": "upstream", "attributes": {"rate": 8}})
    with _client() as client:
        sent = time.time()
        reply = client.post(f"{handle.url}/echo", content=b"y" * 2400)
    echo = reply.json()
    assert echo["size"] == 2400
    assert echo["arrived"] - sent >= 2400 / 8000


# --- slicer --------------------------------------------------------------------------------------------


def test_slicer_sends_a_body_in_pieces_delay_apart(proxy: Proxy, resources: Resources, probe: Probe) -> None:
    handle = proxy(resources.url)
    # `delay` in microseconds, as Toxiproxy's: 50 ms.
    handle.add_toxic({"type": "slicer", "attributes": {"average_size": 10, "delay": 50_000}})
    reply = _seed(handle.url, resources, until="complete")
    assert reply.complete
    assert reply.body.startswith(SEED_PREFIX)
    assert json.loads(reply.body)["session_id"].startswith("sess_")
    pieces = math.ceil(len(reply.body) / 10)
    assert reply.ended_at - reply.started >= (pieces - 1) * 0.05
    assert b"".join(probe.pieces) == reply.body
    assert [len(piece) for piece in probe.pieces[:-1]] == [10] * (len(probe.pieces) - 1)
    assert probe.positive_waits == pytest.approx([0.05] * (len(probe.pieces) - 1))


def test_slicer_pieces_vary_within_size_variation(proxy: Proxy, events_url: str, probe: Probe) -> None:
    handle = proxy(events_url)
    handle.add_toxic(
        {"type": "slicer", "attributes": {"average_size": 20, "size_variation": 8, "delay": 10_000}}
    )
    reply = raw_exchange(handle.url, "/bytes?n=400", until="complete")
    assert reply.body == body_of(400)
    assert reply.ended_at - reply.started >= (math.ceil(400 / 28) - 1) * 0.01
    sizes = [len(piece) for piece in probe.pieces]
    assert sum(sizes) == 400
    assert all(12 <= size <= 28 for size in sizes[:-1]), sizes
    assert sizes[-1] <= 28


def test_slicer_keeps_a_streams_events_whole(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "slicer", "attributes": {"average_size": 7, "size_variation": 3, "delay": 1}})
    with _client() as client:
        reply = client.get(f"{handle.url}/events?n=5")
    assert [event if event == "[DONE]" else event["i"] for event in json_events(reply.text)] == [
        0,
        1,
        2,
        3,
        4,
        "[DONE]",
    ]


# --- slow_close, timeout -------------------------------------------------------------------------------


def test_slow_close_sends_the_body_then_closes_after_delay(
    proxy: Proxy, resources: Resources, probe: Probe
) -> None:
    handle = proxy(resources.url)
    handle.add_toxic({"type": "slow_close", "attributes": {"delay": 200}})
    reply = _seed(handle.url, resources)  # kept alive: only the proxy closes it
    assert reply.complete
    assert reply.body.startswith(SEED_PREFIX)
    assert reply.eof
    assert not reply.reset
    assert reply.header("connection") == "close"
    assert reply.ended_at - reply.started >= 0.2
    assert 0.2 in probe.waits
    assert _outcomes(handle) == [("ok", "slow_close")]


@pytest.mark.parametrize(("stream", "reaches_upstream"), [("downstream", True), ("upstream", False)])
def test_timeout_closes_the_connection_without_a_reply_after_timeout(
    proxy: Proxy, events_url: str, stream: str, reaches_upstream: bool
) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "timeout", "stream": stream, "attributes": {"timeout": 200}})
    before = seen(events_url, "/echo")
    reply = raw_exchange(handle.url, "/echo", method="POST", body=b"{}")
    assert reply.data == b""
    assert reply.eof
    assert not reply.reset
    assert reply.ended_at - reply.started >= 0.2
    assert seen(events_url, "/echo") == before + reaches_upstream
    assert _outcomes(handle) == [("dropped", "timeout")]


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_timeout_zero_holds_the_connection_until_the_toxic_is_removed(
    proxy: Proxy, events_url: str, probe: Probe, stream: str
) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "timeout", "stream": stream, "attributes": {"timeout": 0}})
    order: list[str] = []
    replies: list[RawReply] = []

    def call() -> None:
        replies.append(raw_exchange(handle.url, "/echo", method="POST", body=b"{}"))
        order.append("closed")

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    guard = time.monotonic() + HANG_GUARD_S
    while 0.05 not in probe.waits and time.monotonic() < guard:  # the proxy holds it, polling the set
        time.sleep(0.01)
    time.sleep(0.2)  # a moment: the connection stays open, however long
    assert caller.is_alive()
    assert order == []
    order.append("removed")
    handle.remove_toxic(f"timeout_{stream}")
    caller.join(HANG_GUARD_S)
    assert order == ["removed", "closed"]
    [reply] = replies
    assert reply.data == b""
    assert reply.eof
    assert not reply.reset
    assert _outcomes(handle) == [("dropped", "timeout")]


# --- reset_peer ----------------------------------------------------------------------------------------


def test_reset_peer_zero_resets_at_once(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    handle.add_toxic({"type": "reset_peer", "attributes": {"timeout": 0}})
    reply = _seed(handle.url, resources)
    assert reply.reset
    assert reply.data == b""
    with _client() as client, pytest.raises(httpx.ReadError) as raised:
        client.post(f"{handle.url}/seed_session", content=SEED_BODY, headers=resources.headers)
    assert _is_reset(raised.value), repr(raised.value)
    assert _outcomes(handle) == [("dropped", "reset_peer")] * 2


def test_reset_peer_resets_after_timeout_and_sends_nothing_more(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "reset_peer", "attributes": {"timeout": 300}})
    # Three events 2 s apart: the stream's end is seconds away when the reset comes.
    reply = raw_exchange(handle.url, "/events?n=3&gap_ms=2000")
    assert reply.reset
    assert not reply.eof
    assert b"[DONE]" not in reply.body
    # The proxy's timer (`asyncio.timeout`) runs on uvloop's clock, read in whole milliseconds: it
    # may fire up to one before 0.3 s of the test's clock have passed (reported).
    assert reply.ended_at - reply.started >= 0.3 - 0.001
    assert _outcomes(handle) == [("dropped", "reset_peer")]


# --- limit_data ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, 1, 20])
def test_limit_data_closes_after_exactly_its_bytes(proxy: Proxy, resources: Resources, limit: int) -> None:
    handle = proxy(resources.url)
    handle.add_toxic({"type": "limit_data", "attributes": {"bytes": limit}})
    reply = _seed(handle.url, resources)  # kept alive, read to the end: only the proxy closes it
    assert reply.status == 200
    assert reply.header("content-length") == "46"
    assert reply.body == SEED_PREFIX[:limit]
    assert reply.eof
    assert not reply.reset
    assert _outcomes(handle) == [("dropped", "limit_data")]


def test_limit_data_above_the_body_passes_it_whole(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    handle.add_toxic({"type": "limit_data", "attributes": {"bytes": 46}})
    reply = _seed(handle.url, resources, until="complete")
    assert reply.complete
    assert not reply.eof
    assert _outcomes(handle) == [("ok", "limit_data")]


def test_limit_data_upstream_never_sends_a_longer_request(proxy: Proxy, events_url: str) -> None:
    handle = proxy(events_url)
    handle.add_toxic({"type": "limit_data", "stream": "upstream", "attributes": {"bytes": 10}})
    before = seen(events_url, "/echo")
    cut = raw_exchange(handle.url, "/echo", method="POST", body=b"z" * 100)
    assert cut.data == b""
    assert cut.eof
    assert seen(events_url, "/echo") == before
    with _client() as client:
        whole = client.post(f"{handle.url}/echo", content=b"z" * 10)
    assert whole.json()["size"] == 10
    assert seen(events_url, "/echo") == before + 1
    assert _outcomes(handle) == [("dropped", "limit_data"), ("ok", "limit_data")]


# --- toxicity, route, the control routes ---------------------------------------------------------------


def test_toxicity_zero_never_acts(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    handle.add_toxic({"type": "reset_peer", "toxicity": 0.0})
    with _client() as client:
        for _ in range(5):
            reply = client.post(f"{handle.url}/seed_session", content=SEED_BODY, headers=resources.headers)
            assert reply.status_code == 200
            assert "x-gym-fault-injected" not in reply.headers
    assert _outcomes(handle) == [("ok", None)] * 5


def test_toxicity_one_always_acts(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    handle.add_toxic({"type": "reset_peer", "toxicity": 1.0})
    assert all(_seed(handle.url, resources).reset for _ in range(3))
    assert _outcomes(handle) == [("dropped", "reset_peer")] * 3


def test_toxicity_draws_repeat_with_the_plans_seed(proxy: Proxy, resources: Resources) -> None:
    plan = ProxyPlan(seed=7, toxics=[Toxic(type="reset_peer", toxicity=0.5)])
    patterns = []
    for _ in range(2):
        handle = proxy(resources.url, plan=plan)
        patterns.append([_seed(handle.url, resources, until="complete").reset for _ in range(12)])
    assert patterns[0] == patterns[1]
    assert True in patterns[0]
    assert False in patterns[0]


def test_a_route_restricts_a_toxic_to_its_paths(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    handle.add_toxic({"type": "reset_peer", "route": "/sandbox/*"})
    assert _seed(handle.url, resources, until="complete").complete
    sandbox = raw_exchange(
        handle.url,
        "/sandbox/run",
        method="POST",
        headers=resources.headers,
        body=json.dumps(resources.big_request()).encode(),
    )
    assert sandbox.reset
    assert sandbox.data == b""
    assert _outcomes(handle) == [("ok", None), ("dropped", "reset_peer")]


def test_toxics_are_added_listed_and_removed_over_http(proxy: Proxy, resources: Resources) -> None:
    handle = proxy(resources.url)
    with _client() as client:
        toxic = {"type": "latency", "toxicity": 1, "attributes": {"latency": 100}, "route": "/seed_session"}
        added = client.post(f"{handle.url}/_gym/toxics", json=toxic)
        assert added.status_code == 200
        assert added.json()["name"] == "latency_downstream"
        listed = client.get(f"{handle.url}/_gym/toxics").json()
        assert [t["attributes"] for t in listed] == [{"latency": 100, "jitter": 0}]
        started = time.monotonic()
        slow = client.post(f"{handle.url}/seed_session", content=SEED_BODY, headers=resources.headers)
        assert time.monotonic() - started >= 0.1
        assert slow.headers["x-gym-fault-injected"] == "latency"
        assert client.delete(f"{handle.url}/_gym/toxics/latency_downstream").status_code == 204
        plain = client.post(f"{handle.url}/seed_session", content=SEED_BODY, headers=resources.headers)
        assert "x-gym-fault-injected" not in plain.headers
        misspelt = {"type": "latency", "attributes": {"latncy": 100}}
        refused = client.post(f"{handle.url}/_gym/toxics", json=misspelt)
        assert refused.status_code == 400
        assert "latncy" in refused.text
