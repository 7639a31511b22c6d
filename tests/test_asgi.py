"""Tests for the server middleware and the stream helpers, driven in process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import warnings
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.exceptions import StarletteDeprecationWarning
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from gym_failures.asgi import FailureReportMiddleware, relay_stream, sse_event, stream_failure_field
from gym_failures.failure_kinds import (
    AGENT_REQUEST_FAILED,
    INFRASTRUCTURE_ERROR,
    MODEL_SERVER_ERROR,
    PROVIDER_UNAVAILABLE,
)
from gym_failures.failure_records import FailureBoundary, FailureReport
from gym_failures.failure_transport import FailureHeader, RequestFailureLog, observe_failure
from gym_failures.failures import AgentFailure, ModelFailure, SandboxFailure
from gym_failures.redaction import REDACTED

with warnings.catch_warnings():
    # Starlette 1.x's TestClient prefers `httpx2` and warns when it runs on `httpx`, which is what this
    # project (and its users) have; the TestClient itself works the same.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

HEADER = FailureHeader.NAME.lower().encode()

# Not shaped like a credential: only the middleware's removal of the request's own values hides them.
AUTH_CANARY = "Zq9CanaryAuthValue"
QUERY_CANARY = "Qx7CanaryQueryValue"


def wrapped_reason(type_name: str) -> str:
    """The reason of a plain exception the middleware replied for: its type, never its text."""
    return f"{type_name} raised in the handler (its message is never sent: it may quote the request)"


class Boom(Exception):
    """A non-Gym exception raised by a handler."""


def model_failure(reason: str = "attempt failed") -> ModelFailure:
    return ModelFailure(failure_kind=MODEL_SERVER_ERROR, failure_reason=reason)


def starlette_app(*routes: Route | WebSocketRoute, **options: Any) -> Starlette:
    app = Starlette(routes=list(routes))
    app.add_middleware(FailureReportMiddleware, boundary="agent", **options)
    return app


@contextlib.asynccontextmanager
async def in_process(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


def http_scope(path: str = "/", *, headers: Sequence[tuple[bytes, bytes]] = (), query: bytes = b"") -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": list(headers),
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


class Recorder:
    """An ASGI `receive` (one empty request, then waits) and a `send` that records every message."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._requested = False
        self._never = asyncio.Event()

    async def receive(self) -> Message:
        if not self._requested:
            self._requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self._never.wait()
        raise AssertionError("unreachable")

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    def of_type(self, kind: str) -> list[Message]:
        return [message for message in self.messages if message["type"] == kind]


async def drive(app: ASGIApp, scope: Scope | None = None, recorder: Recorder | None = None) -> Recorder:
    recorder = recorder or Recorder()
    async with asyncio.timeout(60):  # a deadlock fails the test instead of hanging the suite
        await app(scope or http_scope(), recorder.receive, recorder.send)
    return recorder


def report_of(response: httpx.Response) -> FailureReport:
    report = FailureHeader.decode(response.headers)
    assert report is not None
    return report


# --- Installation and pass-through ------------------------------------------------------------


async def test_added_with_add_middleware_on_starlette() -> None:
    observed = model_failure()

    async def handler(request: Request) -> Response:
        observe_failure(observed)
        return PlainTextResponse("ok")

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    assert response.status_code == 200
    assert list(report_of(response).events) == [observed.event_id]


async def test_added_with_add_middleware_on_fastapi() -> None:
    app = FastAPI()
    app.add_middleware(FailureReportMiddleware, boundary="agent")
    observed = model_failure()
    raised = AgentFailure(failure_kind=AGENT_REQUEST_FAILED, failure_reason="agent gave up")

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        observe_failure(observed)
        return {"ok": True}

    @app.get("/fail")
    async def fail() -> dict[str, bool]:
        raise raised

    async with in_process(app) as client:
        succeeded = await client.get("/ok")
        failed = await client.get("/fail")

    assert succeeded.status_code == 200
    assert list(report_of(succeeded).events) == [observed.event_id]
    assert failed.status_code == 500
    assert report_of(failed).failure_id == raised.event_id


def test_lifespan_and_websocket_scopes_pass_through() -> None:
    """A Starlette app's lifespan and websocket routes work under the middleware, with no log opened."""
    lifespan_events: list[str] = []
    logs_seen: list[RequestFailureLog | None] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        lifespan_events.append("startup")
        logs_seen.append(RequestFailureLog.current())
        yield
        lifespan_events.append("shutdown")

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        logs_seen.append(RequestFailureLog.current())
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    app = Starlette(routes=[WebSocketRoute("/ws", echo)], lifespan=lifespan)
    app.add_middleware(FailureReportMiddleware, boundary="agent")

    with TestClient(app) as client:
        assert lifespan_events == ["startup"]
        with client.websocket_connect("/ws") as websocket:
            websocket.send_text("ping")
            assert websocket.receive_text() == "ping"

    assert lifespan_events == ["startup", "shutdown"]
    assert logs_seen == [None, None]


@pytest.mark.parametrize("scope_type", ["lifespan", "websocket"])
async def test_non_http_scopes_reach_the_app_with_the_same_receive_and_send(scope_type: str) -> None:
    seen: list[tuple[Scope, Receive, Send]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((scope, receive, send))

    middleware = FailureReportMiddleware(app, boundary="agent")
    scope: Scope = {"type": scope_type}
    recorder = Recorder()
    await middleware(scope, recorder.receive, recorder.send)

    assert len(seen) == 1
    assert seen[0][0] is scope
    assert seen[0][1] == recorder.receive
    assert seen[0][2] == recorder.send


# --- Success ------------------------------------------------------------------------------------


async def test_success_without_observations_has_no_report_header() -> None:
    async def handler(request: Request) -> Response:
        return PlainTextResponse("ok")

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    assert response.status_code == 200
    assert FailureHeader.NAME not in response.headers


async def test_observations_appear_in_the_header_of_a_200() -> None:
    first, second = model_failure("attempt 1"), model_failure("attempt 2")

    async def handler(request: Request) -> Response:
        observe_failure(first)
        observe_failure(second)
        return JSONResponse({"answer": 42})

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    assert response.status_code == 200
    assert response.json() == {"answer": 42}
    report = report_of(response)
    assert set(report.events) == {first.event_id, second.event_id}
    assert report.failure_id is None
    assert report.events[first.event_id].failure_reason == "attempt 1"


async def test_a_report_header_set_by_the_app_is_merged_with_the_log_keeping_its_failure() -> None:
    """An app may reply with its own failure without raising (a 429 it answers itself)."""
    observed = model_failure()
    own = ModelFailure(failure_kind=MODEL_SERVER_ERROR, failure_reason="quota")
    own_header = FailureHeader.encode(own.failure_report())[FailureHeader.NAME].encode()

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        observe_failure(observed)
        headers = [(b"content-type", b"text/plain"), (b"X-NG-Failure-Report", own_header)]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": b"slow down"})

    recorder = await drive(FailureReportMiddleware(inner, boundary="model"))

    (start,) = recorder.of_type("http.response.start")
    values = [value for name, value in start["headers"] if name.lower() == HEADER]
    assert len(values) == 1
    report = FailureHeader.decode({FailureHeader.NAME: values[0].decode()})
    assert report is not None
    assert report.failure_id == own.event_id
    assert set(report.events) == {own.event_id, observed.event_id}
    assert (b"content-type", b"text/plain") in start["headers"]


async def test_an_omitted_flag_set_by_the_app_is_kept() -> None:
    observed = model_failure()

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        observe_failure(observed)
        headers = [(b"X-NG-Failure-Report", b'{"omitted": true}')]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    recorder = await drive(FailureReportMiddleware(inner, boundary="agent"))

    (start,) = recorder.of_type("http.response.start")
    (value,) = [value for name, value in start["headers"] if name.lower() == HEADER]
    report = FailureHeader.decode({FailureHeader.NAME: value.decode()})
    assert report is not None
    assert list(report.events) == [observed.event_id]
    assert report.omitted


# --- A handler that raises ----------------------------------------------------------------------


async def test_gym_failure_replies_with_status_body_and_header_holding_its_causes() -> None:
    observed = model_failure("attempt 1")
    cause = SandboxFailure(failure_kind=PROVIDER_UNAVAILABLE, failure_reason="no capacity")
    raised = AgentFailure(failure_kind=AGENT_REQUEST_FAILED, failure_reason="episode failed")

    async def handler(request: Request) -> Response:
        observe_failure(observed)
        raise raised from cause

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "failure_kind": AGENT_REQUEST_FAILED,
        "failure_reason": "episode failed",
        "event_id": raised.event_id,
        "boundary": "agent",
    }
    report = report_of(response)
    assert report.failure_id == raised.event_id
    assert set(report.events) == {raised.event_id, cause.event_id, observed.event_id}
    assert report.events[raised.event_id].cause_id == cause.event_id


async def test_a_full_header_keeps_the_failure_chain_and_leaves_observations_out() -> None:
    """Past the header's bound the caller still gets the failure's origin id, marked omitted."""
    observed = [model_failure("x" * 300) for _ in range(20)]
    cause = SandboxFailure(failure_kind=PROVIDER_UNAVAILABLE, failure_reason="no capacity")
    raised = AgentFailure(failure_kind=AGENT_REQUEST_FAILED, failure_reason="episode failed")

    async def handler(request: Request) -> Response:
        for failure in observed:
            observe_failure(failure)
        raise raised from cause

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    assert len(response.headers[FailureHeader.NAME]) <= FailureHeader.MAX_BYTES
    report = report_of(response)
    assert (report.failure_id, report.omitted) == (raised.event_id, True)
    assert set(report.events) == {raised.event_id, cause.event_id}


async def test_a_failure_chain_too_large_for_the_header_is_sent_as_omitted() -> None:
    failure: AgentFailure | None = None
    for _ in range(20):
        new = AgentFailure(failure_kind=AGENT_REQUEST_FAILED, failure_reason="y" * 300)
        new.__cause__ = failure
        failure = new
    assert failure is not None
    raised = failure

    async def handler(request: Request) -> Response:
        raise raised

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    assert response.headers[FailureHeader.NAME] == '{"omitted": true}'
    assert response.json()["event_id"] == raised.event_id


async def test_failure_status_is_configurable() -> None:
    async def handler(request: Request) -> Response:
        raise model_failure()

    async with in_process(starlette_app(Route("/", handler), failure_status=503)) as client:
        response = await client.get("/")

    assert response.status_code == 503
    assert response.json()["failure_kind"] == MODEL_SERVER_ERROR


async def test_non_gym_exception_becomes_a_failure_of_the_boundary_with_the_default_kind() -> None:
    async def handler(request: Request) -> Response:
        raise Boom("disk full")

    app = starlette_app(Route("/", handler), default_failure_kind=AGENT_REQUEST_FAILED)
    async with in_process(app) as client:
        response = await client.get("/")

    assert response.status_code == 500
    body = response.json()
    assert body["failure_kind"] == AGENT_REQUEST_FAILED
    assert body["boundary"] == "agent"
    report = report_of(response)
    assert report.failure_id == body["event_id"]
    event = report.events[body["event_id"]]
    assert event.failure_kind == AGENT_REQUEST_FAILED
    assert event.exception_type == f"{__name__}.Boom"
    assert event.failure_reason == wrapped_reason(f"{__name__}.Boom")


async def test_non_gym_exception_defaults_to_infrastructure_error() -> None:
    async def handler(request: Request) -> Response:
        raise RuntimeError("oops")

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    event = report_of(response).events[response.json()["event_id"]]
    assert event.failure_kind == INFRASTRUCTURE_ERROR
    assert event.exception_type == "RuntimeError"


# Not shaped like a credential and not one of the request's own values: no redaction could find it.
PROSE_CANARY = "CANARY-7f3a9q-alice"


async def test_a_non_gym_exceptions_text_reaches_no_reply_header_body_or_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`str()` of a foreign exception is never read: text no redaction recognises (a body's value a
    validation error quotes) stays out of the reply and the log, with the request's own credentials."""

    async def handler(request: Request) -> Response:
        raise Boom(f"upstream refused {AUTH_CANARY} for page {QUERY_CANARY} of {PROSE_CANARY}")

    caplog.set_level(logging.DEBUG, logger="gym_failures")
    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get(
            "/", params={"page": QUERY_CANARY}, headers={"Authorization": f"Custom {AUTH_CANARY}"}
        )

    assert response.status_code == 500
    assert response.json()["failure_reason"] == wrapped_reason(f"{__name__}.Boom")
    for canary in (AUTH_CANARY, QUERY_CANARY, PROSE_CANARY):
        assert canary not in response.headers[FailureHeader.NAME]
        assert canary not in response.text
        assert canary not in caplog.text


async def test_a_non_gym_exceptions_str_is_never_called() -> None:
    """Not read, not even to redact it: a `__str__` that raises, or that is slow, changes nothing."""
    calls: list[str] = []

    class Loud(Exception):
        def __str__(self) -> str:
            calls.append("str")
            raise RuntimeError("__str__ was called")

    async def handler(request: Request) -> Response:
        raise Loud()

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    assert response.status_code == 500
    assert response.json()["failure_reason"] == wrapped_reason(Loud.__module__ + "." + Loud.__qualname__)
    assert calls == []


async def test_request_credentials_quoted_by_a_gym_failure_are_removed_from_the_reply() -> None:
    async def handler(request: Request) -> Response:
        raise model_failure(f"provider refused {AUTH_CANARY}")

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/", headers={"Authorization": f"Custom {AUTH_CANARY}"})

    assert response.json()["failure_reason"] == f"provider refused {REDACTED}"
    assert AUTH_CANARY not in response.headers[FailureHeader.NAME]


async def test_a_non_gym_exceptions_reason_is_its_type_whatever_its_texts_size() -> None:
    async def handler(request: Request) -> Response:
        raise Boom("x" * 100_000)

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    assert response.json()["failure_reason"] == wrapped_reason(f"{__name__}.Boom")


async def test_non_gym_exception_raised_from_a_gym_failure_keeps_it_as_cause() -> None:
    cause = model_failure("provider 503")

    async def handler(request: Request) -> Response:
        raise Boom("wrapper") from cause

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    report = report_of(response)
    event = report.events[response.json()["event_id"]]
    assert event.cause_id == cause.event_id
    assert report.events[cause.event_id].failure_reason == "provider 503"


async def test_exception_after_the_response_started_is_reraised_without_a_second_start() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise Boom("mid-stream")

    recorder = Recorder()
    with pytest.raises(Boom, match="mid-stream"):
        await drive(FailureReportMiddleware(app, boundary="agent"), recorder=recorder)

    assert [message["type"] for message in recorder.messages] == [
        "http.response.start",
        "http.response.body",
    ]


# --- The per-request log -----------------------------------------------------------------------


async def test_the_log_is_current_inside_and_reset_after_a_request() -> None:
    inside: list[RequestFailureLog | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        inside.append(RequestFailureLog.current())
        await PlainTextResponse("ok")(scope, receive, send)

    await drive(FailureReportMiddleware(app, boundary="agent"))

    assert isinstance(inside[0], RequestFailureLog)
    assert RequestFailureLog.current() is None


async def test_the_log_is_reset_after_a_handler_raises() -> None:
    inside: list[RequestFailureLog | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        inside.append(RequestFailureLog.current())
        raise Boom("failed")

    recorder = await drive(FailureReportMiddleware(app, boundary="agent"))

    assert isinstance(inside[0], RequestFailureLog)
    assert recorder.of_type("http.response.start")[0]["status"] == 500
    assert RequestFailureLog.current() is None


async def test_each_request_gets_a_new_log() -> None:
    logs: list[RequestFailureLog | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        logs.append(RequestFailureLog.current())
        observe_failure(model_failure())
        await PlainTextResponse("ok")(scope, receive, send)

    middleware = FailureReportMiddleware(app, boundary="agent")
    first = await drive(middleware)
    second = await drive(middleware)

    assert logs[0] is not logs[1]
    headers = [dict(r.of_type("http.response.start")[0]["headers"])[HEADER] for r in (first, second)]
    reports = [FailureHeader.decode({FailureHeader.NAME: value.decode()}) for value in headers]
    assert all(report is not None and len(report.events) == 1 for report in reports)


# --- Construction -------------------------------------------------------------------------------


async def noop_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("not called")


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"boundary": "agent", "failure_status": 200}, id="failure_status_200"),
        pytest.param({"boundary": "agent", "failure_status": 302}, id="failure_status_302"),
        pytest.param({"boundary": "agent", "failure_status": 600}, id="failure_status_600"),
        pytest.param({"boundary": "nowhere"}, id="unknown_boundary"),
        pytest.param({"boundary": "agent", "default_failure_kind": "not a name!"}, id="kind_not_a_name"),
        pytest.param({"boundary": "agent", "default_failure_kind": "empty_answer"}, id="gate_derived_kind"),
    ],
)
def test_invalid_constructor_arguments_raise_at_construction(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (each case has its own message)
        FailureReportMiddleware(noop_app, **options)


def test_a_boundary_is_accepted_as_enum_or_value() -> None:
    by_value = FailureReportMiddleware(noop_app, boundary="resources_server", failure_status=502)
    by_enum = FailureReportMiddleware(noop_app, boundary=FailureBoundary.RESOURCES_SERVER)
    assert by_value.boundary is by_enum.boundary is FailureBoundary.RESOURCES_SERVER


# --- Logging ------------------------------------------------------------------------------------


async def test_a_failed_request_is_logged_at_error_without_the_exceptions_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(request: Request) -> Response:
        raise Boom(f"upstream refused Authorization {AUTH_CANARY} at https://h/x?sig={QUERY_CANARY}")

    caplog.set_level(logging.DEBUG, logger="gym_failures")
    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/", headers={"Authorization": f"Custom {AUTH_CANARY}"})

    errors = [r for r in caplog.records if r.name == "gym_failures.asgi" and r.levelno == logging.ERROR]
    assert len(errors) == 1
    message = errors[0].getMessage()
    assert response.json()["event_id"] in message
    assert f"{__name__}.Boom raised in the handler" in message
    assert "upstream refused" not in message
    assert all(record.exc_info is None and record.exc_text is None for record in caplog.records)
    assert AUTH_CANARY not in caplog.text
    assert QUERY_CANARY not in caplog.text


# --- Streams ------------------------------------------------------------------------------------


CHUNKS = [b'event: delta\ndata: {"a":1}\n\n', b"x" * 70_000, b"", "é".encode(), b"tail"]


def streaming_app(chunks: Sequence[bytes]) -> Starlette:
    async def generate() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def handler(request: Request) -> Response:
        return StreamingResponse(generate(), media_type="text/event-stream")

    return Starlette(routes=[Route("/", handler)])


async def test_a_streaming_response_passes_through_byte_for_byte_and_chunk_for_chunk() -> None:
    bare = await drive(streaming_app(CHUNKS))
    wrapped = await drive(FailureReportMiddleware(streaming_app(CHUNKS), boundary="model"))

    bodies = [message["body"] for message in wrapped.of_type("http.response.body")]
    assert bodies == [message["body"] for message in bare.of_type("http.response.body")]
    assert bodies[: len(CHUNKS)] == CHUNKS
    assert b"".join(bodies) == b"".join(CHUNKS)


async def test_a_streaming_response_is_not_buffered() -> None:
    """The first chunk reaches the server before the generator produces the second."""
    first_sent = asyncio.Event()

    async def generate() -> AsyncIterator[bytes]:
        yield b"first"
        await first_sent.wait()  # a middleware that buffered would deadlock here (drive's timeout)
        yield b"second"

    async def handler(request: Request) -> Response:
        return StreamingResponse(generate(), media_type="text/event-stream")

    class Watching(Recorder):
        async def send(self, message: Message) -> None:
            await super().send(message)
            if message.get("body") == b"first":
                first_sent.set()

    app = starlette_app(Route("/", handler))
    recorder = await drive(app, recorder=Watching())

    assert [m["body"] for m in recorder.of_type("http.response.body")][:2] == [b"first", b"second"]


def sse_payloads(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[len(b"data: ") :]) for line in body.splitlines() if line.startswith(b"data: ")]


async def test_stream_failure_field_carries_the_observations_and_the_error() -> None:
    observed = model_failure("attempt 1")
    error = model_failure("stream broke")

    async def generate() -> AsyncIterator[bytes]:
        yield sse_event("response.output_text.delta", {"type": "response.output_text.delta"})
        observe_failure(observed)
        yield sse_event("response.failed", {"type": "response.failed", **stream_failure_field(error)})

    async def handler(request: Request) -> Response:
        return StreamingResponse(generate(), media_type="text/event-stream")

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    assert response.status_code == 200
    delta, terminal = sse_payloads(response.content)
    assert FailureHeader.decode_stream_event(delta) is None
    report = FailureHeader.decode_stream_event(terminal)
    assert report is not None
    assert report.failure_id == error.event_id
    assert set(report.events) == {observed.event_id, error.event_id}


def test_stream_failure_field_is_empty_when_there_is_nothing() -> None:
    with RequestFailureLog.capture():
        assert stream_failure_field() == {}
    assert stream_failure_field() == {}


def test_stream_failure_field_outside_a_request_carries_the_error_chain() -> None:
    cause = SandboxFailure(failure_kind=PROVIDER_UNAVAILABLE)
    error = model_failure()
    error.__cause__ = cause

    field = stream_failure_field(error)

    report = FailureHeader.decode_stream_event(field)
    assert report is not None
    assert report.failure_id == error.event_id
    assert set(report.events) == {error.event_id, cause.event_id}


async def upstream(chunks: Sequence[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def test_relay_stream_yields_chunks_unchanged_and_observes_the_terminal_report() -> None:
    remote = model_failure("remote stream failed")
    stream = sse_event("response.output_text.delta", {"type": "response.output_text.delta", "d": "hi"})
    stream += sse_event(
        "response.failed",
        {"type": "response.failed", **stream_failure_field(remote)},
    )
    chunks = split_every(stream, 7)  # the field name and the JSON are cut across chunks

    with RequestFailureLog.capture() as log:
        relayed = [chunk async for chunk in relay_stream(upstream(chunks))]

    assert relayed == chunks
    assert list(log.report.events) == [remote.event_id]
    assert log.report.failure_id is None


async def test_relay_stream_observes_nothing_from_a_stream_without_a_report() -> None:
    chunks = [sse_event("response.completed", {"type": "response.completed"})]

    with RequestFailureLog.capture() as log:
        relayed = [chunk async for chunk in relay_stream(upstream(chunks))]

    assert relayed == chunks
    assert not log.report.events


async def test_relay_stream_closes_the_upstream_when_the_consumer_stops() -> None:
    closed: list[bool] = []

    async def source() -> AsyncIterator[bytes]:
        try:
            yield b"event: delta\n"
            yield b"data: {}\n\n"
        finally:
            closed.append(True)

    relay = relay_stream(source())
    assert await anext(relay) == b"event: delta\n"
    await relay.aclose()  # type: ignore[attr-defined] # an async generator

    assert closed == [True]


# --- Regressions found in review ------------------------------------------------------------------


async def test_scrubbing_a_short_secret_keeps_the_reason_within_its_bound() -> None:
    """The marker is longer than a 6-character secret; the caller must still read the report."""
    raised = model_failure("x" * 1991 + " abc123")

    async def handler(request: Request) -> Response:
        raise raised

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/?q=abc123")

    report = report_of(response)
    assert report.failure_id == raised.event_id
    reason = report.events[raised.event_id].failure_reason
    assert len(reason) <= 2000
    assert "abc123" not in reason


async def test_a_failure_the_app_returns_keeps_its_id_when_the_log_is_large() -> None:
    own = ModelFailure(failure_kind=MODEL_SERVER_ERROR, failure_reason="quota")
    own_header = FailureHeader.encode(own.failure_report())[FailureHeader.NAME].encode()

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        for _ in range(20):
            observe_failure(model_failure("y" * 300))
        await send({"type": "http.response.start", "status": 429, "headers": [(HEADER, own_header)]})
        await send({"type": "http.response.body", "body": b""})

    recorder = await drive(FailureReportMiddleware(inner, boundary="model"))
    (start,) = recorder.of_type("http.response.start")
    (value,) = [value for name, value in start["headers"] if name == HEADER]
    report = FailureHeader.decode({FailureHeader.NAME: value.decode()})
    assert report is not None
    assert (report.failure_id, report.omitted, list(report.events)) == (own.event_id, True, [own.event_id])


async def test_a_failure_header_the_app_sets_is_scrubbed_of_the_requests_credentials() -> None:
    own = ModelFailure(failure_kind=MODEL_SERVER_ERROR, failure_reason=f"rejected key {AUTH_CANARY}")
    own_header = FailureHeader.encode(own.failure_report())[FailureHeader.NAME].encode()

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 401, "headers": [(HEADER, own_header)]})
        await send({"type": "http.response.body", "body": b""})

    scope = http_scope(headers=[(b"authorization", f"Bearer {AUTH_CANARY}".encode())])
    recorder = await drive(FailureReportMiddleware(inner, boundary="model"), scope)
    (start,) = recorder.of_type("http.response.start")
    (value,) = [value for name, value in start["headers"] if name == HEADER]
    assert AUTH_CANARY.encode() not in value
    report = FailureHeader.decode({FailureHeader.NAME: value.decode()})
    assert report is not None
    assert report.failure_id == own.event_id


async def test_a_stream_field_past_the_bound_keeps_the_failure_chain() -> None:
    raised = model_failure("the stream failed")
    captured: dict[str, Any] = {}

    async def handler(request: Request) -> Response:
        for _ in range(20):
            observe_failure(model_failure("z" * 300))
        captured.update(stream_failure_field(raised))
        return PlainTextResponse("ok")

    async with in_process(starlette_app(Route("/", handler))) as client:
        await client.get("/")

    report = FailureHeader.decode_stream_event(captured)
    assert report is not None
    assert (report.failure_id, report.omitted) == (raised.event_id, True)


async def test_a_gym_failure_raised_in_a_task_group_keeps_its_kind() -> None:
    """A model-side failure must not become this server's `infrastructure_error`."""
    raised = ModelFailure(failure_kind="model_context_limit", failure_reason="too long")

    async def fail() -> None:
        raise raised

    async def handler(request: Request) -> Response:
        async with asyncio.TaskGroup() as group:
            group.create_task(fail())
        return PlainTextResponse("unreachable")

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    assert response.json()["failure_kind"] == "model_context_limit"
    assert report_of(response).failure_id == raised.event_id


async def test_several_gym_failures_in_a_group_are_the_cause_and_observations() -> None:
    first = model_failure("first")
    second = model_failure("second")

    async def handler(request: Request) -> Response:
        raise ExceptionGroup("two failed", [first, second])

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    report = report_of(response)
    assert report.failure_id is not None
    root = report.events[report.failure_id]
    assert root.failure_kind == INFRASTRUCTURE_ERROR
    assert root.cause_id == first.event_id
    assert second.event_id in report.events


async def test_a_raw_query_value_quoted_by_a_failure_is_removed() -> None:
    raised = model_failure("cannot route /v1/run?sig=Zm9vQ%2Bbar%2Fbaz123")

    async def handler(request: Request) -> Response:
        raise raised

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/?sig=Zm9vQ%2Bbar%2Fbaz123")

    header = response.headers[FailureHeader.NAME]
    assert "Zm9vQ" not in header
    assert "Zm9vQ" not in response.text


async def test_relay_stream_observes_the_report_as_soon_as_it_is_read() -> None:
    """A consumer that stops after the terminal event may close the relay much later."""
    failure = model_failure("stream failed")
    terminal = sse_event(
        "response.failed",
        {
            "type": "response.failed",
            FailureHeader.STREAM_FIELD: FailureHeader.stream_value(failure.failure_report()),
        },
    )

    async def upstream() -> AsyncIterator[bytes]:
        yield sse_event("response.created", {"type": "response.created"})
        yield terminal
        yield b": keep-alive\n\n"

    with RequestFailureLog.capture() as log:
        relay = relay_stream(upstream())
        async for chunk in relay:
            if chunk == terminal:
                break
        assert failure.event_id in log.report.events
        await relay.aclose()  # type: ignore[attr-defined]


async def test_a_gym_failure_under_a_group_leaf_is_kept_as_cause() -> None:
    model = ModelFailure(failure_kind="model_context_limit", failure_reason="too long")

    async def fail() -> None:
        try:
            raise model
        except ModelFailure as error:
            raise RuntimeError("the tool loop gave up") from error

    async def handler(request: Request) -> Response:
        async with asyncio.TaskGroup() as group:
            group.create_task(fail())
        return PlainTextResponse("unreachable")

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/")

    report = report_of(response)
    assert report.failure_id is not None
    assert report.events[report.failure_id].cause_id == model.event_id


async def test_the_requests_credentials_are_removed_from_operation_and_provider_status() -> None:
    token = "Zq81mPp0vLx3"

    async def handler(request: Request) -> Response:
        raise SandboxFailure(
            failure_kind=PROVIDER_UNAVAILABLE,
            operation=f"chat/{token}/completions",
            details={"provider_status_reason": f"tenant {token} over quota"},
        )

    async with in_process(starlette_app(Route("/", handler))) as client:
        response = await client.get("/", headers={"x-api-key": token})

    assert token not in response.headers[FailureHeader.NAME]
    assert report_of(response).failure_id is not None


async def test_headers_given_as_any_iterable_pass_through() -> None:
    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        headers = ((name, value) for name, value in [(b"content-type", b"text/plain")])
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    recorder = await drive(FailureReportMiddleware(inner, boundary="agent"))
    (start,) = recorder.of_type("http.response.start")
    assert list(start["headers"]) == [(b"content-type", b"text/plain")]


async def test_relay_stream_observes_a_report_once() -> None:
    failure = model_failure("stream failed")
    field = FailureHeader.stream_value(failure.failure_report())
    terminal = sse_event("response.failed", {"type": "response.failed", FailureHeader.STREAM_FIELD: field})

    async def upstream() -> AsyncIterator[bytes]:
        yield terminal

    with RequestFailureLog.capture() as log:
        for _ in range(RequestFailureLog.MAX_EVENTS):
            log.add(model_failure().failure_report().model_copy(update={"failure_id": None}))
        async for _ in relay_stream(upstream()):
            pass
    assert log.dropped_events == 1
