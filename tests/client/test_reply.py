"""Tests for reading a reply (`raise_boundary_failure`, `raise_for_status`) from a real server, with
a real client of each supported library (aiohttp, httpx, httpx2)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from email.utils import formatdate
from typing import Any

import aiohttp
import httpx
import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from gym_failures.client import DEFAULT_KIND_BY_BOUNDARY, raise_boundary_failure, raise_for_status
from gym_failures.client._reply import retry_after_s
from gym_failures.failure_kinds import FAILURE_KINDS, MODEL_SERVER_ERROR, PROVIDER_UNAVAILABLE
from gym_failures.failure_records import FailureBoundary
from gym_failures.failure_transport import RequestFailureLog
from gym_failures.failures import MAX_RETRY_AFTER_S, ModelFailure, NgFailureEvent, SandboxFailure
from tests.client.servers import (
    BODY_SECRET,
    CAUSE_ID,
    FAILURE_ID,
    HTTPX_SHAPED,
    LONG_BODY,
    OBSERVED_ID,
    QUERY_SECRET,
    ClientName,
    get,
    serving,
)

# What `raise_for_status` promises to raise, by client: the library's own HTTP status error.
STATUS_ERRORS: dict[ClientName, type[Exception]] = {
    "aiohttp": aiohttp.ClientResponseError,
    "httpx": httpx.HTTPStatusError,
    "httpx2": httpx2.HTTPStatusError,
}


async def failure_of(
    client: ClientName, url: str, *, params: dict[str, str] | None = None, **kwargs: Any
) -> NgFailureEvent:
    async with get(client, url, params=params) as response:
        with pytest.raises(NgFailureEvent) as raised:
            await raise_boundary_failure(response, **kwargs)
    return raised.value


# --- raise_boundary_failure -------------------------------------------------------------------


async def test_raise_boundary_failure_returns_on_2xx_and_observes_the_report(
    client: ClientName, base_url: str
) -> None:
    with RequestFailureLog.capture() as log:
        async with get(client, f"{base_url}/ok") as response:
            await raise_boundary_failure(response, boundary="model")

    assert list(log.report.events) == [OBSERVED_ID]
    assert log.report.failure_id is None


async def test_raise_boundary_failure_outside_a_request_returns_on_2xx(
    client: ClientName, base_url: str
) -> None:
    async with get(client, f"{base_url}/ok") as response:
        await raise_boundary_failure(response, boundary="model")
    assert RequestFailureLog.current() is None


async def test_a_failed_reply_with_a_report_raises_the_rebuilt_remote_failure(
    client: ClientName, base_url: str
) -> None:
    with RequestFailureLog.capture() as log:
        failure = await failure_of(client, f"{base_url}/fail", boundary="agent")

    assert type(failure) is ModelFailure
    assert failure.event_id == FAILURE_ID
    assert failure.failure_kind == MODEL_SERVER_ERROR
    assert failure.boundary is FailureBoundary.MODEL
    assert failure.stage == "agent"
    assert failure.cause_id == CAUSE_ID
    report = failure.failure_report()
    assert report.failure_id == FAILURE_ID
    assert set(report.events) == {FAILURE_ID, CAUSE_ID}
    assert report.events[CAUSE_ID].failure_kind == PROVIDER_UNAVAILABLE
    assert set(log.report.events) == {FAILURE_ID, CAUSE_ID}  # the reply's report is observed too


async def test_a_failed_reply_keeps_its_http_details_apart(client: ClientName, base_url: str) -> None:
    user_url = base_url.replace("http://", "http://alice:Pw9UserInfoSecret@")
    failure = await failure_of(client, f"{user_url}/plain/502?token={QUERY_SECRET}&page=2")

    details = failure.http_details
    assert details is not None
    assert details.method == "GET"
    assert details.url == f"{base_url}/plain/502"
    assert details.status == 502
    assert details.delivery == "answered"
    assert 0 < len(details.body_excerpt) <= 512
    assert details.body_excerpt.startswith("upstream failed: Authorization:")
    assert BODY_SECRET not in details.body_excerpt
    assert QUERY_SECRET not in repr(failure.to_event())
    assert "Pw9UserInfoSecret" not in repr(failure.to_event())


async def test_a_failed_reply_without_a_report_raises_the_boundary_default_kind(
    client: ClientName, base_url: str
) -> None:
    failure = await failure_of(client, f"{base_url}/plain/503?api_key={QUERY_SECRET}", boundary="sandbox")

    assert type(failure) is SandboxFailure
    assert failure.boundary is FailureBoundary.SANDBOX
    assert failure.failure_kind == DEFAULT_KIND_BY_BOUNDARY[FailureBoundary.SANDBOX]
    assert failure.http_status == 503
    assert failure.cause_id is None
    assert f"{base_url}/plain/503" in failure.failure_reason
    assert QUERY_SECRET not in failure.failure_reason


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
async def test_the_status_of_a_reply_without_a_report_is_never_turned_into_a_kind(
    base_url: str, status: int
) -> None:
    failure = await failure_of("httpx", f"{base_url}/plain/{status}", boundary="model")

    assert failure.failure_kind == DEFAULT_KIND_BY_BOUNDARY[FailureBoundary.MODEL]
    assert failure.http_status == status


async def test_a_failed_reply_without_a_report_takes_the_given_kind(
    client: ClientName, base_url: str
) -> None:
    failure = await failure_of(
        client, f"{base_url}/plain/500", boundary="model", failure_kind=MODEL_SERVER_ERROR, attempt_id="op.2"
    )

    assert type(failure) is ModelFailure
    assert failure.failure_kind == MODEL_SERVER_ERROR
    assert failure.http_status == 500
    assert failure.attempt_id == "op.2"


@pytest.mark.parametrize("boundary", list(FailureBoundary))
def test_every_boundary_has_a_registered_default_kind(boundary: FailureBoundary) -> None:
    assert DEFAULT_KIND_BY_BOUNDARY[boundary] in FAILURE_KINDS


async def test_raise_boundary_failure_refuses_what_is_not_a_response() -> None:
    with pytest.raises(TypeError, match="not an aiohttp, httpx or httpx2 response"):
        await raise_boundary_failure(object())  # type: ignore[arg-type]


# --- Retry-After --------------------------------------------------------------------------------


async def test_retry_after_in_seconds_is_parsed(client: ClientName, base_url: str) -> None:
    failure = await failure_of(client, f"{base_url}/plain/429?retry_after=7")

    assert failure.http_details is not None
    assert failure.http_details.retry_after_s == 7.0


async def test_retry_after_as_an_http_date_is_parsed(client: ClientName, base_url: str) -> None:
    sent = time.time()
    when = formatdate(sent + 120, usegmt=True)  # whole seconds: up to 1 s earlier
    failure = await failure_of(client, f"{base_url}/plain/503", params={"retry_after": when})
    done = time.time()

    assert failure.http_details is not None
    assert failure.http_details.retry_after_s is not None
    # The date less the wall clock when the reply was read, between `sent` and `done` (the test's own
    # clock readings bound it, however long the request took).
    assert sent + 119 - done - 0.01 <= failure.http_details.retry_after_s <= 120


async def test_an_unreadable_retry_after_is_ignored(client: ClientName, base_url: str) -> None:
    failure = await failure_of(client, f"{base_url}/plain/503?retry_after=soon")

    assert failure.http_details is not None
    assert failure.http_details.retry_after_s is None


# --- raise_for_status ---------------------------------------------------------------------------


async def test_raise_for_status_raises_aiohttp_client_response_error(base_url: str) -> None:
    async with get("aiohttp", f"{base_url}/fail?token={QUERY_SECRET}") as response:
        with pytest.raises(aiohttp.ClientResponseError) as raised:
            await raise_for_status(response)

    error: Any = raised.value
    assert error.status == 500
    assert isinstance(error.failure, ModelFailure)
    assert error.failure.event_id == FAILURE_ID
    assert error.__cause__ is error.failure
    assert json.loads(error.content)["event_id"] == FAILURE_ID
    assert QUERY_SECRET not in str(error)
    assert "?" not in str(error)


async def test_raise_for_status_raises_httpx_http_status_error(base_url: str) -> None:
    async with get("httpx", f"{base_url}/fail?token={QUERY_SECRET}") as response:
        with pytest.raises(httpx.HTTPStatusError) as raised:
            await raise_for_status(response)

    error: Any = raised.value
    assert error.response.status_code == 500
    assert isinstance(error.failure, ModelFailure)
    assert error.failure.event_id == FAILURE_ID
    assert error.__cause__ is error.failure
    assert error.content == response.content
    assert QUERY_SECRET not in str(error)
    assert "?" not in str(error)


async def test_raise_for_status_carries_a_failure_built_for_a_reply_without_a_report(
    client: ClientName, base_url: str
) -> None:
    async with get(client, f"{base_url}/plain/404") as response:
        with pytest.raises(STATUS_ERRORS[client]) as raised:
            await raise_for_status(response, boundary="resources_server")

    error: Any = raised.value
    assert error.failure.boundary is FailureBoundary.RESOURCES_SERVER
    assert error.failure.http_status == 404
    assert error.content == LONG_BODY.encode()


async def test_raise_for_status_returns_on_2xx_and_observes_the_report(
    client: ClientName, base_url: str
) -> None:
    with RequestFailureLog.capture() as log:
        async with get(client, f"{base_url}/ok") as response:
            await raise_for_status(response)

    assert list(log.report.events) == [OBSERVED_ID]


# --- Regressions found in review ------------------------------------------------------------------


async def _endless(request: Request) -> Response:
    async def body() -> AsyncIterator[bytes]:
        while True:
            yield b"x" * 65536
            await asyncio.sleep(0)

    return StreamingResponse(body(), status_code=500)


async def test_an_endless_failed_body_is_read_only_up_to_the_bound(client: ClientName) -> None:
    app = Starlette(routes=[Route("/", _endless)])
    with serving(app) as url:
        if client == "aiohttp":
            async with aiohttp.ClientSession() as session, session.get(url) as reply:
                with pytest.raises(NgFailureEvent):
                    await raise_boundary_failure(reply, boundary="model")
                with pytest.raises(aiohttp.ClientResponseError) as from_aiohttp:
                    await raise_for_status(reply, boundary="model")
            content = from_aiohttp.value.content  # type: ignore[attr-defined]
        else:
            module = HTTPX_SHAPED[client]
            async with module.AsyncClient() as http, http.stream("GET", url) as response:
                with pytest.raises(module.HTTPStatusError) as from_httpx:
                    await raise_for_status(response, boundary="model")
            content = from_httpx.value.content
    assert 0 < len(content) <= 64 * 1024


def test_a_retry_after_of_non_ascii_digits_is_no_evidence() -> None:
    assert retry_after_s({"Retry-After": "²"}) is None
    assert retry_after_s({"Retry-After": "7"}) == 7.0


async def _small_failure(request: Request) -> Response:
    async def body() -> AsyncIterator[bytes]:
        yield b'{"error": '
        yield b'"quota exceeded"}'

    return StreamingResponse(body(), status_code=429)


async def test_a_small_failed_body_stays_readable_after_raise_for_status(client: ClientName) -> None:
    """The usual `except` block reads the body again; a body within the bound must still be there."""
    app = Starlette(routes=[Route("/", _small_failure), Route("/fixed", plain_429)])
    with serving(app) as url:
        for path in ("/", "/fixed"):
            if client == "aiohttp":
                async with aiohttp.ClientSession() as session, session.get(url + path) as reply:
                    with pytest.raises(aiohttp.ClientResponseError):
                        await raise_for_status(reply, boundary="model")
                    assert await reply.read() == b'{"error": "quota exceeded"}'
            else:
                module = HTTPX_SHAPED[client]
                async with module.AsyncClient() as http, http.stream("GET", url + path) as response:
                    with pytest.raises(module.HTTPStatusError):
                        await raise_for_status(response, boundary="model")
                    assert await response.aread() == b'{"error": "quota exceeded"}'


async def plain_429(request: Request) -> Response:
    return PlainTextResponse('{"error": "quota exceeded"}', status_code=429)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("9" * 400, MAX_RETRY_AFTER_S),
        ("604801", MAX_RETRY_AFTER_S),
        ("604800", MAX_RETRY_AFTER_S),
        ("0" * 20 + "5", 5.0),
        ("Fri, 31 Dec 99999999999999999999 23:59:59 GMT", None),
        ("Mon, 01 Jan 9999 00:00:00 GMT", MAX_RETRY_AFTER_S),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
        ("-5", None),
    ],
)
def test_a_hostile_retry_after_is_bounded_not_raised(value: str, expected: float | None) -> None:
    assert retry_after_s({"Retry-After": value}) == expected


@given(value=st.text(st.characters(exclude_categories=())))
def test_retry_after_never_raises(value: str) -> None:
    wait = retry_after_s({"Retry-After": value})
    assert wait is None or 0.0 <= wait <= MAX_RETRY_AFTER_S
