"""A record made inside a request never carries the request's credentials out
(`gym_failures._request_context`): not in a body the app serializes itself, a header, a row or a log."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_failures._request_context import CURRENT_REQUEST_LOG, current_request_secrets, scrub_in_request
from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failure_kinds import AGENT_RUN_ERROR, PROVIDER_COMMAND_TIMEOUT
from gym_failures.failure_records import (
    BaseEpisodeResponse,
    EpisodeFailure,
    FailureBoundary,
    FailureEvent,
    FailureReport,
    SandboxFailureDetails,
    SdkErrorDetails,
)
from gym_failures.failure_transport import FailureHeader, FailureReportRow, RequestFailureLog
from gym_failures.failures import AgentFailure
from gym_failures.redaction import REDACTED, forget_registered_secrets, register_secret
from gym_failures.rollout_failure import EpisodeId, RolloutFailure

SECRET = "Zq9RecordCanary4417"
BEARER = "sk-RECORD-bearer-77a1"
API_KEY = "apiKeyRecordCanary3390"
COOKIE = "cookieRecordCanary5521"
USERINFO_PASSWORD = "userinfoPassCanary8813"
QUERY = "QUERYRECORDCANARY61"
CANARIES = (BEARER, API_KEY, COOKIE, USERINFO_PASSWORD, QUERY)


@pytest.fixture
def in_request() -> Iterator[RequestFailureLog]:
    """A request carrying `SECRET` as its bearer token is being served."""
    log = RequestFailureLog()
    log.request_scope = {"type": "http", "headers": [(b"authorization", f"Bearer {SECRET}".encode())]}
    token = CURRENT_REQUEST_LOG.set(log)
    try:
        yield log
    finally:
        CURRENT_REQUEST_LOG.reset(token)


def _event(reason: str = "", operation: str | None = None) -> FailureEvent:
    return FailureEvent(
        event_id="e1", boundary=FailureBoundary.AGENT, failure_kind=AGENT_RUN_ERROR, failure_reason=reason,
        operation=operation,
    )  # fmt: skip


RECORDS: dict[str, tuple[Callable[[str], Any], Callable[[Any], str]]] = {
    "EpisodeFailure.failure_reason": (
        lambda text: EpisodeFailure(failure_reason=text, terminal=True),
        lambda record: record.failure_reason,
    ),
    # An event is decoded from every header a server reads: it is scrubbed when it leaves (serialized),
    # not when it is made (see `gym_failures._request_context`); a failure made here is (below).
    "FailureEvent.failure_reason": (_event, lambda record: record.model_dump_json()),
    "FailureEvent.operation": (
        lambda text: _event(operation=text[:200]),
        lambda record: json.dumps(record.model_dump(mode="json")),
    ),
    "SdkErrorDetails.message": (
        lambda text: SdkErrorDetails(exception_type="SdkError", message=text),
        lambda record: record.message,
    ),
    "SandboxFailureDetails.provider_status_reason": (
        lambda text: SandboxFailureDetails(provider_status_reason=text),
        lambda record: record.provider_status_reason,
    ),
    "RolloutFailure.failure": (
        lambda text: RolloutFailure.model_validate(
            {
                "episode_id": EpisodeId.of("0:0", 1),
                "run_id": "r",
                "source": "environment",
                "delivery": "delivered",
                "failure": {"failure_reason": text, "terminal": False},
            }
        ),
        lambda record: record.failure.failure_reason,
    ),
    "NgFailureEvent": (
        lambda text: AgentFailure(failure_kind=AGENT_RUN_ERROR, failure_reason=text),
        lambda record: f"{record} {record!r} {record.failure_report().model_dump_json()}",
    ),
}


@pytest.mark.parametrize("name", RECORDS)
def test_a_record_made_in_a_request_loses_the_requests_credential(
    in_request: RequestFailureLog, name: str
) -> None:
    make, text_of = RECORDS[name]
    record = make(f"the token {SECRET} was refused")
    text = text_of(record)
    assert SECRET not in text
    assert REDACTED in text
    if hasattr(record, "model_dump_json"):
        assert SECRET not in record.model_dump_json()


@pytest.mark.parametrize("name", [name for name in RECORDS if name != "NgFailureEvent"])
def test_a_record_made_outside_a_request_keeps_its_text(name: str) -> None:
    """Outside a server request (a reader of saved rows), a record is data and stays as it was (a
    failure a producer raises is redacted of credential shapes wherever it is made)."""
    make, text_of = RECORDS[name]
    assert f"the token {SECRET} was refused" in text_of(make(f"the token {SECRET} was refused"))


def test_a_record_made_without_validation_is_scrubbed_when_serialized(in_request: RequestFailureLog) -> None:
    """`model_construct` and `model_copy(update=...)` skip the validators; serializing still scrubs."""
    envelope = EpisodeFailure.model_construct(failure_reason=f"saw {SECRET}", terminal=True)
    event = _event("ok").model_copy(update={"failure_reason": f"saw {SECRET}", "operation": f"op {SECRET}"})
    foreign = SdkErrorDetails.model_construct(exception_type="E", message=f"saw {SECRET}")
    details = SandboxFailureDetails.model_construct(provider_status_reason=f"saw {SECRET}")
    sandbox = FailureEvent.model_construct(
        event_id="s1", boundary=FailureBoundary.SANDBOX, failure_kind=PROVIDER_COMMAND_TIMEOUT,
        failure_reason="", details=details, foreign_error=foreign,
    )  # fmt: skip
    report = FailureReport.model_construct(
        events={"e1": event, "s1": sandbox}, failure_id="e1", omitted=False
    )
    body = BaseEpisodeResponse.model_construct(failure=envelope, failure_report=report, result=None)
    for serialized in (
        body.model_dump_json(),
        json.dumps(body.model_dump(mode="json")),
        str(body.model_dump()),
        FailureHeader.encode(report)[FailureHeader.NAME],
        json.dumps(FailureHeader.stream_value(report)),
        json.dumps(FailureReportRow.fields(report)),
    ):
        assert SECRET not in serialized
        assert REDACTED in serialized


def test_a_reason_at_its_bound_stays_within_it_when_the_marker_is_longer() -> None:
    short = "k9Secret"  # shorter than the marker that replaces it
    log = RequestFailureLog()
    log.request_scope = {"type": "http", "headers": [(b"x-api-key", short.encode())]}
    token = CURRENT_REQUEST_LOG.set(log)
    try:
        failure = EpisodeFailure(failure_reason=(f"{short} " * 300)[:2000], terminal=True)
    finally:
        CURRENT_REQUEST_LOG.reset(token)
    assert len(failure.failure_reason) == 2000
    assert failure.failure_reason.endswith("…")
    assert short not in failure.failure_reason


def test_prose_in_a_record_made_in_a_request_is_kept(in_request: RequestFailureLog) -> None:
    """Only the request's own values (and credential shapes beside them) go: ordinary words stay."""
    prose = "no valid API key: send it as a Bearer token or in x-api-key"
    assert EpisodeFailure(failure_reason=prose, terminal=False).failure_reason == prose
    quoted = f"{prose} (got {SECRET})"
    assert EpisodeFailure(failure_reason=quoted, terminal=False).failure_reason == f"{prose} (got {REDACTED})"


def test_a_registered_secret_is_scrubbed_from_a_record_outside_a_request() -> None:
    register_secret("registeredRecordKey9931")
    try:
        failure = EpisodeFailure(failure_reason="provider said registeredRecordKey9931 is bad", terminal=True)
    finally:
        forget_registered_secrets()
    assert failure.failure_reason == f"provider said {REDACTED} is bad"


def test_the_requests_credentials_are_read_from_its_scope_once(in_request: RequestFailureLog) -> None:
    assert current_request_secrets() == [f"Bearer {SECRET}", SECRET]
    assert in_request.known_secrets is not None
    cached = in_request.known_secrets[1]
    assert current_request_secrets() is cached
    in_request.request_scope = {"type": "http", "headers": [], "query_string": b"q=otherValue123"}
    assert current_request_secrets() == ["otherValue123"], "a new scope is read again"


def test_scrub_in_request_outside_a_request_returns_the_text_itself() -> None:
    text = f"Bearer {BEARER}"
    assert scrub_in_request(text, 2000) is text


# --- The app serializes the records itself ------------------------------------------------------


def _quoted_credentials(request: Request) -> str:
    """Every credential the request carries, bare, as a careless handler quotes them."""
    basic = base64.b64decode(request.headers["authorization"].partition(" ")[2]).decode()
    return (
        f"password {basic.partition(':')[2]} key {request.headers['x-api-key']} "
        f"session {request.cookies['sid']} bearer {request.headers['x-upstream-token']} "
        f"query {request.query_params['code']}"
    )


LOGGER = logging.getLogger("gym_failures.tests.records")


def _episode(request: Request) -> BaseEpisodeResponse:
    quoted = _quoted_credentials(request)
    failure = AgentFailure(
        failure_kind=AGENT_RUN_ERROR,
        failure_reason=f"the run refused {quoted}",
        foreign_error=SdkErrorDetails(exception_type="SdkError", message=f"sdk refused {quoted}"),
    )
    envelope = EpisodeFailure(failure_kind=AGENT_RUN_ERROR, failure_reason=f"refused {quoted}", terminal=True)
    LOGGER.error("episode failed: %s (%s)", envelope.failure_reason, failure)
    return BaseEpisodeResponse(failure=envelope, failure_report=failure.failure_report())


def _starlette_app() -> Starlette:
    async def dumped(request: Request) -> Response:
        return JSONResponse(_episode(request).model_dump(mode="json"))

    async def dumped_json(request: Request) -> Response:
        return Response(_episode(request).model_dump_json(), media_type="application/json")

    app = Starlette(
        routes=[
            Route("/dumped", dumped, methods=["POST"]),
            Route("/dumped-json", dumped_json, methods=["POST"]),
        ]
    )
    app.add_middleware(FailureReportMiddleware, boundary="agent")
    return app


def _fastapi_app() -> FastAPI:
    app = FastAPI()

    @app.post("/returned")
    async def returned(request: Request) -> BaseEpisodeResponse:
        return _episode(request)  # FastAPI validates and serializes it itself

    @app.post("/returned-sync")
    def returned_sync(request: Request) -> dict[str, Any]:
        return _episode(request).model_dump()  # in FastAPI's thread pool, a copied context

    app.add_middleware(FailureReportMiddleware, boundary="agent")
    return app


@pytest.mark.parametrize(
    ("make_app", "path"),
    [
        (_starlette_app, "/dumped"),
        (_starlette_app, "/dumped-json"),
        (_fastapi_app, "/returned"),
        (_fastapi_app, "/returned-sync"),
    ],
)
async def test_no_credential_reaches_a_body_the_app_serializes_itself(
    make_app: Callable[[], Any], path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Credentials in Authorization (from the URL's user info), X-Api-Key, a cookie, another token
    header and the query reach neither the body, a header, a saved row nor a log line."""
    transport = httpx.ASGITransport(app=make_app())
    async with httpx.AsyncClient(
        transport=transport, base_url=f"http://alice:{USERINFO_PASSWORD}@testserver"
    ) as client:
        reply = await client.post(
            path,
            params={"code": QUERY},
            headers={"x-api-key": API_KEY, "x-upstream-token": BEARER, "cookie": f"sid={COOKIE}"},
            json={},
        )
    assert reply.status_code == 200, reply.text
    body = BaseEpisodeResponse.model_validate_json(reply.content)  # outside a request: read as sent
    assert body.failure is not None
    assert body.failure_report is not None
    assert body.failure.failure_reason.startswith("refused password [REDACTED] key [REDACTED]")
    row = {**FailureReportRow.fields(body.failure_report), "failure": body.failure.model_dump(mode="json")}
    seen = {
        "body": reply.text,
        "headers": "\n".join(f"{k}: {v}" for k, v in reply.headers.multi_items()),
        "row": json.dumps(row),
        "log": caplog.text,
    }
    assert "episode failed" in caplog.text, "the control: the handler's line was captured"
    leaked = {where: [c for c in CANARIES if c in text] for where, text in seen.items()}
    assert leaked == {where: [] for where in seen}


# --- A secret a cut went through (the review of issue 23's merge) ------------------------------

LONG_TOKEN = "tok" + "A1b2C3d4" * 50  # a 403-character bearer token


async def _failure_reply(reason: str, headers: list[tuple[bytes, bytes]], query: bytes = b"") -> str:
    """The reply body of a handler that raises an `AgentFailure` with `reason`, as sent."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AgentFailure(failure_kind=AGENT_RUN_ERROR, failure_reason=reason)

    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/run",
        "query_string": query,
        "headers": headers,
    }
    await FailureReportMiddleware(app, boundary="agent")(scope, receive, send)
    return b"".join(
        message.get("body", b"") for message in sent if message["type"] == "http.response.body"
    ).decode()


def _longest_start(token: str, text: str) -> int:
    return max((length for length in range(2, len(token) + 1) if token[:length] in text), default=0)


async def test_a_token_the_reasons_pre_cut_goes_through_leaves_none_of_its_characters() -> None:
    """A reason past four times its bound is cut before it is redacted: a credential that cut goes
    through loses its first characters too, however many copies of it come before."""
    head = " ".join(f"attempt {number} sent {LONG_TOKEN}" for number in range(18)) + " | retrying with "
    reason = head + "." * (7700 - len(head)) + LONG_TOKEN
    assert len(reason) > 8000 > len(reason) - len(LONG_TOKEN)
    body = await _failure_reply(reason, [(b"authorization", f"Bearer {LONG_TOKEN}".encode())])
    assert _longest_start(LONG_TOKEN, body) < 2


@pytest.mark.parametrize("reverse", [False, True])
async def test_the_longest_start_of_any_secret_is_removed_whatever_their_order(reverse: bool) -> None:
    """Two request secrets, the end of one starting the other: the cut token goes whole, whichever
    secret is looked at first."""
    from gym_failures.redaction import without_a_cut_secret

    token, query = "Qx7pLm2aZZZZZZZZZZZZ", "2aBCDEFGH"
    secrets = [f"Bearer {token}", token, query]
    text = "x" * 20 + token[:8] + "…"
    ordered = secrets[::-1] if reverse else secrets
    assert without_a_cut_secret(text, ordered) == "x" * 20 + REDACTED + "…"


async def test_a_cut_after_the_word_bearer_in_prose_keeps_the_word() -> None:
    """The request's `Bearer <token>` header value is a secret; the word "Bearer" ending a cut
    reason is prose, not its start."""
    token = "Zq9mX2vB7nL4kP0wR8tY"
    prose = "no valid API key: send it as a Bearer token or in x-api-key"
    reason = "x" * (1999 - len("no valid API key: send it as a Bearer")) + prose  # cut after "Bearer"
    body = await _failure_reply(reason, [(b"authorization", f"Bearer {token}".encode())])
    assert "send it as a Bearer\\u2026" in body or "send it as a Bearer…" in body
    assert REDACTED not in body
