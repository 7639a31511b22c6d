"""Reading a reply from another Gym server: observe its failure report and raise the failure it names.

A failed reply's body is read up to 64 KiB (the whole body when the client already read it, cut) and
kept as `.content` by `raise_for_status`; its excerpt is the first 512 characters, redacted.

`status_error_failure` reads the same facts from a library's own status error, raised by code that
never called these helpers: `aiohttp`'s `raise_for_status()`, and NeMo Gym's `raise_for_status`
(nemo_gym/server_utils.py:655), whose `ClientResponseError` keeps the reply's headers (the report)
and its body (`response_content`). The server middleware rebuilds a handler's upstream failure with it,
so such call sites keep the cause chain unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from gym_failures import _http_status
from gym_failures.client._calls import reply_outcome
from gym_failures.client._libraries import library_of, reply_library
from gym_failures.client._library_types import HttpLibrary, Reply
from gym_failures.failure_kinds import (
    AGENT_REQUEST_FAILED,
    COLLECTION_DISPATCH_FAILED,
    ENVIRONMENT_SERVER_FAILED,
    INFRASTRUCTURE_ERROR,
    MODEL_REQUEST_ERROR,
    PROVIDER_REQUEST_FAILED,
    VERIFIER_ERROR,
    FailureStage,
)
from gym_failures.failure_records import FailureBoundary, FailureReport
from gym_failures.failure_transport import FailureHeader, observe_report
from gym_failures.failures import (
    MAX_RETRY_AFTER_S,
    HttpDetails,
    NgFailureEvent,
    bounded_text,
    failure_type_for,
    rebuild_failure,
)
from gym_failures.redaction import redact, url_without_secrets
from gym_failures.telemetry import record_remote_failure

if TYPE_CHECKING:
    import aiohttp
    import httpx
    import httpx2

    Response = aiohttp.ClientResponse | httpx.Response | httpx2.Response
    """A reply of each library the helpers read (`_libraries.MODULE_BY_LIBRARY`), as `reply_library` takes."""

__all__ = [
    "DEFAULT_KIND_BY_BOUNDARY",
    "MAX_CONTENT",
    "MAX_EXCERPT",
    "body_excerpt",
    "raise_boundary_failure",
    "raise_for_status",
    "remote_failure",
    "reply_failure",
    "retry_after_s",
    "status_error_failure",
]

MAX_EXCERPT = 512
MAX_CONTENT = 64 * 1024

DEFAULT_KIND_BY_BOUNDARY: Mapping[FailureBoundary, str] = {
    FailureBoundary.MODEL: MODEL_REQUEST_ERROR,
    FailureBoundary.RESOURCES_SERVER: VERIFIER_ERROR,
    FailureBoundary.SANDBOX: PROVIDER_REQUEST_FAILED,
    FailureBoundary.AGENT: AGENT_REQUEST_FAILED,
    FailureBoundary.ENVIRONMENT: ENVIRONMENT_SERVER_FAILED,
    FailureBoundary.HARNESS: INFRASTRUCTURE_ERROR,
    FailureBoundary.COLLECTION: COLLECTION_DISPATCH_FAILED,
}
"""The kind of a failure built from the caller's own evidence (a failed reply without a report),
by the boundary called. `model_request_error` is HTTP-shaped: classification refines it by status."""


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The wait a `Retry-After` header asks for, in seconds (delta-seconds or an HTTP date), bounded to
    0-`MAX_RETRY_AFTER_S`: a peer's number is not trusted to fit a float or a sleep. A sub-second
    `retry-after-ms` (milliseconds, as OpenAI's and Anthropic's APIs send it) is read first, as their
    SDKs read it; one that is no finite number of at least 0 is ignored."""
    milliseconds = _retry_after_ms(headers.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds
    value = headers.get("Retry-After")
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # "²".isdigit() is true too
        digits = value.lstrip("0") or "0"
        # Past the bound at 10 digits: never convert a peer's long digit string (a 400-digit number,
        # a date in the year 10**20 below, is a hostile or broken peer's, read as the bound).
        return min(float(digits), MAX_RETRY_AFTER_S) if len(digits) < 10 else MAX_RETRY_AFTER_S
    try:
        when = parsedate_to_datetime(value)
        wait = when.timestamp() - time.time()
    except (TypeError, ValueError, OverflowError):
        return None
    return min(max(0.0, wait), MAX_RETRY_AFTER_S)


def _retry_after_ms(value: str | None) -> float | None:
    """`retry-after-ms` in seconds, bounded; None when it is absent or no number of at least 0."""
    if value is None:
        return None
    text = value.strip()
    # A decimal number only: float() would also take "nan", "inf", "1e400" and "1_0".
    whole, dot, fraction = text.partition(".")
    if not (whole or fraction) or not (whole + fraction).isascii() or not (whole + fraction).isdigit():
        return None
    whole = whole.lstrip("0") or "0"
    if len(whole) >= 12:  # past the bound in seconds: never convert a peer's long digit string
        return MAX_RETRY_AFTER_S
    return min(float(f"{whole}{dot}{fraction[:9]}") / 1000, MAX_RETRY_AFTER_S)


def body_excerpt(body: str) -> str:
    """The part of a failed reply's body kept as evidence: its first `MAX_EXCERPT` characters, redacted
    before the cut (only a bounded head is redacted: the body can be 64 KiB) and cut with the mark, so
    a later scrub with more secrets (the collector's) sees where a secret was cut through."""
    return bounded_text(redact(body[: 4 * MAX_EXCERPT]), MAX_EXCERPT)


async def _content(library: HttpLibrary, response: object) -> bytes:
    """The reply's body, at most `MAX_CONTENT` bytes: a failed reply's body is evidence, not data, and
    a peer can send one without end."""
    try:
        return await library.read_body(response, MAX_CONTENT)
    except Exception:  # the body broke off: the status is still the evidence
        return b""


async def _failure_for(
    library: HttpLibrary,
    response: object,
    *,
    boundary: FailureBoundary | str,
    failure_kind: str | None,
    stage: FailureStage | None,
    operation: str | None,
    operation_id: str | None,
    attempt_id: str | None,
    report: FailureReport | None,
) -> tuple[NgFailureEvent, bytes]:
    """The failure a failed reply names (rebuilt from its report, or else from the caller's own
    evidence, as the class of `boundary`), with the HTTP exchange apart in `http_details`."""
    status, headers, method, url = library.reply(response)
    content = await _content(library, response)
    safe_url = url_without_secrets(url)
    excerpt = body_excerpt(content.decode("utf-8", "replace"))
    details = HttpDetails(
        method=method,
        url=safe_url,
        status=status,
        body_excerpt=excerpt,
        retry_after_s=retry_after_s(headers),
        delivery="answered",
    )
    failure = reply_failure(
        report,
        details,
        boundary=boundary,
        failure_kind=failure_kind,
        stage=stage,
        operation=operation,
        operation_id=operation_id,
        attempt_id=attempt_id,
    )
    return failure, content


def remote_failure(report: FailureReport | None) -> NgFailureEvent | None:
    """The remote failure `report` names, rebuilt; `None` without one. The one place the client
    helpers rebuild a remote failure, from a reply's header or a stream's terminal event."""
    failure = None if report is None else rebuild_failure(report)
    if failure is not None and report is not None:
        record_remote_failure(report)
    return failure


def reply_failure(
    report: FailureReport | None,
    details: HttpDetails,
    *,
    boundary: FailureBoundary | str,
    failure_kind: str | None = None,
    stage: FailureStage | None = None,
    operation: str | None = None,
    operation_id: str | None = None,
    attempt_id: str | None = None,
) -> NgFailureEvent:
    """The failure a failed reply names: rebuilt from its `report`, or else built from the caller's
    own evidence as the class of `boundary`; the HTTP exchange (`details`) kept in `http_details`."""
    failure = remote_failure(report)
    if failure is None:
        called = FailureBoundary(boundary)
        status = details.status
        # The class of the boundary called, as `rebuild_failure` picks it, so `except ModelFailure`
        # catches a model server's failure whether or not its reply had a report.
        failure = failure_type_for(called)(
            boundary=called,
            failure_kind=failure_kind or DEFAULT_KIND_BY_BOUNDARY[called],
            failure_reason=f"{details.method} {details.url} answered {status} without a failure report",
            http_status=_http_status.http_status(status),
            stage=stage,
            operation=operation,
            operation_id=operation_id,
            attempt_id=attempt_id,
        )
    failure.http_details = details
    return failure


_MAX_STATUS_ERROR_CHAIN = 16


def status_error_failure(error: BaseException, *, chain: bool = True) -> NgFailureEvent | None:
    """The remote failure an HTTP library's own status error names, rebuilt (same event id, kind,
    boundary, stage and causes), or `None`.

    `error` is an `aiohttp.ClientResponseError` (from `response.raise_for_status()` or NeMo Gym's
    `raise_for_status`) or an httpx/httpx2 `HTTPStatusError`, or, with `chain`, an exception raised
    `from` one (the nearest on its explicit `__cause__` chain is read). Its reply's report is
    observed into the current request's log, as `raise_for_status` observes a reply's; the exchange
    goes in `http_details`: method, URL without secrets, status, the redacted excerpt of the body the
    error kept, `Retry-After`. The request's headers, which the error also holds, are never read.
    `None` when no status error is on the chain, when its reply carried no report (or an omitted one,
    which is still observed), and for this package's own status errors, which carry their failure
    already (`.failure`).
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < _MAX_STATUS_ERROR_CHAIN:
        seen.add(id(current))
        if isinstance(current, NgFailureEvent) or isinstance(
            getattr(current, "failure", None), NgFailureEvent
        ):
            return None  # a Gym failure is on the chain already
        library = library_of(current)
        read = None if library is None else library.status_error_reply(current)
        if read is not None:
            return _status_error_failure(*read)
        current = current.__cause__ if chain else None
    return None


def _status_error_failure(reply: Reply, content: bytes) -> NgFailureEvent | None:
    status, headers, method, url = reply
    report = FailureHeader.decode(headers)
    observe_report(report)
    failure = remote_failure(report)
    if failure is not None:
        failure.http_details = HttpDetails(
            method=method,
            url=url_without_secrets(url),
            status=status,
            body_excerpt=body_excerpt(content[:MAX_CONTENT].decode("utf-8", "replace")),
            retry_after_s=retry_after_s(headers),
            delivery="answered",
        )
    return failure


def _observed(response: Response) -> tuple[HttpLibrary, int, FailureReport | None]:
    """`response`'s library, status and report, the report observed into the current request's log
    (success or failure): what both raising helpers do first."""
    library = reply_library(response)
    status, headers, _, _ = library.reply(response)
    report = FailureHeader.decode(headers)
    observe_report(report)
    return library, status, report


async def raise_boundary_failure(
    response: Response,
    *,
    boundary: FailureBoundary | str = FailureBoundary.AGENT,
    failure_kind: str | None = None,
    stage: FailureStage | None = None,
    operation: str | None = None,
    operation_id: str | None = None,
    attempt_id: str | None = None,
) -> None:
    """Observe `response`'s report; on a non-2xx reply raise the remote failure it names.

    `boundary` is the boundary called (a model server: `"model"`); with `failure_kind`, `stage`,
    `operation`, `operation_id` and `attempt_id` it describes the caller's own failure, raised when the
    reply carries no report.
    """
    library, status, report = _observed(response)
    if _http_status.is_success(status):
        # A success whose own report names a failure was built on a call that ended in it.
        reply_outcome(report if report is not None and report.failure_id is not None else None)
        return
    failure, _ = await _failure_for(
        library,
        response,
        boundary=boundary,
        failure_kind=failure_kind,
        stage=stage,
        operation=operation,
        operation_id=operation_id,
        attempt_id=attempt_id,
        report=report,
    )
    reply_outcome(failure)
    raise failure


async def raise_for_status(
    response: Response,
    *,
    boundary: FailureBoundary | str = FailureBoundary.AGENT,
    failure_kind: str | None = None,
    stage: FailureStage | None = None,
) -> None:
    """Observe `response`'s report; on a 4xx/5xx raise the library's own HTTP error type, carrying the
    rebuilt failure (`.failure`, also its `__cause__`) and the reply's content (`.content`)."""
    library, status, report = _observed(response)
    if not _http_status.is_failed_reply(status):
        reply_outcome(report if report is not None and report.failure_id is not None else None)
        return
    failure, content = await _failure_for(
        library,
        response,
        boundary=boundary,
        failure_kind=failure_kind,
        stage=stage,
        operation=None,
        operation_id=None,
        attempt_id=None,
        report=report,
    )
    reply_outcome(failure)
    raise library.status_error(response, failure, content) from failure
