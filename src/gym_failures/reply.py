"""The failure report a server's reply carries: built, scrubbed, fitted and encoded, in one place.

Every report a Gym server sends passes through here, whoever sends it: the middleware (a failure
reply, a success reply whose request observed failures, a report header the app set itself), a
stream's terminal event (`stream_failure_field`), and a handler that replies with a failure without
raising it, such as a 429 that must stay a 429 (`reply_headers`):

    build   the request's own failure chain (the error it raised, if any) merged with the request's
            log (`RequestFailureLog.reply_report`)
    scrub   the request's own credential values (its credential headers, cookies and query values)
            removed from every free-text field (`FailureEvent.TEXT_FIELDS`): a producer's reason may
            quote the request
    fit     within `FailureHeader.MAX_BYTES`: past the bound, the reply's own failure chain is kept,
            marked omitted, and the observations are left out, so the caller can still rebuild the
            failure with its origin id; a chain that alone is too large is sent as `{"omitted": true}`
    encode  the `X-NG-Failure-Report` header value, or the terminal stream event's field

Servers without the middleware pass the request's ASGI scope (`scope=request.scope`) to these
functions, so the request's credentials are known to the scrub as the middleware knows them.

Scrubbing lives in `gym_failures._scrub` (re-exported here as `scrub`), below both this module and the
per-request log, which scrubs the report it hands over (`RequestFailureLog.reply_report`).

A record an app builds and serializes itself, outside these helpers, scrubs itself of the same
values (`gym_failures._request_context`), with the same function (`scrub_text`).

`reply_report` is the report after scrubbing, before fitting: what a reply's body carries
(`BaseEpisodeResponse.failure_report` has no header to fit); `episode_response` builds that whole
body, its `EpisodeFailure` reason scrubbed the same way. `reply_headers` and
`stream_failure_field` are the whole pipeline. The middleware composes `scrub` and `fit` itself only
because it also needs the scrubbed event for its reply's body.

The other names that make a report are narrower and say so: `NgFailureEvent.failure_report()` is one
failure's own chain, `reply_failure_report` that chain for the body beside an `EpisodeFailure`, and
`report_for_current_request` is the reference's name for `reply_report`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from gym_failures._header import OMITTED_HEADER_VALUE, FailureHeader
from gym_failures._request_log import RequestFailureLog
from gym_failures._scrub import scrub
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure, FailureEvent, FailureReport
from gym_failures.failures import NgFailureEvent

__all__ = [
    "FittedReport",
    "episode_response",
    "fit",
    "own_chain",
    "reply_headers",
    "reply_report",
    "scrub",
    "stream_failure_field",
]


class FittedReport(NamedTuple):
    """A report as it is sent: the events that fit the header's bound, and the header's value."""

    report: FailureReport
    header_value: str | None
    """The `X-NG-Failure-Report` value; `None` when the report holds nothing to send."""


def reply_report(
    error: BaseException | None = None,
    *,
    log: RequestFailureLog | None = None,
    scope: Mapping[str, Any] | None = None,
) -> FailureReport:
    """The report of the reply being sent: `error`'s explicit chain (the request's own failure, if it
    failed) and the observations of the request's log (default: the current one), scrubbed of the
    request's own secrets and the registered ones. Not fitted to the header's bound.

    A server without the middleware passes the request's ASGI `scope` (Starlette: `request.scope`), so
    the request's credentials are known; with neither a log nor a scope, only the registered secrets
    and credential shapes are removed."""
    if log is None:
        log = RequestFailureLog.current()
    if log is None:
        log = RequestFailureLog()
        log.request_scope = scope
    return log.reply_report(error)


def reply_headers(
    error: BaseException | None = None, *, scope: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The report header for the reply being sent (`error`: the failure it replies with, if any):
    built, scrubbed and fitted as the middleware does; `{}` when there is nothing to send. `scope`:
    see `reply_report`."""
    value = fit(reply_report(error, scope=scope)).header_value
    return {} if value is None else {FailureHeader.NAME: value}


def stream_failure_field(
    error: BaseException | None = None, *, scope: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`{STREAM_FIELD: report}` for the reply being streamed (with `error`, if the stream failed), to
    merge into the payload of the stream's terminal event; `{}` when there is nothing to send.
    `scope`: see `reply_report`."""
    value = FailureHeader.stream_value(fit(reply_report(error, scope=scope)).report)
    return {} if value is None else {FailureHeader.STREAM_FIELD: value}


def episode_response(
    *,
    result: dict[str, Any] | None = None,
    failure: NgFailureEvent | None = None,
    terminal: bool = False,
    scope: Mapping[str, Any] | None = None,
) -> BaseEpisodeResponse:
    """The body an environment server replies with for one episode attempt: `result` (it ran to a
    verdict) or `failure` (it did not; `terminal` says a retry cannot help), with the attempt's
    report beside it. Every text in it is scrubbed as a header is. `scope`: see `reply_report`."""
    report = reply_report(failure, scope=scope)
    if failure is None:
        carried = report if report.events or report.omitted else None
        return BaseEpisodeResponse(result=result, failure_report=carried)
    event = report.events[failure.event_id]
    episode_failure = EpisodeFailure(
        failure_kind=failure.failure_kind,
        failure_reason=event.failure_reason,
        stage=failure.stage,
        terminal=terminal,
    )
    return BaseEpisodeResponse(failure=episode_failure, failure_report=report)


def fit(report: FailureReport) -> FittedReport:
    """`report` within the header's bound: whole when it fits, else its own failure chain marked
    omitted (the observations go first), else `{"omitted": true}`."""
    value = FailureHeader.encode(report).get(FailureHeader.NAME)
    if value != OMITTED_HEADER_VALUE or not report.events:
        return FittedReport(report, value)
    own = own_chain(report)
    if own is None:
        return FittedReport(FailureReport(omitted=True), value)
    trimmed = FailureReport.model_construct(events=own.events, failure_id=own.failure_id, omitted=True)
    return FittedReport(trimmed, FailureHeader.encode(trimmed)[FailureHeader.NAME])


def own_chain(report: FailureReport) -> FailureReport | None:
    """`report`'s own failure and its causes, or `None` when it has no failure."""
    events: dict[str, FailureEvent] = {}
    event_id = report.failure_id
    while event_id is not None and event_id in report.events and event_id not in events:
        events[event_id] = report.events[event_id]
        event_id = report.events[event_id].cause_id
    if not events:
        return None
    return FailureReport.model_construct(events=events, failure_id=report.failure_id, omitted=False)
