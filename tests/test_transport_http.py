"""A real uvicorn server and real aiohttp and httpx clients: the failure header arrives intact, and the
bound is what keeps aiohttp able to read the reply at all."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import aiohttp
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gym_failures.failure_records import FailureEvent, FailureReport
from gym_failures.failure_transport import FailureHeader

# aiohttp's default `max_field_size`: its C parser refuses a header value longer than this, its
# pure-Python parser a header line (name, ": " and value) longer than this.
AIOHTTP_MAX_FIELD_SIZE = 8190


def _event(event_id: str, **fields: Any) -> FailureEvent:
    data: dict[str, Any] = {"event_id": event_id, "boundary": "model", "failure_kind": "model_server_error"}
    data.update(fields)
    return FailureEvent.model_validate(data)


def _sized_report(size: int) -> FailureReport:
    """A valid report whose compact JSON is exactly `size` bytes (reasons of at most 2000 ASCII
    characters, one more event for every 2000 bytes)."""
    ids = [f"event-{index}" for index in range(size // 1500 + 1)]
    missing = size - len(FailureReport(events={i: _event(i) for i in ids}).model_dump_json())
    events = {}
    for event_id in ids:
        take = min(missing, 2000)
        events[event_id] = _event(event_id, failure_reason="r" * take)
        missing -= take
    report = FailureReport(events=events)
    assert len(report.model_dump_json()) == size
    return report


def _chain() -> FailureReport:
    cause = _event(
        "cause-1",
        boundary="sandbox",
        failure_kind="provider_oom_killed",
        failure_reason="exit 137",
        details={"exit_code": 137, "sandbox_id": "sbx-1"},
    )
    failure = _event("failure-1", cause_id="cause-1", http_status=502, failure_reason="tool run failed")
    return FailureReport(events={"cause-1": cause, "failure-1": failure}, failure_id="failure-1")


REPORTS = {
    "chain": _chain(),
    # Control characters, non-ASCII and DEL: h11 refuses to send a raw DEL or line break in a value.
    "escaped": FailureReport(
        events={"e": _event("e", failure_reason="naïve\r\nline two\x7f 模型 🚀")}, failure_id="e"
    ),
    "at-bound": _sized_report(FailureHeader.MAX_BYTES),
    "over-bound": _sized_report(FailureHeader.MAX_BYTES + 1),
    "omitted": FailureReport(omitted=True),
}
EXPECTED = {**REPORTS, "over-bound": FailureReport(omitted=True)}


async def _reply(request: Request) -> PlainTextResponse:
    report = REPORTS[request.path_params["name"]]
    return PlainTextResponse("upstream failed", status_code=502, headers=FailureHeader.encode(report))


async def _unbounded(request: Request) -> PlainTextResponse:
    """What a server sending the report whatever its size would reply."""
    value = _sized_report(request.path_params["size"]).model_dump_json()
    return PlainTextResponse("upstream failed", status_code=502, headers={FailureHeader.NAME: value})


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/reply/{name}", _reply), Route("/unbounded/{size:int}", _unbounded)])
    # No log_config: uvicorn would otherwise reconfigure logging for the whole test process.
    config = uvicorn.Config(app, lifespan="off", http="h11", ws="none", log_config=None, log_level="warning")
    server = uvicorn.Server(config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn-test")
    thread.start()
    try:
        deadline = time.monotonic() + 60  # a hang guard: start-up on a loaded machine
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
    assert not thread.is_alive(), "the test server did not stop"


async def _aiohttp(url: str) -> tuple[int, Mapping[str, str], str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, response.headers, await response.text()


async def _aiohttp_dict(url: str) -> tuple[int, Mapping[str, str], str]:
    status, headers, body = await _aiohttp(url)
    return status, dict(headers), body


async def _httpx(url: str) -> tuple[int, Mapping[str, str], str]:
    async with httpx.AsyncClient(verify=_TLS) as client:
        response = await client.get(url)
    return response.status_code, response.headers, response.text


async def _httpx_dict(url: str) -> tuple[int, Mapping[str, str], str]:
    """`dict()` of httpx's headers has lower-case keys only, unlike the name `encode` sends."""
    status, headers, body = await _httpx(url)
    plain = dict(headers)
    assert FailureHeader.NAME not in plain
    return status, plain, body


# Loading the CA bundle costs about 0.1 s per client; these tests speak plain HTTP anyway.
_TLS = httpx.create_ssl_context()


Fetch = Callable[[str], Awaitable[tuple[int, Mapping[str, str], str]]]
CLIENTS: list[Any] = [
    pytest.param(_aiohttp, id="aiohttp"),
    pytest.param(_aiohttp_dict, id="aiohttp-dict"),
    pytest.param(_httpx, id="httpx"),
    pytest.param(_httpx_dict, id="httpx-dict"),
]


@pytest.mark.parametrize("fetch", CLIENTS)
@pytest.mark.parametrize("name", list(REPORTS))
async def test_client_reads_the_report_a_real_server_sent(base_url: str, fetch: Fetch, name: str) -> None:
    status, headers, body = await fetch(f"{base_url}/reply/{name}")

    assert (status, body) == (502, "upstream failed")
    assert FailureHeader.decode(headers) == EXPECTED[name]


async def test_header_over_aiohttps_limit_makes_the_reply_unreadable(base_url: str) -> None:
    """Why `MAX_BYTES` exists: the caller loses the real status and body, not just the report."""
    with pytest.raises(aiohttp.ClientResponseError) as caught:
        await _aiohttp(f"{base_url}/unbounded/{AIOHTTP_MAX_FIELD_SIZE + 1}")

    assert caught.value.status == 400
    assert f"Got more than {AIOHTTP_MAX_FIELD_SIZE} bytes" in caught.value.message


async def test_header_line_at_aiohttps_limit_still_reads(base_url: str) -> None:
    """The limit is pinned from both sides, so the bound's margin under it is known."""
    size = AIOHTTP_MAX_FIELD_SIZE - len(f"{FailureHeader.NAME}: ")

    status, headers, _ = await _aiohttp(f"{base_url}/unbounded/{size}")

    assert status == 502
    assert len(headers[FailureHeader.NAME]) == size
