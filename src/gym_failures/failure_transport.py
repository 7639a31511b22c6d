"""Carry `FailureReport` data between Gym servers and into Collection's rows.

Flow for one request a Gym server serves (API reference: ``spec/failure_transport.md``):

1. The server middleware opens a `RequestFailureLog` for the request (`RequestFailureLog.capture`).
2. While the request runs, `observe_failure` adds failures that a retry may still recover from (a
   model attempt), `observe_model_operation` a client retry loop's terminal outcome, and
   `observe_reply` the report each reply from another Gym server forwarded.
3. When the request ends, the middleware merges the request's own failure (if it raised) with the log
   (`RequestFailureLog.reply_report`), scrubs and fits the result (`gym_failures.reply`, which owns
   that pipeline) and sends it in the `FailureHeader`; a streamed reply carries it in its terminal
   event under `FailureHeader.STREAM_FIELD`, which a relay reads with `StreamFailureReportReader`.
4. The caller's `raise_boundary_failure` raises the rebuilt failure with separate HTTP details;
   `raise_for_status` keeps the HTTP exception compatibility path. Collection saves the report with
   `FailureReportRow`.

Nothing here that reads a header, a row or a stream raises on bad input: an invalid value is reported
as a report with `omitted=True`, and logged without its content. The `observe_*` functions are no-ops
outside a request and never raise inside one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ValidationError

from gym_failures._header import FailureHeader, log_invalid_report, report_keeping_unknown_kinds
from gym_failures._request_log import ModelOperationObservation, RequestFailureLog
from gym_failures._stream_reader import StreamFailureReportReader
from gym_failures.failure_kinds import UNREGISTERED_KIND_PREFIX
from gym_failures.failure_records import FailureReport, merged_taking_failure_id
from gym_failures.failures import explicit_gym_failure
from gym_failures.reply import reply_report, scrub

__all__ = [
    "LOGGER",
    "UNREGISTERED_KIND_PREFIX",
    "FailureHeader",
    "FailureReportRow",
    "ModelOperationObservation",
    "RequestFailureLog",
    "StreamFailureReportReader",
    "observe_failure",
    "observe_model_operation",
    "observe_reply",
    "observe_report",
    "reply_failure_report",
    "report_for_current_request",
]

LOGGER = logging.getLogger(__name__)

# The reference documents the reader under this private name; the codec's home is `_header`.
_report_keeping_unknown_kinds = report_keeping_unknown_kinds


class FailureReportRow:
    """The row keys under which Collection saves a `FailureReport` beside a rollout's outcome.

    A row that holds a report has all three keys: the events keyed by event id (the wire form), the
    report's `failure_id` (`None` on a success that recovered from failures) and its `omitted` flag.
    A row with some of the keys but not all is read as invalid (`omitted`).
    """

    EVENTS: str = "_ng_failure_events"
    FAILURE_ID: str = "_ng_failure_id"
    OMITTED: str = "_ng_failure_events_omitted"
    KEYS: tuple[str, ...] = (EVENTS, FAILURE_ID, OMITTED)

    @classmethod
    def fields(cls, report: FailureReport) -> dict[str, Any]:
        """`report` as row fields; none for an empty report."""
        if not report.events and not report.omitted:
            return {}
        data = report.model_dump(mode="json")
        return {
            cls.EVENTS: data.get("events", {}),
            cls.FAILURE_ID: report.failure_id,
            cls.OMITTED: report.omitted,
        }

    @classmethod
    def report(cls, row: Mapping[str, Any]) -> FailureReport:
        """The report saved in `row`; an invalid one is reported as omitted, never raised."""
        try:
            present = [key for key in cls.KEYS if key in row]
            if not present:
                return FailureReport()
            if len(present) < len(cls.KEYS):
                # `fields` writes all three keys: a row missing one was changed after it was saved, and
                # a missing `failure_id` would read a failed rollout as a recovered success.
                raise ValueError("a saved report needs all three row keys")
            value = {
                "events": row[cls.EVENTS],
                "failure_id": row[cls.FAILURE_ID],
                "omitted": row[cls.OMITTED],
            }
            return report_keeping_unknown_kinds(value)
        except (ValidationError, ValueError, TypeError, RecursionError) as error:
            log_invalid_report("a saved row", 0, error)
            return FailureReport(omitted=True)

    @classmethod
    def merged_into(cls, row: dict[str, Any], *reports: FailureReport) -> dict[str, Any]:
        """`row` with `reports` merged into its saved report; `row`'s own `failure_id` wins.

        A row without a `failure_id` takes the first one a report has. `row` itself is not changed.
        """
        merged = cls.report(row)
        for report in reports:
            merged = merged_taking_failure_id(merged, report)
        result = {key: value for key, value in row.items() if key not in cls.KEYS}
        result.update(cls.fields(merged))
        return result


def observe_failure(error: BaseException) -> None:
    """Record `error` for the request being served, for example a model attempt a retry may replace."""
    log = RequestFailureLog.current()
    if log is None:
        return
    try:
        failure = explicit_gym_failure(error)
        if failure is not None:
            log.add(failure.failure_report().model_copy(update={"failure_id": None}))
    except Exception:  # observing must never turn a recoverable failure into a crash
        LOGGER.exception("could not observe a failure")


def observe_reply(headers: Mapping[str, str] | None) -> None:
    """Record the report a reply from another Gym server forwarded, success or failure."""
    if RequestFailureLog.current() is not None:  # outside a request there is nothing to decode for
        observe_report(FailureHeader.decode(headers))


def observe_report(report: FailureReport | None) -> None:
    """Record a report already read from a reply (its header, body or stream) for the request being
    served; `None` (no report) is ignored. A client that also rebuilds the reply's failure decodes the
    header once and passes the report here."""
    log = RequestFailureLog.current()
    if log is not None and report is not None:
        log.add(report)


def observe_model_operation(
    operation_id: str,
    outcome: Literal["completed", "failed"],
    final_attempt_id: str | None,
    failure_id: str | None = None,
    http_attempts: int | None = None,
    transport_failures: int | None = None,
    retry_wait_s: float | None = None,
    request_elapsed_ms: float | None = None,
) -> None:
    """Record the client's actual terminal outcome in the existing request observation scope."""
    log = RequestFailureLog.current()
    if log is None:
        return
    try:
        observation = ModelOperationObservation(
            operation_id=operation_id,
            outcome=outcome,
            final_attempt_id=final_attempt_id,
            failure_id=failure_id,
            http_attempts=http_attempts,
            transport_failures=transport_failures,
            retry_wait_s=retry_wait_s,
            request_elapsed_ms=request_elapsed_ms,
        )
    except ValidationError as error:
        log_invalid_report(
            "a model operation observation", 0, error, frozenset(ModelOperationObservation.model_fields)
        )
        return
    log.add_model_operation(observation)


def reply_failure_report(error: BaseException) -> FailureReport | None:
    """`error`'s explicit cause chain for the reply beside its `EpisodeFailure`; `None` without events.

    The producer keeps its kind, reason, terminality and stage on the failure; a cause's kind stays on
    its event. This is the failure's own chain only (`report_for_current_request` adds the request's
    observations), scrubbed as every report that leaves a server is.
    """
    failure = explicit_gym_failure(error)
    if failure is None:
        return None
    log = RequestFailureLog.current()
    return scrub(failure.failure_report(), [] if log is None else log.request_secrets())


def report_for_current_request(error: BaseException | None) -> FailureReport:
    """Project the explicit Gym cause chain, preserving its origin IDs.

    The reference's name for `gym_failures.reply.reply_report`: inside a request, the log's
    observations are merged in and the request's own secrets scrubbed from every text; outside one the
    result is `error`'s own chain, or an empty report.
    """
    return reply_report(error)
