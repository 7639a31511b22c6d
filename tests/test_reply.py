"""Tests for the reply-report pipeline: build, scrub, fit, encode (`gym_failures.reply`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failure_kinds import MODEL_SERVER_ERROR, PROVIDER_COMMAND_TIMEOUT, PROVIDER_QUOTA_EXHAUSTED
from gym_failures.failure_records import FailureEvent, FailureReport, SdkErrorDetails
from gym_failures.failure_transport import (
    FailureHeader,
    RequestFailureLog,
    observe_failure,
    report_for_current_request,
)
from gym_failures.failures import AgentFailure, ModelFailure, SandboxFailure, sdk_error_details
from gym_failures.redaction import REDACTED
from gym_failures.reply import (
    episode_response,
    fit,
    own_chain,
    reply_headers,
    reply_report,
    scrub,
    stream_failure_field,
)
from tests.test_asgi import in_process

SECRET = "Zq9CanaryReplySecret"


def failure_quoting(secret: str, reason_length: int = 0) -> ModelFailure:
    return ModelFailure(
        failure_kind=MODEL_SERVER_ERROR, failure_reason=f"saw {secret} " + "x" * reason_length
    )


def header_size(report: FailureReport) -> int:
    return len(report.__pydantic_serializer__.to_json(report))


def request_log(*secrets: str) -> RequestFailureLog:
    log = RequestFailureLog()
    log.request_scope = {
        "type": "http",
        "headers": [(b"authorization", f"Bearer {secret}".encode()) for secret in secrets],
        "query_string": b"",
    }
    return log


# --- scrub -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "make"),
    [
        ("failure_reason", lambda s: SandboxFailure(failure_kind=PROVIDER_COMMAND_TIMEOUT, failure_reason=s)),
        ("operation", lambda s: SandboxFailure(failure_kind=PROVIDER_COMMAND_TIMEOUT, operation=f"run {s}")),
        (
            "foreign_error",
            lambda s: ModelFailure(
                failure_kind=MODEL_SERVER_ERROR, foreign_error=sdk_error_details(RuntimeError(), f"bad {s}")
            ),
        ),
        (
            "details",
            lambda s: SandboxFailure(
                failure_kind=PROVIDER_COMMAND_TIMEOUT, details={"provider_status_reason": f"pod {s} died"}
            ),
        ),
    ],
)
def test_scrub_removes_a_secret_from_every_free_text_field(field: str, make: Any) -> None:
    """Each of `FailureEvent.TEXT_FIELDS` is scrubbed, and nothing else of the event changes."""
    failure = make(SECRET)
    report = failure.failure_report()
    assert SECRET in report.model_dump_json()

    scrubbed = scrub(report, [SECRET])

    assert SECRET not in scrubbed.model_dump_json()
    assert REDACTED in json.dumps(scrubbed.model_dump(mode="json")["events"][failure.event_id][field])
    assert scrubbed.failure_id == report.failure_id
    assert FailureReport.model_validate_json(scrubbed.model_dump_json()) == scrubbed


def test_text_fields_name_every_free_text_field_of_an_event() -> None:
    """A new free-text field must be added to `TEXT_FIELDS`, or scrubbing would miss it."""
    structured = {"event_id", "boundary", "failure_kind", "stage", "cause_id", "operation_id", "attempt_id"}
    structured |= {"http_status", "exception_type"}
    declared = {name for name, _, _ in FailureEvent.TEXT_FIELDS}
    assert declared | structured == set(FailureEvent.model_fields)
    assert "message" in SdkErrorDetails.model_fields


def test_scrub_without_a_secret_in_the_report_returns_it_unchanged() -> None:
    report = failure_quoting("nothing").failure_report()
    assert scrub(report, [SECRET]) is report
    assert scrub(report, []) is report


def test_scrub_keeps_a_reason_at_its_bound_when_the_marker_is_longer_than_the_secret() -> None:
    short = "sk7Qx9"  # 6 characters, the shortest secret scrubbed; the marker has 10
    failure = ModelFailure(failure_kind=MODEL_SERVER_ERROR, failure_reason=(short + " ") * 300)
    assert len(failure.failure_reason) == 2000

    event = scrub(failure.failure_report(), [short]).events[failure.event_id]

    assert short not in event.failure_reason
    assert len(event.failure_reason) == 2000
    assert event.failure_reason.endswith("…")


def test_with_texts_returns_the_event_itself_when_nothing_changes() -> None:
    event = failure_quoting("plain").to_event()
    assert event.with_texts(lambda text, bound: text) is event


# --- fit -------------------------------------------------------------------------------------


def report_of_size(size: int, observations: int = 0) -> FailureReport:
    """A failure report whose compact JSON is exactly `size` bytes, with `observations` more events."""
    report = FailureReport()
    for _ in range(observations):
        report = report.merged(
            failure_quoting("seen", 1000).failure_report().model_copy(update={"failure_id": None})
        )
    failure = ModelFailure(failure_kind=MODEL_SERVER_ERROR, failure_reason="r")
    padding = size - header_size(failure.failure_report().merged(report))
    assert 0 <= padding < 1999
    failure = ModelFailure(failure_kind=MODEL_SERVER_ERROR, failure_reason="r" * (1 + padding))
    result = failure.failure_report().merged(report)
    assert header_size(result) == size
    return result


def test_a_report_at_the_bound_is_sent_whole() -> None:
    report = report_of_size(FailureHeader.MAX_BYTES, observations=3)

    fitted = fit(report)

    assert fitted.report == report
    assert fitted.header_value is not None
    assert len(fitted.header_value) == FailureHeader.MAX_BYTES


def test_a_report_one_byte_over_keeps_its_chain_marked_omitted() -> None:
    report = report_of_size(FailureHeader.MAX_BYTES + 1, observations=3)

    fitted = fit(report)

    assert report.failure_id is not None
    assert set(fitted.report.events) == {report.failure_id}
    assert fitted.report.omitted
    assert FailureHeader.decode({FailureHeader.NAME: fitted.header_value or ""}) == fitted.report


def test_observations_over_the_bound_without_a_failure_are_sent_as_omitted() -> None:
    report = FailureReport()
    for _ in range(3):
        report = report.merged(
            failure_quoting("", 1900).failure_report().model_copy(update={"failure_id": None})
        )

    fitted = fit(report)

    assert fitted == (FailureReport(omitted=True), '{"omitted": true}')


def test_an_empty_report_has_no_header_value() -> None:
    assert fit(FailureReport()) == (FailureReport(), None)


def test_own_chain_follows_causes_and_leaves_observations_out() -> None:
    cause = failure_quoting("cause")
    failure = AgentFailure(failure_kind="agent_run_error")
    failure.__cause__ = cause
    report = failure.failure_report().merged(failure_quoting("seen").failure_report())

    chain = own_chain(report)

    assert chain is not None
    assert set(chain.events) == {failure.event_id, cause.event_id}
    assert chain.failure_id == failure.event_id
    assert own_chain(FailureReport()) is None


def test_own_chain_stops_at_a_loop() -> None:
    """Only a report built without validation can loop; the chain still ends."""
    first, second = failure_quoting("a").to_event(), failure_quoting("b").to_event()
    events = {
        first.event_id: first.model_copy(update={"cause_id": second.event_id}),
        second.event_id: second.model_copy(update={"cause_id": first.event_id}),
    }
    looped = FailureReport.model_construct(events=events, failure_id=first.event_id, omitted=False)

    chain = own_chain(looped)

    assert chain is not None
    assert set(chain.events) == set(events)


# --- the whole pipeline ------------------------------------------------------------------------


def test_reply_report_merges_the_error_and_the_log_and_scrubs_the_requests_secrets() -> None:
    log = request_log(SECRET)
    observed = failure_quoting(SECRET)
    own = failure_quoting(SECRET)
    token = RequestFailureLog._current.set(log)
    try:
        observe_failure(observed)
        report = reply_report(own)
        assert report_for_current_request(own) == report
    finally:
        RequestFailureLog._current.reset(token)

    assert set(report.events) == {observed.event_id, own.event_id}
    assert report.failure_id == own.event_id
    assert SECRET not in report.model_dump_json()


def test_reply_report_outside_a_request_is_the_errors_chain() -> None:
    failure = failure_quoting("x")
    assert reply_report(failure) == failure.failure_report()
    assert reply_report(None) == FailureReport()


def test_reply_headers_and_stream_field_are_empty_without_anything_to_send() -> None:
    with RequestFailureLog.capture():
        assert reply_headers() == {}
        assert stream_failure_field() == {}


async def test_a_failure_replied_without_raising_gets_the_middlewares_rules() -> None:
    """A 429 a handler returns with `reply_headers` is scrubbed and fitted exactly as a raised one."""

    def quota_failure(request: Request) -> ModelFailure:
        observe_failure(failure_quoting(SECRET, 1900))  # observations push the report over the bound
        observe_failure(failure_quoting(SECRET, 1900))
        return ModelFailure(
            failure_kind=PROVIDER_QUOTA_EXHAUSTED,
            failure_reason=f"quota for key {request.headers['authorization'][7:]} exhausted",
            http_status=429,
        )

    async def returned(request: Request) -> Response:
        failure = quota_failure(request)
        return JSONResponse({"error": "quota"}, status_code=429, headers=reply_headers(failure))

    async def raised(request: Request) -> Response:
        raise quota_failure(request)

    app = Starlette(routes=[Route("/returned", returned), Route("/raised", raised)])
    app.add_middleware(FailureReportMiddleware, boundary="model")
    async with in_process(app) as client:
        auth = {"authorization": f"Bearer {SECRET}"}
        replies = [await client.get(path, headers=auth) for path in ("/returned", "/raised")]

    reports = [FailureHeader.decode(reply.headers) for reply in replies]
    for reply, report in zip(replies, reports, strict=True):
        assert SECRET not in reply.headers[FailureHeader.NAME]
        assert report is not None
        assert report.omitted
        assert report.failure_id is not None
        assert list(report.events) == [report.failure_id]
    assert replies[0].status_code == 429


# --- the log ---------------------------------------------------------------------------------


def test_a_new_log_is_empty_and_each_log_has_its_own_operations() -> None:
    first, second = RequestFailureLog(), RequestFailureLog()
    assert first.is_empty()
    first.model_operations["x"] = None  # type: ignore[assignment]
    assert second.model_operations == {}


def test_a_log_marked_omitted_is_not_empty() -> None:
    log = RequestFailureLog()
    log.add(FailureReport(omitted=True))
    assert not log.is_empty()


def test_the_logs_request_secrets_come_from_its_scope_and_skip_short_values() -> None:
    log = request_log(SECRET)
    log.request_scope = {**(log.request_scope or {}), "query_string": b"page=2&token=abcdefgh"}
    assert SECRET in log.request_secrets()
    assert "abcdefgh" in log.request_secrets()
    assert "2" not in log.request_secrets()
    assert RequestFailureLog().request_secrets() == []


def test_scrub_removes_the_first_characters_of_a_secret_the_cut_went_through() -> None:
    failure = ModelFailure(failure_kind=MODEL_SERVER_ERROR, failure_reason="x" * 1990 + SECRET)
    assert failure.failure_reason.endswith(SECRET[:9] + "…")

    event = scrub(failure.failure_report(), [SECRET]).events[failure.event_id]

    assert SECRET[:9] not in event.failure_reason
    assert len(event.failure_reason) <= 2000


async def test_a_handler_raising_text_with_a_lone_surrogate_gets_a_failure_reply() -> None:
    """Tool output decoded with `surrogateescape` must not turn the failure reply into a bare 500."""

    async def handler(request: Request) -> Response:
        raise RuntimeError("stderr: " + b"\xff".decode("utf-8", "surrogateescape"))

    app = Starlette(routes=[Route("/", handler)])
    app.add_middleware(FailureReportMiddleware, boundary="sandbox")
    async with in_process(app) as client:
        reply = await client.get("/")

    report = FailureHeader.decode(reply.headers)
    assert reply.status_code == 500
    assert report is not None
    assert report.failure_id is not None
    # The exception's text is never read, so its lone surrogate never reaches the reply.
    assert report.events[report.failure_id].exception_type == "RuntimeError"
    assert reply.json()["event_id"] == report.failure_id


def test_an_episode_body_is_scrubbed_of_the_requests_secrets() -> None:
    log = request_log(SECRET)
    failure = failure_quoting(SECRET)
    token = RequestFailureLog._current.set(log)
    try:
        body = episode_response(failure=failure, terminal=True)
    finally:
        RequestFailureLog._current.reset(token)

    assert body.failure is not None
    assert body.failure.terminal
    assert body.failure.failure_kind == MODEL_SERVER_ERROR
    assert body.failure_report is not None
    assert body.failure_report.failure_id == failure.event_id
    assert SECRET not in body.model_dump_json()


def test_a_success_body_carries_what_it_recovered_from_and_nothing_else() -> None:
    with RequestFailureLog.capture():
        assert episode_response(result={"reward": 1.0}).failure_report is None
        observe_failure(failure_quoting("x"))
        body = episode_response(result={"reward": 1.0})
    assert body.result == {"reward": 1.0}
    assert body.failure_report is not None
    assert len(body.failure_report.events) == 1
    assert body.failure_report.failure_id is None


# --- Review findings (each reproduced before it was fixed) ---------------------------------------

from gym_failures.failure_transport import observe_reply, reply_failure_report  # noqa: E402
from gym_failures.redaction import forget_registered_secrets, register_secret  # noqa: E402

PROVIDER_KEY = "plainProviderKeyZq9Review"


@pytest.fixture
def registered_key() -> Iterator[str]:
    forget_registered_secrets()
    register_secret(PROVIDER_KEY)
    yield PROVIDER_KEY
    forget_registered_secrets()


async def test_a_registered_secret_never_reaches_a_reply_header(registered_key: str) -> None:
    """Whether it came in a peer's report, an adapter's own SdkErrorDetails, or a handler's own reply."""
    peer = FailureHeader.encode(
        FailureReport.model_construct(
            events={
                "peerEvent0000001": FailureEvent(
                    event_id="peerEvent0000001",
                    boundary="model",
                    failure_kind=MODEL_SERVER_ERROR,
                    failure_reason=f"provider refused {registered_key}",
                )
            },
            failure_id=None,
            omitted=False,
        )
    )

    async def observed(request: Request) -> Response:
        observe_reply(peer)
        return JSONResponse({})

    async def sdk(request: Request) -> Response:
        raise ModelFailure(
            failure_kind=MODEL_SERVER_ERROR,
            foreign_error=SdkErrorDetails(exception_type="x.APIError", message=f"bad key {registered_key}"),
        )

    async def manual(request: Request) -> Response:
        failure = ModelFailure(failure_kind=PROVIDER_QUOTA_EXHAUSTED, failure_reason="quota", http_status=429)
        failure.__cause__ = ModelFailure(
            failure_kind=MODEL_SERVER_ERROR, failure_reason=f"k={registered_key}"
        )
        return JSONResponse({}, status_code=429, headers=reply_headers(failure))

    app = Starlette(routes=[Route("/observed", observed), Route("/sdk", sdk), Route("/manual", manual)])
    app.add_middleware(FailureReportMiddleware, boundary="model")
    async with in_process(app) as client:
        replies = [await client.get(path) for path in ("/observed", "/sdk", "/manual")]

    for reply in replies:
        assert FailureHeader.NAME in reply.headers
        assert registered_key not in reply.headers[FailureHeader.NAME]
        assert registered_key not in reply.text


async def test_a_report_header_the_app_sets_in_mixed_case_is_scrubbed_too() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        failure = failure_quoting(SECRET)
        value = FailureHeader.encode(failure.failure_report())[FailureHeader.NAME]
        headers = [(b"X-NG-Failure-Report", value.encode())]
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    wrapped = FailureReportMiddleware(app, boundary="model")
    async with in_process(wrapped) as client:
        reply = await client.get("/", headers={"authorization": f"Bearer {SECRET}"})

    assert SECRET not in reply.headers[FailureHeader.NAME]


async def test_a_server_without_the_middleware_scrubs_with_the_requests_scope() -> None:
    async def handler(request: Request) -> Response:
        failure = failure_quoting(request.cookies["sid"])
        return JSONResponse({}, status_code=429, headers=reply_headers(failure, scope=request.scope))

    app = Starlette(routes=[Route("/", handler)])
    async with in_process(app) as client:
        reply = await client.get("/", headers={"cookie": f'sid="{SECRET}"'})

    assert reply.headers[FailureHeader.NAME]
    assert SECRET not in reply.headers[FailureHeader.NAME]


def test_every_report_for_a_reply_is_scrubbed_whichever_name_makes_it() -> None:
    log = request_log(SECRET)
    failure = failure_quoting(SECRET)
    token = RequestFailureLog._current.set(log)
    try:
        reports = [log.reply_report(failure), reply_report(failure), reply_failure_report(failure)]
    finally:
        RequestFailureLog._current.reset(token)
    for report in reports:
        assert report is not None
        assert SECRET not in report.model_dump_json()
