"""Server side: a pure ASGI middleware that sends each request's failure report with its reply.

Add it the usual way on Starlette or FastAPI::

    app.add_middleware(FailureReportMiddleware, boundary="agent")

For each HTTP request it makes a new `RequestFailureLog` current, so code serving the request can
`observe_failure`, `observe_model_operation` and `observe_reply`. When the response starts it adds the
`X-NG-Failure-Report` header if the log holds anything. When the handler raises before the response
started, it replies itself with `failure_status` (500), a small JSON body naming the failure and the
header carrying the failure and its causes. A non-Gym exception becomes a failure of this server's
boundary with `default_failure_kind`, its type recorded (`exception_type`) and a reason naming that
type; its text (`str()`) is never read, as it is never read into any failure: it can quote the
request (a validation error quotes the body's values) and credentials no redaction recognises. A
handler that wants its words in the reply raises a Gym failure with a `failure_reason`. A broken
`failure_status` or `error_shape` function is logged by its type and raising frame, not its text.
If the response had already started, the exception is re-raised and no second start is ever sent.

An HTTP library's own status error (an `aiohttp.ClientResponseError` from NeMo Gym's `raise_for_status`
or `response.raise_for_status()`, an httpx `HTTPStatusError`) keeps the upstream reply's headers: the
upstream failure they report is rebuilt (`gym_failures.client.status_error_failure`). A status error
that escapes the handler is replied with as that upstream failure, as `raise_boundary_failure` would
have raised it (so is gym-failures' own `raise_for_status` error); an exception raised `from` one is
this server's failure with the upstream failure as its cause, and so is a Gym failure raised `from`
one (`raise ResourcesServerFailure(...) from error`, with the status error anywhere on its explicit
chain). Call sites that never use gym-failures' client helpers still send the cause chain with its
origin ids.

Streaming replies pass through byte for byte: `send` is wrapped, never buffered. A server puts the
report into its terminal SSE event with `stream_failure_field` (from `gym_failures.reply`, re-exported
here); a relay passes a stream on unchanged with `relay_stream`, which reads the stream's report and
observes it.

This module is the middleware. Its companions, re-exported here where they are documented, are one
job each: `gym_failures._error_body` (`error_body`, `ErrorShape`: the failure reply's JSON body in each
API's shape) and `gym_failures._stream_relay` (`relay_stream`, `sse_event`).

This module is pure ASGI: it imports no web framework. It is never a `BaseHTTPMiddleware`, which runs
the app in a copied context (a ContextVar set inside would not flow back) and costs most of the
throughput.

Decisions:
- The failure reply's status is one configurable value (500); the failure kind, not the status, says
  what went wrong.
- Every report this middleware sends is made by `gym_failures.reply` (built, scrubbed of the
  request's own credential values, fitted to the header's bound): the failure reply's header, a
  success reply's, and a header the app set itself (merged with the log, the app's `failure_id`
  kept). The request's log keeps the scope (`RequestFailureLog.request_scope`) so that a report
  written into the request's stream is scrubbed the same way.
- The failure reply's body is in the shape its callers' clients read (`error_shape`, per app, or per
  request with a function of the ASGI scope): `"gym"`, `"openai"` or `"anthropic"`
  (`gym_failures._error_body` says each shape). The report itself stays in the header.
- `failure_status` is one status, or a function of the failure (a model endpoint replies 429 to a
  quota failure, so clients back off); a function's answer outside 400-599 falls back to 500.
- A failure reply whose failure knows when a retry can succeed (`failures.retry_hint_s`: an explicit
  hint, a provider's own `Retry-After`, a quota's reset time) sends `Retry-After` in whole seconds,
  rounded up, so an SDK's retry loop waits that long.
- Every failure reply is sent by `FailureReportMiddleware._send_failure`, and only there.
- A Gym failure raised `from` a library's status error is linked to the upstream failure by making
  that rebuilt failure the status error's own `__cause__` (the status error is what the upstream
  failure caused), so the failure's `cause_id`, report, `retry_hint_s` and log line all see it and the
  traceback still shows the status error. Only a status error without a cause of its own is linked:
  one raised `from` something keeps that (an HTTP library raises its status error from nothing).
- A reply (a success, or the failure reply) whose request made model calls (its log kept a
  `ModelOperationObservation`) carries `X-Gym-Model-Calls`: the calls, their attempts, the failed
  ones and the tokens the replies reported (`gym_failures._attempt_cost`), which `collect` saves on
  the attempt's row. A header apart from the failure report, whose model (`FailureReport`, extra
  fields forbidden) older peers must keep reading; checking for it costs a reply without model calls
  one attribute read.
- The log line for a failed request carries the kind, the event id, the raising frame and the
  redacted reason at ERROR (the whole stack, frames only, at DEBUG), never `str(exc)` or a formatted
  exception, whose last line quotes it.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import (
    Awaitable,
    Callable,
    Iterator,
    MutableMapping,
)
from typing import Any

from gym_failures._attempt_cost import with_model_calls_header
from gym_failures._error_body import ERROR_TYPES, ErrorShape, error_body
from gym_failures._http_status import error_status
from gym_failures._request_log import CURRENT_REQUEST_LOG
from gym_failures._stream_relay import relay_stream, sse_event
from gym_failures.client import status_error_failure
from gym_failures.failure_kinds import INFRASTRUCTURE_ERROR, FailureStage
from gym_failures.failure_records import (
    FailureBoundary,
    FailureEvent,
    FailureReport,
    merged_taking_failure_id,
)
from gym_failures.failure_transport import FailureHeader, RequestFailureLog
from gym_failures.failures import (
    NgFailureEvent,
    exception_type_name,
    explicit_gym_cause,
    retry_hint_s,
)
from gym_failures.reply import fit, scrub, stream_failure_field
from gym_failures.telemetry import record_reply

__all__ = [
    "ErrorShape",
    "FailureReportMiddleware",
    "error_body",
    "relay_stream",
    "sse_event",
    "stream_failure_field",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOGGER = logging.getLogger(__name__)

_HEADER_NAME = FailureHeader.NAME.lower().encode("ascii")
_HEADER_NAMES = (_HEADER_NAME, FailureHeader.NAME.encode("ascii"))
_MAX_LINK_WALK = 64


class FailureReportMiddleware:
    """Send each HTTP request's failure report in its reply; reply for a handler that raised."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        boundary: FailureBoundary | str,
        default_failure_kind: str = INFRASTRUCTURE_ERROR,
        failure_status: int | Callable[[NgFailureEvent], int] = 500,
        stage: FailureStage | None = None,
        error_shape: ErrorShape | Callable[[Scope], ErrorShape] = "gym",
    ) -> None:
        if not callable(failure_status) and error_status(failure_status) is None:
            raise ValueError("failure_status must be a 4xx or 5xx status")
        if not callable(error_shape) and error_shape not in ERROR_TYPES:
            raise ValueError(f"error_shape must be one of {sorted(ERROR_TYPES)}")
        self.app = app
        self.boundary = FailureBoundary(boundary)
        self.default_failure_kind = default_failure_kind
        self.failure_status = failure_status
        self.stage = stage
        self.error_shape = error_shape
        # Fail at startup, not at the first failure, if the default kind cannot make an event.
        self._wrap(RuntimeError())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        log = RequestFailureLog()
        log.request_scope = scope
        token = CURRENT_REQUEST_LOG.set(log)
        response_started = False

        async def send_with_report(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
                # Inline, as this runs on every reply: a report goes out when the log holds anything
                # or the app set the header itself (a failure it replies with, not raises), which is
                # scrubbed and fitted too. ASGI header names are lower case.
                headers = message.get("headers", ())
                if type(headers) is not list:  # any other iterable: read it once, and keep it
                    headers = message["headers"] = list(headers)
                if log.observed:
                    message = _with_report_header(message, log)
                else:
                    for name, _ in headers:
                        # ASGI asks for lower-case names, and an app that sets the header itself may
                        # spell it as `FailureHeader.NAME`: two comparisons of bytes, where lowering
                        # every name of every reply would cost the success path 0.06 us.
                        if name in _HEADER_NAMES:
                            message = _with_report_header(message, log)
                            break
                if log.model_operations:
                    message = {**message, "headers": with_model_calls_header(message["headers"], log)}
            await send(message)

        try:
            await self.app(scope, receive, send_with_report)
        except Exception as error:
            if response_started:
                raise
            await self._send_failure(error, log, scope, send)
        finally:
            CURRENT_REQUEST_LOG.reset(token)

    def _wrap(self, error: BaseException) -> NgFailureEvent:
        # The type only, never `str(error)` (see the module's docstring): the reason says so, so that a
        # reader of the reply knows where the message went.
        type_name = exception_type_name(error)
        reason = f"{type_name} raised in the handler (its message is never sent: it may quote the request)"
        failure = NgFailureEvent(
            boundary=self.boundary,
            failure_kind=self.default_failure_kind,
            failure_reason=reason,
            stage=self.stage,
            exception_type=type_name,
        )
        # An explicit cause: the Gym failure under `error`, if any, becomes this failure's cause; else
        # the upstream failure an HTTP status error's reply named (NeMo Gym's `raise_for_status`).
        upstream = status_error_failure(error)
        if upstream is None:
            gym = explicit_gym_cause(error)
            if gym is not None:
                _link_status_errors(gym)
        failure.__cause__ = error if upstream is None else upstream
        return failure

    def _failure_of(self, error: BaseException, log: RequestFailureLog) -> NgFailureEvent:
        """The Gym failure `error` is, or this server's failure wrapping it.

        A task group raises an exception group: a group whose one leaf is a Gym failure is that
        failure (a model-side failure must not become this server's `infrastructure_error`); in a
        larger group, the first Gym leaf is the wrapper's cause and the others are observations. An
        HTTP status error that escaped the handler stands for the upstream failure it names
        (`_escaped_upstream`), alone or as a group's one leaf.
        """
        if isinstance(error, NgFailureEvent):
            return _link_status_errors(error)
        escaped = _escaped_upstream(error)
        if escaped is not None:
            return escaped
        if isinstance(error, BaseExceptionGroup):
            leaves = list(_leaves(error))
            if len(leaves) == 1:
                only = (
                    _link_status_errors(leaves[0])
                    if isinstance(leaves[0], NgFailureEvent)
                    else _escaped_upstream(leaves[0])
                )
                if only is not None:
                    return only
            # A leaf raised `from` a Gym failure carries it, as outside a group; so does a library's
            # status error with the upstream reply's report.
            found = (
                leaf
                if isinstance(leaf, NgFailureEvent)
                else explicit_gym_cause(leaf) or status_error_failure(leaf)
                for leaf in leaves
            )
            gym = [_link_status_errors(failure) for failure in found if failure is not None]
            failure = self._wrap(error)
            if gym:
                failure.__cause__ = gym[0]
                for other in gym[1:]:
                    log.add(other.failure_report().model_copy(update={"failure_id": None}))
            return failure
        return self._wrap(error)

    def _status_of(self, failure: NgFailureEvent) -> int:
        if not callable(self.failure_status):
            return self.failure_status
        try:
            status = self.failure_status(failure)
        except Exception as error:  # a broken status function must not hide the failure
            _log_broken_option("failure_status", error, "replying 500")
            return 500
        return error_status(status) or 500

    def _shape_of(self, scope: Scope) -> ErrorShape:
        if not callable(self.error_shape):
            return self.error_shape
        try:
            shape = self.error_shape(scope)
        except Exception as error:
            _log_broken_option("error_shape", error, "replying in the gym shape")
            return "gym"
        return shape if shape in ERROR_TYPES else "gym"

    async def _send_failure(self, error: Exception, log: RequestFailureLog, scope: Scope, send: Send) -> None:
        """Reply for a request that failed before its response started: the one place that does."""
        failure = self._failure_of(error, log)
        scrubbed = log.reply_report(failure)
        fitted = fit(scrubbed)
        status = self._status_of(failure)
        record_reply(status, scrubbed, fitted)
        # The body names the failure whether or not its event fitted the header.
        event = scrubbed.events[failure.event_id]
        _log_failure(event, error)
        body = error_body(event, status=status, shape=self._shape_of(scope))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode("ascii")),
        ]
        wait = retry_hint_s(failure)
        if wait is not None:
            headers.append((b"retry-after", str(math.ceil(wait)).encode("ascii")))
        if fitted.header_value is not None:
            headers.append((_HEADER_NAME, fitted.header_value.encode("ascii")))
        if log.model_operations:
            headers = with_model_calls_header(headers, log)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _with_report_header(message: Message, log: RequestFailureLog) -> Message:
    """`message` with one report header: the app's own, if it set one, merged with the log's (the
    app's `failure_id` kept), scrubbed and fitted."""
    headers: list[tuple[bytes, bytes]] = []
    report: FailureReport | None = None
    for name, value in message.get("headers", ()):
        if name.lower() == _HEADER_NAME:
            decoded = FailureHeader.decode({FailureHeader.NAME: value.decode("latin-1")})
            if decoded is not None:
                report = decoded if report is None else report.merged(decoded)
        else:
            headers.append((name, value))
    own = log.own_report()
    report = scrub(own if report is None else merged_taking_failure_id(report, own), log.request_secrets())
    fitted = fit(report)
    record_reply(message["status"], report, fitted)
    if fitted.header_value is not None:
        headers.append((_HEADER_NAME, fitted.header_value.encode("ascii")))
    return {**message, "headers": headers}


def _escaped_upstream(error: BaseException) -> NgFailureEvent | None:
    """The upstream failure an HTTP status error that escaped the handler names, or `None`.

    The handler did not handle the failed call, so the reply forwards the upstream failure as
    `raise_boundary_failure` raises it: this server added nothing to it, and its own
    `infrastructure_error` on top would hide a model-side failure. gym-failures' own
    `raise_for_status` error carries the failure (`.failure`, its cause); another library's status
    error (NeMo Gym's `raise_for_status`) is rebuilt from the reply headers it kept.
    """
    carried = getattr(error, "failure", None)
    if isinstance(carried, NgFailureEvent) and error.__cause__ is carried:
        return carried
    return status_error_failure(error, chain=False)


def _link_status_errors(failure: NgFailureEvent) -> NgFailureEvent:
    """`failure`, with the HTTP status error that ends its explicit chain given the upstream failure
    its reply names (`status_error_failure`) as its `__cause__`.

    `raise ResourcesServerFailure(...) from error`, with `error` NeMo Gym's `ClientResponseError`:
    the error holds the upstream reply's report, but no Gym failure is on its chain, so the failure
    would have no cause. Only the chain's last exception can be such an error (a status error with a
    cause of its own keeps it), and the walk stops at a rebuilt failure, whose causes are its report's.
    """
    seen = {id(failure)}
    current: BaseException = failure
    for _ in range(_MAX_LINK_WALK):
        if isinstance(current, NgFailureEvent) and current.remote_report is not None:
            break
        cause = current.__cause__
        if cause is None:
            if not isinstance(current, NgFailureEvent):
                upstream = status_error_failure(current, chain=False)
                if upstream is not None:
                    current.__cause__ = upstream
                    current.__suppress_context__ = True
            break
        if id(cause) in seen:
            break
        seen.add(id(cause))
        current = cause
    return failure


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield error


def _raised_at(error: BaseException) -> str:
    """` at <file>:<line>` of the frame that raised `error`, or "" without a traceback."""
    tb = error.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


def _log_broken_option(option: str, error: BaseException, fallback: str) -> None:
    # Its type and raising frame, never exc_info: a formatted exception's last line is str(error).
    LOGGER.error("%s raised %s%s; %s", option, exception_type_name(error), _raised_at(error), fallback)


def _log_failure(event: FailureEvent, error: BaseException) -> None:
    # Never exc_info: the last line of a formatted exception is str(error), which may quote the request.
    # The raising frame is enough at ERROR; the whole stack (frames only) is there at DEBUG.
    where = _raised_at(error)
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
