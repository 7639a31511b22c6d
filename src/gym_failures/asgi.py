"""Server side: a pure ASGI middleware that sends each request's failure report with its reply.

Add it the usual way on Starlette or FastAPI::

    app.add_middleware(FailureReportMiddleware, boundary="agent")

For each HTTP request it makes a new `RequestFailureLog` current, so code serving the request can
`observe_failure`, `observe_model_operation` and `observe_reply`. When the response starts it adds the
`X-NG-Failure-Report` header if the log holds anything. When the handler raises before the response
started, it replies itself with `failure_status` (500), a small JSON body naming the failure and the
header carrying the failure and its causes. A non-Gym exception becomes a failure of this server's
boundary with `default_failure_kind`, its type recorded and a bounded reason from which credentials,
URL secrets and the request's own credential values are removed. If the response had already started,
the exception is re-raised and no second start is ever sent.

Streaming replies pass through byte for byte: `send` is wrapped, never buffered. A server puts the
report into its terminal SSE event with `stream_failure_field`; a relay passes a stream on unchanged
with `relay_stream`, which reads the stream's report and observes it.

This module is pure ASGI: it imports no web framework. It is never a `BaseHTTPMiddleware`, which runs
the app in a copied context (a ContextVar set inside would not flow back) and costs most of the
throughput.

Decisions:
- The failure reply's status is one configurable value (500); the failure kind, not the status, says
  what went wrong.
- A failure reply whose report is over the header's bound keeps the request's own failure chain,
  marked omitted, and leaves the observations out; only when the chain alone is too large is the
  header `{"omitted": true}`. The caller can then still rebuild the failure with its origin id.
- A reply's report is scrubbed of the request's own credential values (headers, query values) before
  it is sent, in the header and in a stream's terminal event alike: a producer's reason may have
  quoted them. The request's log keeps the scope for that (`_ServedRequestLog`), so the success path
  sets no second ContextVar.
- The log line for a failed request carries the kind, the event id, the raising frame and the
  redacted reason at ERROR (the whole stack, frames only, at DEBUG), never `str(exc)` or a formatted
  exception, whose last line quotes it.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
)
from typing import Any

from gym_failures._redact import redact, request_secrets
from gym_failures._request_log import _NO_EVENTS
from gym_failures.failure_kinds import INFRASTRUCTURE_ERROR, FailureStage
from gym_failures.failure_records import FailureBoundary, FailureEvent, FailureReport
from gym_failures.failure_transport import (
    FailureHeader,
    ModelOperationObservation,
    RequestFailureLog,
    StreamFailureReportReader,
    report_for_current_request,
)
from gym_failures.failures import NgFailureEvent, bounded_text, exception_type_name, explicit_gym_cause

__all__ = ["FailureReportMiddleware", "relay_stream", "sse_event", "stream_failure_field"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOGGER = logging.getLogger(__name__)

_HEADER_NAME = FailureHeader.NAME.lower().encode("ascii")
_CURRENT = RequestFailureLog._current
_OMITTED_HEADER = [(_HEADER_NAME, b'{"omitted": true}')]
_MAX_REDACTED_INPUT = 4 * 2000


class _ServedRequestLog(RequestFailureLog):
    """The log of a request this middleware serves, with the request's scope: a report written into the
    request's stream (`stream_failure_field`) is scrubbed of the request's credentials as its header is.

    One is made per request, so it costs one attribute: every field starts as its class-level default
    (the shared empty report, zero counts) and gets its own value on first write; `model_operations`
    gets its dict on first use.
    """

    report = _NO_EVENTS
    dropped_events = 0
    dropped_model_operations = 0

    def __init__(self, scope: Scope) -> None:  # no super().__init__(): see the docstring
        self.scope = scope

    @property
    def model_operations(self) -> dict[str, ModelOperationObservation]:
        operations: dict[str, ModelOperationObservation] | None = self.__dict__.get("_operations")
        if operations is None:
            operations = self.__dict__["_operations"] = {}
        return operations

    @model_operations.setter
    def model_operations(self, value: dict[str, ModelOperationObservation]) -> None:
        self.__dict__["_operations"] = value


class FailureReportMiddleware:
    """Send each HTTP request's failure report in its reply; reply for a handler that raised."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        boundary: FailureBoundary | str,
        default_failure_kind: str = INFRASTRUCTURE_ERROR,
        failure_status: int = 500,
        stage: FailureStage | None = None,
    ) -> None:
        if not 400 <= failure_status <= 599:
            raise ValueError("failure_status must be a 4xx or 5xx status")
        self.app = app
        self.boundary = FailureBoundary(boundary)
        self.default_failure_kind = default_failure_kind
        self.failure_status = failure_status
        self.stage = stage
        # Fail at startup, not at the first failure, if the default kind cannot make an event.
        self._wrap(RuntimeError(), known_secrets=())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        log = _ServedRequestLog(scope)
        token = _CURRENT.set(log)
        response_started = False

        async def send_with_report(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
                # Only `add` replaces the shared empty report, so this is "the log holds anything".
                if log.report is not _NO_EVENTS:
                    message = _with_report_header(message, log.report, scope)
                else:
                    # An app may set the header itself (a failure it replies with, not raises): it is
                    # scrubbed too. Inline: this runs on every reply. ASGI header names are lower case.
                    headers = message.get("headers", ())
                    if type(headers) is not list:  # any other iterable: read it once, and keep it
                        headers = message["headers"] = list(headers)
                    for name, _ in headers:
                        if name == _HEADER_NAME:
                            message = _with_report_header(message, None, scope)
                            break
            await send(message)

        try:
            await self.app(scope, receive, send_with_report)
        except Exception as error:
            if response_started:
                raise
            await self._send_failure(scope, error, log, send)
        finally:
            _CURRENT.reset(token)

    def _wrap(self, error: BaseException, known_secrets: Iterable[str]) -> NgFailureEvent:
        try:
            # Cut before redacting, as `failures` does: only the first 2000 characters are kept, and
            # an exception's text can be megabytes (a quoted payload).
            message = str(error)[:_MAX_REDACTED_INPUT]
        except Exception:  # a broken __str__ must not hide the failure
            message = ""
        type_name = exception_type_name(error)
        reason = redact(f"{type_name}: {message}" if message else type_name, known_secrets)
        failure = NgFailureEvent(
            boundary=self.boundary,
            failure_kind=self.default_failure_kind,
            failure_reason=bounded_text(reason),
            stage=self.stage,
            exception_type=type_name,
        )
        # An explicit cause: the Gym failure under `error`, if any, becomes this failure's cause.
        failure.__cause__ = error
        return failure

    def _failure_of(
        self, error: BaseException, log: RequestFailureLog, known_secrets: Iterable[str]
    ) -> NgFailureEvent:
        """The Gym failure `error` is, or this server's failure wrapping it.

        A task group raises an exception group: a group whose one leaf is a Gym failure is that
        failure (a model-side failure must not become this server's `infrastructure_error`); in a
        larger group, the first Gym leaf is the wrapper's cause and the others are observations.
        """
        if isinstance(error, NgFailureEvent):
            return error
        if isinstance(error, BaseExceptionGroup):
            leaves = list(_leaves(error))
            # A leaf raised `from` a Gym failure carries it, as outside a group.
            found = (
                leaf if isinstance(leaf, NgFailureEvent) else explicit_gym_cause(leaf) for leaf in leaves
            )
            gym = [failure for failure in found if failure is not None]
            if len(leaves) == 1 and isinstance(leaves[0], NgFailureEvent):
                return leaves[0]
            failure = self._wrap(error, known_secrets)
            if gym:
                failure.__cause__ = gym[0]
                for other in gym[1:]:
                    log.add(other.failure_report().model_copy(update={"failure_id": None}))
            return failure
        return self._wrap(error, known_secrets)

    async def _send_failure(self, scope: Scope, error: Exception, log: RequestFailureLog, send: Send) -> None:
        secrets = _secrets_of(scope)
        failure = self._failure_of(error, log, secrets)
        own = failure.failure_report()
        report, report_headers = _fitting(_scrubbed(own.merged(log.report), scope), own)
        event = report.events.get(failure.event_id) or failure.to_event()
        _log_failure(event, error)
        body = json.dumps(
            {
                "failure_kind": event.failure_kind,
                "failure_reason": event.failure_reason,
                "event_id": event.event_id,
                "boundary": event.boundary.value,
            },
            ensure_ascii=True,
        ).encode("ascii")
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode("ascii")),
        ]
        headers.extend(report_headers)
        await send({"type": "http.response.start", "status": self.failure_status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _fitting(
    report: FailureReport, own: FailureReport | None
) -> tuple[FailureReport, list[tuple[bytes, bytes]]]:
    """`report` and its header when it fits; else only its own failure chain (`own`), marked omitted.

    The observations are what a full header leaves out first: the failure's own event id is what the
    caller rebuilds. `report` is already scrubbed and holds `own`'s events, which are taken from it.
    """
    headers = _encoded_header(report)
    if own is None or not report.events or headers != _OMITTED_HEADER:
        return report, headers
    events = {event_id: report.events[event_id] for event_id in own.events if event_id in report.events}
    trimmed = FailureReport.model_construct(events=events, failure_id=own.failure_id, omitted=True)
    return trimmed, _encoded_header(trimmed)


def _secrets_of(scope: Scope) -> list[str]:
    return request_secrets(scope.get("headers") or (), scope.get("query_string") or b"")


def _scrubbed(report: FailureReport, scope: Scope) -> FailureReport:
    """`report` without the request's own credential values in any reason or message."""
    secrets = [s for s in _secrets_of(scope) if len(s) >= 6]
    if not secrets:
        return report
    changed: dict[str, FailureEvent] = {}
    for event_id, event in report.events.items():
        status_reason = getattr(event.details, "provider_status_reason", None)
        texts = [
            event.failure_reason,
            event.foreign_error.message if event.foreign_error else "",
            event.operation or "",
            status_reason or "",
        ]
        if not any(secret in text for secret in secrets for text in texts):
            continue
        # The marker is longer than a short secret: cut again so the event keeps its bounds.
        update: dict[str, Any] = {"failure_reason": bounded_text(redact(event.failure_reason, secrets))}
        if event.foreign_error is not None:
            update["foreign_error"] = event.foreign_error.model_copy(
                update={"message": bounded_text(redact(event.foreign_error.message, secrets))}
            )
        if event.operation is not None:
            update["operation"] = bounded_text(redact(event.operation, secrets), 256)
        if event.details is not None and status_reason is not None:
            update["details"] = event.details.model_copy(
                update={"provider_status_reason": bounded_text(redact(status_reason, secrets))}
            )
        changed[event_id] = event.model_copy(update=update)
    if not changed:
        return report
    return FailureReport.model_construct(
        events={**report.events, **changed}, failure_id=report.failure_id, omitted=report.omitted
    )


def _encoded_header(report: FailureReport) -> list[tuple[bytes, bytes]]:
    return [
        (name.lower().encode("ascii"), value.encode("ascii"))
        for name, value in FailureHeader.encode(report).items()
    ]


def _with_report_header(message: Message, log_report: FailureReport | None, scope: Scope) -> Message:
    """`message` with one report header: the app's own (an app may reply with its failure without
    raising) merged with the log's, the app's `failure_id` kept, scrubbed and fitted to the bound."""
    headers: list[tuple[bytes, bytes]] = []
    inner: FailureReport | None = None
    for name, value in message.get("headers", ()):
        if name.lower() == _HEADER_NAME:
            decoded = FailureHeader.decode({FailureHeader.NAME: value.decode("latin-1")})
            if decoded is not None:
                inner = decoded if inner is None else inner.merged(decoded)
        else:
            headers.append((name, value))
    if inner is None:
        assert log_report is not None
        report, own = log_report, None
    else:
        report = inner if log_report is None else inner.merged(log_report)
        own = _chain_of(inner)
    _, encoded = _fitting(_scrubbed(report, scope), own)
    headers.extend(encoded)
    return {**message, "headers": headers}


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield error


def _chain_of(report: FailureReport) -> FailureReport | None:
    """`report`'s own failure and its causes, or `None` when it has no failure."""
    events: dict[str, FailureEvent] = {}
    event_id = report.failure_id
    while event_id is not None and event_id in report.events and event_id not in events:
        events[event_id] = report.events[event_id]
        event_id = report.events[event_id].cause_id
    if not events:
        return None
    return FailureReport.model_construct(events=events, failure_id=report.failure_id, omitted=False)


def _log_failure(event: FailureEvent, error: BaseException) -> None:
    # Never exc_info: the last line of a formatted exception is str(error), which may quote the request.
    # The raising frame is enough at ERROR; the whole stack (frames only) is there at DEBUG.
    where = ""
    tb = error.__traceback__
    if tb is not None:
        while tb.tb_next is not None:
            tb = tb.tb_next
        where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
    LOGGER.error(
        "request failed: %s (%s, event %s)%s: %s",
        event.failure_kind,
        event.boundary.value,
        event.event_id,
        where,
        event.failure_reason,
    )
    if error.__traceback__ is not None and LOGGER.isEnabledFor(logging.DEBUG):
        LOGGER.debug(
            "frames of event %s:\n%s", event.event_id, "".join(traceback.format_tb(error.__traceback__))
        )


def stream_failure_field(error: BaseException | None = None) -> dict[str, Any]:
    """`{STREAM_FIELD: report}` for the current request's report (with `error`, if the stream
    failed), to merge into the payload of the stream's terminal event; `{}` when there is nothing."""
    report = report_for_current_request(error)
    log = RequestFailureLog.current()
    if isinstance(log, _ServedRequestLog):
        report = _scrubbed(report, log.scope)
    report, _ = _fitting(report, _chain_of(report))
    value = FailureHeader.stream_value(report)
    return {} if value is None else {FailureHeader.STREAM_FIELD: value}


def sse_event(event: str, data: Mapping[str, Any]) -> bytes:
    """One server-sent event, `event:` and one `data:` line of compact JSON."""
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event}\ndata: {payload}\n\n".encode()


async def relay_stream(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Yield `chunks` unchanged while reading the stream's terminal failure report; when the stream
    ends (or the consumer stops), observe that report into the current request's log."""
    reader = StreamFailureReportReader()
    iterator = aiter(chunks)
    observed: FailureReport | None = None
    try:
        async for chunk in iterator:
            reader.feed(chunk)
            if reader.report is not observed:
                # At once: a consumer that stops after the terminal event may close us much later.
                reader.observe()
                observed = reader.report
            yield chunk
    finally:
        reader.finish()
        if reader.report is not observed:
            reader.observe()
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
