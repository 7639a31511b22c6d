"""The proxy's verdict grades the caller by what happened on the wire, as the model endpoint's does:
a careful caller of a flaky resources server is recovered, a careless one earns its findings, and
the caller's chain names the proxy's hop with the event id the proxy announced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gym_failures.calls import call_headers, logical_call
from gym_failures.client import raise_boundary_failure, retry_model_call
from gym_failures.failures import NgFailureEvent
from gym_failures.proxy import INJECTED_TYPE
from gym_failures.proxy.pytest_plugin import ProxyHandle
from tests.proxy.threaded import serve_in_thread

SEEN: list[str] = []


async def _verify(request: Request) -> JSONResponse:
    body = await request.json()
    SEEN.append(str(body.get("answer")))
    return JSONResponse({"reward": 1.0 if body.get("answer") == "42" else 0.0})


async def _events(request: Request) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        for word in ("the", "answer", "is"):
            yield f'data: {{"text": "{word}"}}\n\n'.encode()
        yield b'data: {"text": "42", "done": true}\n\n'

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    app = Starlette(routes=[Route("/verify", _verify, methods=["POST"]), Route("/answer", _events)])
    with serve_in_thread(app) as url:
        yield url


@pytest.fixture
def verifier(proxy: Callable[..., ProxyHandle], upstream: str) -> ProxyHandle:
    SEEN.clear()
    return proxy(upstream)


async def _careful_verify(url: str) -> float:
    """A careful caller: one logical call, the client helpers' retries, Retry-After honoured."""

    async def attempt(attempt_id: str) -> float:
        async with httpx.AsyncClient() as client:
            reply = await client.post(f"{url}/verify", json={"answer": "42"}, headers=call_headers())
            await raise_boundary_failure(reply, boundary="resources_server")
            return float(reply.json()["reward"])

    return await retry_model_call(attempt, boundary="resources_server", max_attempts=3, backoff_s=0.01)


def test_a_careful_caller_that_waits_the_hint_is_recovered(verifier: ProxyHandle) -> None:
    verifier.force("status", code=503, retry_after=0.2)
    started = time.monotonic()
    assert asyncio.run(_careful_verify(verifier.url)) == 1.0
    assert time.monotonic() - started >= 0.2  # the hint was waited
    verdict = verifier.assert_recovered()
    assert verdict.passed
    attempts = verifier.journal()
    assert [a.status for a in attempts] == [503, 200]
    assert attempts[0].call_id is not None
    assert attempts[0].call_id == attempts[1].call_id
    assert SEEN == ["42"]  # the injected 503 never reached the upstream


def test_a_caller_that_gives_up_on_a_retryable_503_fails_the_verdict(verifier: ProxyHandle) -> None:
    verifier.force("status", code=503, retry_after=0.1)
    with httpx.Client() as client:
        reply = client.post(f"{verifier.url}/verify", json={"answer": "42"})
    assert reply.status_code == 503
    verdict = verifier.verdict(client=None)
    assert not verdict.passed
    assert [f.finding for f in verdict.findings if f.severity == "failure"] == ["gave_up"]


def test_a_caller_that_ignores_retry_after_fails_the_verdict(verifier: ProxyHandle) -> None:
    verifier.force("status", code=503, retry_after=5)
    with httpx.Client() as client, logical_call():
        for _ in range(2):
            reply = client.post(f"{verifier.url}/verify", json={"answer": "42"}, headers=call_headers())
    assert reply.status_code == 200
    verdict = verifier.verdict(client=None)
    assert "retry_after_ignored" in {f.finding for f in verdict.findings if f.severity == "failure"}


def _answer(url: str) -> str:
    with httpx.Client() as client, client.stream("GET", f"{url}/answer") as reply:
        return "".join(
            line.removeprefix("data: ").split('"text": "')[1].split('"')[0]
            for line in reply.iter_lines()
            if line.startswith("data: ")
        )


def test_a_caller_that_answers_with_a_cut_stream_fails_whatever_it_saw(verifier: ProxyHandle) -> None:
    verifier.force("cut_stream")
    assert _answer(verifier.url) == "theansweris"  # the careless caller took the half it got
    event_id = verifier.journal()[0].event_id
    assert event_id is not None
    for evidence in (None, [event_id]):  # more evidence (it SAW the cut) never turns it into a pass
        verdict = verifier.verdict(client=evidence)
        assert "cut_stream_accepted" in {f.finding for f in verdict.findings}
        assert not verdict.passed


def test_a_caller_that_retries_a_cut_stream_in_its_call_is_recovered(verifier: ProxyHandle) -> None:
    verifier.force("cut_stream")
    with logical_call(), httpx.Client() as client:
        for _ in range(3):
            with client.stream("GET", f"{verifier.url}/answer", headers=call_headers()) as reply:
                lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
            if lines and '"done": true' in lines[-1]:
                break
            time.sleep(0.06)  # a backoff, as a careful caller waits before it asks again
    assert '"42"' in lines[-1]
    assert verifier.assert_recovered(client=None).passed
    assert [a.outcome for a in verifier.journal()] == ["cut", "ok"]


def test_an_injected_failure_reaches_the_caller_as_the_proxys_with_its_event_id(
    verifier: ProxyHandle,
) -> None:
    verifier.force("status", code=429, retry_after=1)

    async def call() -> NgFailureEvent:
        async with httpx.AsyncClient() as client:
            reply = await client.post(f"{verifier.url}/verify", json={"answer": "42"})
            try:
                await raise_boundary_failure(reply, boundary="resources_server")
            except NgFailureEvent as failure:
                return failure
        raise AssertionError("the 429 was not raised")

    failure = asyncio.run(call())
    event = failure.to_event()
    announced = verifier.journal()[0].event_id
    assert event.event_id == announced
    assert event.boundary.value == "resources_server"
    assert event.failure_kind == "provider_quota_exhausted"
    assert event.failure_reason.startswith("[proxy] injected 429")
    assert event.exception_type == INJECTED_TYPE
    details = failure.http_details
    assert details is not None
    assert (details.status, details.retry_after_s) == (429, 1)
