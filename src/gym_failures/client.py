"""Caller side: rebuild the failure another Gym server replied with, map transport errors, retry model calls.

Works with an aiohttp `ClientResponse` and an httpx `Response`; each library is imported only if it
is installed (extras `gym-failures[aiohttp]`, `gym-failures[httpx]`).

- `raise_boundary_failure(response, boundary=...)` observes the reply's report into the current request
  log (success or failure) and, on a non-2xx reply, raises the rebuilt remote failure (same event id,
  kind, boundary, stage and causes) with the HTTP exchange kept apart in `failure.http_details`. A
  failed reply without a report raises a failure built from the caller's own evidence: the status is
  recorded as `http_status`, never turned into a kind (classification projects it when reporting).
- `raise_for_status(response)` is the compatibility path: on a 4xx/5xx it raises what the library's
  own `raise_for_status` would (`aiohttp.ClientResponseError`, `httpx.HTTPStatusError`), so existing
  `except` blocks keep working, carrying `.failure` and `.content`.
- `map_transport_errors(boundary, ...)` turns connection, reset, timeout and DNS errors into Gym
  failures of the transport kinds, raised `from` the original exception.
- `retry_model_call(call, ...)` runs a model call with finite attempts and a total time budget,
  recording each failed attempt (`observe_failure`) and the terminal outcome (`observe_model_operation`).

Outside a Gym server request there is no log to observe into; a caller that wants the observations
(collection does) opens one with `RequestFailureLog.capture()`.

Decisions:
- Retry policy: a request never sent (connection refused, DNS, connect timeout) is retried; a reply of
  429 or 503 (the server says it did not process the request) is retried; a timeout or a dropped
  connection after sending, or a 408/500/502/504, may have been delivered and is retried only when the
  call site passes `replay_safe=True`; anything else is final. `Retry-After` is honoured when it fits in
  the remaining budget; when it does not, the failure is final at once rather than retried early.
- A failed reply's body is read up to 64 KiB (the whole body when the client already read it, cut),
  kept as `.content` by `raise_for_status`; its excerpt is the first 512 characters, redacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, TypeVar

from gym_failures._redact import redact, url_without_secrets
from gym_failures.failure_kinds import (
    AGENT_REQUEST_FAILED,
    COLLECTION_DISPATCH_FAILED,
    ENVIRONMENT_SERVER_FAILED,
    INFRASTRUCTURE_ERROR,
    MODEL_REQUEST_ERROR,
    PROVIDER_REQUEST_FAILED,
    TRANSPORT_LOCAL_RESOURCE,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_UNREACHABLE,
    VERIFIER_ERROR,
    FailureStage,
)
from gym_failures.failure_records import FailureBoundary, FailureReport
from gym_failures.failure_transport import (
    FailureHeader,
    observe_failure,
    observe_model_operation,
    observe_report,
)
from gym_failures.failures import (
    HttpDetails,
    NgFailureEvent,
    exception_type_name,
    failure_type_for,
    new_event_id,
    rebuild_failure,
)

try:
    import aiohttp
except ImportError:  # pragma: no cover - the extra is not installed
    aiohttp = None  # type: ignore[assignment]
try:
    import httpx
except ImportError:  # pragma: no cover - the extra is not installed
    httpx = None  # type: ignore[assignment]

if TYPE_CHECKING:
    Response = aiohttp.ClientResponse | httpx.Response

__all__ = [
    "DEFAULT_KIND_BY_BOUNDARY",
    "GymClientResponseError",
    "GymHTTPStatusError",
    "map_transport_errors",
    "raise_boundary_failure",
    "raise_for_status",
    "retry_model_call",
]

T = TypeVar("T")

_MAX_EXCERPT = 512
_MAX_CONTENT = 64 * 1024

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


# --- Reading a reply ---------------------------------------------------------------------------


def _facts(response: Any) -> tuple[int, Mapping[str, str], str, str]:
    """Status, headers, method and URL of an aiohttp or httpx response."""
    if aiohttp is not None and isinstance(response, aiohttp.ClientResponse):
        return response.status, response.headers, response.method, str(response.url)
    if httpx is not None and isinstance(response, httpx.Response):
        request = response.request
        return response.status_code, response.headers, request.method, str(request.url)
    raise TypeError(f"not an aiohttp or httpx response: {type(response).__name__}")


async def _content(response: Any) -> bytes:
    """The reply's body, at most `_MAX_CONTENT` bytes: a failed reply's body is evidence, not data, and
    a peer can send one without end.

    A body within the bound stays readable afterwards (`await response.read()` / `aread()` return it,
    as before this call); only the stream of a body over the bound is left consumed.
    """
    try:
        if aiohttp is not None and isinstance(response, aiohttp.ClientResponse):
            # aiohttp keeps a body read by `read()` in `_body`, and has no public way to ask for it
            # or to hand it one: the private attribute is the cache `read()` itself uses.
            body: bytes | None = getattr(response, "_body", None)
            if body is not None:
                return body[:_MAX_CONTENT]
            length = response.content_length
            if length is not None and length <= _MAX_CONTENT:
                return await response.read()
            chunks = bytearray()
            while len(chunks) <= _MAX_CONTENT:
                chunk = await response.content.read(_MAX_CONTENT + 1 - len(chunks))
                if not chunk:
                    response._body = bytes(chunks)  # the whole body: keep it readable
                    return bytes(chunks)
                chunks += chunk
            return bytes(chunks[:_MAX_CONTENT])
        try:
            return bytes(response.content[:_MAX_CONTENT])
        except httpx.ResponseNotRead:
            length_header = response.headers.get("content-length", "")
            if length_header.isascii() and length_header.isdigit() and int(length_header) <= _MAX_CONTENT:
                return bytes(await response.aread())
            chunks = bytearray()
            async for chunk in response.aiter_bytes():
                chunks += chunk
                if len(chunks) > _MAX_CONTENT:
                    await response.aclose()
                    return bytes(chunks[:_MAX_CONTENT])
            response._content = bytes(chunks)  # the whole body: keep it readable, as `aread()` does
            return bytes(chunks)
    except Exception:  # the body broke off: the status is still the evidence
        return b""


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # "²".isdigit() is true too
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _failure_class(boundary: FailureBoundary | str) -> type[NgFailureEvent]:
    """The exception class of `boundary` (`ModelFailure` for "model"), as `rebuild_failure` picks it,
    so `except ModelFailure` catches a model server's failure whether or not its reply had a report."""
    return failure_type_for(boundary)


async def _failure_for(
    response: Any,
    *,
    boundary: FailureBoundary | str,
    failure_kind: str | None,
    stage: FailureStage | None,
    operation: str | None,
    operation_id: str | None,
    attempt_id: str | None,
    report: FailureReport | None,
) -> tuple[NgFailureEvent, bytes]:
    status, headers, method, url = _facts(response)
    content = await _content(response)
    safe_url = url_without_secrets(url)
    excerpt = redact(content[: 4 * _MAX_EXCERPT].decode("utf-8", "replace"))[:_MAX_EXCERPT]
    details = HttpDetails(
        method=method,
        url=safe_url,
        status=status,
        body_excerpt=excerpt,
        retry_after_s=_retry_after(headers),
        delivery="answered",
    )
    failure = rebuild_failure(report) if report is not None else None
    if failure is None:
        called = FailureBoundary(boundary)
        failure = _failure_class(called)(
            boundary=called,
            failure_kind=failure_kind or DEFAULT_KIND_BY_BOUNDARY[called],
            failure_reason=f"{method} {safe_url} answered {status} without a failure report",
            http_status=status if 100 <= status <= 599 else None,
            stage=stage,
            operation=operation,
            operation_id=operation_id,
            attempt_id=attempt_id,
        )
    failure.http_details = details
    return failure, content


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
    status, headers, _, _ = _facts(response)
    report = FailureHeader.decode(headers)
    observe_report(report)
    if 200 <= status < 300:
        return
    failure, _ = await _failure_for(
        response,
        boundary=boundary,
        failure_kind=failure_kind,
        stage=stage,
        operation=operation,
        operation_id=operation_id,
        attempt_id=attempt_id,
        report=report,
    )
    raise failure


if aiohttp is not None:

    class GymClientResponseError(aiohttp.ClientResponseError):
        """`aiohttp.ClientResponseError` carrying the rebuilt Gym failure and the reply's content."""

        def __init__(self, response: aiohttp.ClientResponse, failure: NgFailureEvent, content: bytes):
            super().__init__(
                response.request_info,
                response.history,
                status=response.status,
                message=response.reason or "",
                headers=response.headers,
            )
            self.failure = failure
            self.content = content

        def __str__(self) -> str:
            # aiohttp's own text repeats the URL with its query string, which can carry a token.
            url = self.failure.http_details.url if self.failure.http_details else ""
            return f"{self.status}, message={self.message!r}, url={url!r}, failure={self.failure}"

        def __repr__(self) -> str:
            return f"<GymClientResponseError {self}>"


if httpx is not None:

    class GymHTTPStatusError(httpx.HTTPStatusError):
        """`httpx.HTTPStatusError` carrying the rebuilt Gym failure and the reply's content."""

        def __init__(self, response: httpx.Response, failure: NgFailureEvent, content: bytes):
            url = failure.http_details.url if failure.http_details else ""
            super().__init__(
                f"{response.status_code} {response.reason_phrase} for url {url!r}: {failure}",
                request=response.request,
                response=response,
            )
            self.failure = failure
            self.content = content


async def raise_for_status(
    response: Response,
    *,
    boundary: FailureBoundary | str = FailureBoundary.AGENT,
    failure_kind: str | None = None,
    stage: FailureStage | None = None,
) -> None:
    """Observe `response`'s report; on a 4xx/5xx raise the library's own HTTP error type, carrying the
    rebuilt failure (`.failure`, also its `__cause__`) and the reply's content (`.content`)."""
    status, headers, _, _ = _facts(response)
    report = FailureHeader.decode(headers)
    observe_report(report)
    if status < 400:
        return
    failure, content = await _failure_for(
        response,
        boundary=boundary,
        failure_kind=failure_kind,
        stage=stage,
        operation=None,
        operation_id=None,
        attempt_id=None,
        report=report,
    )
    error: Exception
    if aiohttp is not None and isinstance(response, aiohttp.ClientResponse):
        error = GymClientResponseError(response, failure, content)
    else:
        assert httpx is not None
        assert isinstance(response, httpx.Response)
        error = GymHTTPStatusError(response, failure, content)
    raise error from failure


# --- Transport errors --------------------------------------------------------------------------

_LOCAL_RESOURCE_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL}
)


def _transport_kind(error: BaseException) -> tuple[str, str] | None:
    """(kind, delivery) for a transport error, or None for anything else."""
    if isinstance(error, OSError) and error.errno in _LOCAL_RESOURCE_ERRNOS:
        return TRANSPORT_LOCAL_RESOURCE, "not_sent"
    if httpx is not None:
        if isinstance(error, httpx.ConnectTimeout | httpx.PoolTimeout):
            return TRANSPORT_TIMEOUT, "not_sent"
        if isinstance(error, httpx.TimeoutException):
            return TRANSPORT_TIMEOUT, "unknown"
        if isinstance(error, httpx.ConnectError):
            return TRANSPORT_UNREACHABLE, "not_sent"
        if isinstance(error, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
            return TRANSPORT_PEER_DROP, "unknown"
    if aiohttp is not None:
        if isinstance(error, aiohttp.ClientConnectorError):
            if error.os_error.errno in _LOCAL_RESOURCE_ERRNOS:
                return TRANSPORT_LOCAL_RESOURCE, "not_sent"
            return TRANSPORT_UNREACHABLE, "not_sent"
        if isinstance(error, aiohttp.ConnectionTimeoutError):
            return TRANSPORT_TIMEOUT, "not_sent"
        if isinstance(error, aiohttp.ServerTimeoutError):
            return TRANSPORT_TIMEOUT, "unknown"
        if isinstance(error, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
            return TRANSPORT_PEER_DROP, "unknown"
        if isinstance(error, aiohttp.ClientOSError):
            return TRANSPORT_PEER_DROP, "unknown"
    if isinstance(error, TimeoutError):
        return TRANSPORT_TIMEOUT, "unknown"
    if isinstance(error, ConnectionRefusedError):
        return TRANSPORT_UNREACHABLE, "not_sent"
    if isinstance(error, ConnectionError):
        return TRANSPORT_PEER_DROP, "unknown"
    return None


@contextlib.contextmanager
def map_transport_errors(
    boundary: FailureBoundary | str,
    *,
    method: str = "",
    url: str = "",
    stage: FailureStage | None = None,
    operation: str | None = None,
    operation_id: str | None = None,
    attempt_id: str | None = None,
) -> Iterator[None]:
    """Raise a transport error inside the block as a Gym failure of `boundary`, `from` the error.

    The reason names the error's type, its errno and the URL without secrets; it never quotes the
    error's text, which can repeat the request.
    """
    try:
        yield
    except NgFailureEvent:
        raise
    except Exception as error:
        mapped = _transport_kind(error)
        if mapped is None:
            raise
        kind, delivery = mapped
        safe_url = url_without_secrets(url)
        code = getattr(error, "errno", None)
        if code is None and aiohttp is not None and isinstance(error, aiohttp.ClientConnectorError):
            code = error.os_error.errno
        cause = exception_type_name(error) + (
            f" [{errno.errorcode.get(code, code)}]" if isinstance(code, int) else ""
        )
        target = f"{method} {safe_url}".strip()
        failure = _failure_class(boundary)(
            boundary=boundary,
            failure_kind=kind,
            failure_reason=f"{target}: {cause}" if target else cause,
            stage=stage,
            operation=operation,
            operation_id=operation_id,
            attempt_id=attempt_id,
            exception_type=exception_type_name(error),
        )
        failure.http_details = HttpDetails(method=method, url=safe_url, delivery=delivery)  # type: ignore[arg-type]
        raise failure from error


# --- Retrying model calls ----------------------------------------------------------------------

_RETRY_WHEN_ANSWERED = frozenset({429, 503})
_RETRY_WHEN_REPLAY_SAFE = frozenset({408, 500, 502, 504})


def _retryable(failure: NgFailureEvent, replay_safe: bool) -> bool:
    details = failure.http_details
    if details is None:
        return False  # a failure the call raised itself: the same request fails the same way
    if details.delivery == "not_sent":
        return True
    if details.delivery == "unknown":
        return replay_safe
    if details.status in _RETRY_WHEN_ANSWERED:
        return True
    return replay_safe and details.status in _RETRY_WHEN_REPLAY_SAFE


async def retry_model_call(
    call: Callable[[str], Awaitable[T]],
    *,
    operation_id: str | None = None,
    max_attempts: int = 3,
    budget_s: float = 60.0,
    replay_safe: bool = False,
    backoff_s: float = 0.25,
    max_backoff_s: float = 8.0,
    boundary: FailureBoundary | str = FailureBoundary.MODEL,
) -> T:
    """Run `call(attempt_id)` until it returns, at most `max_attempts` times within `budget_s` seconds.

    `call` raises Gym failures (use `raise_boundary_failure` and `map_transport_errors` inside it);
    any other exception propagates at once. Each failed attempt is recorded with `observe_failure`,
    the terminal outcome with `observe_model_operation`; the last failure is raised. An attempt still
    running when the budget ends is cancelled and fails as `transport_timeout`.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if not budget_s > 0:
        raise ValueError("budget_s must be positive")
    operation_id = operation_id or new_event_id()
    started = time.monotonic()
    deadline = started + budget_s
    waited = 0.0
    transport_failures = 0
    attempt_id = ""

    def finish(outcome: str, failure: NgFailureEvent | None, attempts: int) -> None:
        observe_model_operation(
            operation_id,
            "completed" if outcome == "completed" else "failed",
            attempt_id,
            failure_id=None if failure is None else failure.event_id,
            http_attempts=attempts,
            transport_failures=transport_failures,
            retry_wait_s=round(waited, 6),
            request_elapsed_ms=round((time.monotonic() - started) * 1000, 3),
        )

    for attempt in range(1, max_attempts + 1):
        attempt_id = f"{operation_id}.{attempt}"
        budget = asyncio.timeout_at(_loop_deadline(deadline))
        try:
            async with budget:
                result = await call(attempt_id)
        except TimeoutError as error:
            # Ask the timeout, not the clock: a loop's timer may fire a little before `deadline` on
            # time.monotonic (uvloop's clock has millisecond steps).
            if not budget.expired():
                raise  # not our budget: the call's own timeout, not a Gym failure
            failure = _failure_class(boundary)(
                boundary=boundary,
                failure_kind=TRANSPORT_TIMEOUT,
                failure_reason=f"model call {operation_id} exceeded its {budget_s:g} s budget",
                operation_id=operation_id,
                attempt_id=attempt_id,
                exception_type=exception_type_name(error),
            )
            failure.http_details = HttpDetails(method="", url="", delivery="unknown")
            transport_failures += 1
            observe_failure(failure)
            finish("failed", failure, attempt)
            raise failure from error
        except NgFailureEvent as failure:
            observe_failure(failure)
            details = failure.http_details
            if details is not None and details.delivery != "answered":
                transport_failures += 1
            remaining = deadline - time.monotonic()
            wait = _wait_before_retry(failure, attempt, backoff_s, max_backoff_s)
            if attempt == max_attempts or not _retryable(failure, replay_safe) or wait >= remaining:
                finish("failed", failure, attempt)
                raise
            await asyncio.sleep(wait)
            waited += wait
            continue
        finish("completed", None, attempt)
        return result
    raise AssertionError("unreachable")  # pragma: no cover


def _loop_deadline(deadline: float) -> float:
    """`deadline` on time.monotonic as a deadline on the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline - time.monotonic())


def _wait_before_retry(
    failure: NgFailureEvent, attempt: int, backoff_s: float, max_backoff_s: float
) -> float:
    details = failure.http_details
    if details is not None and details.retry_after_s is not None:
        return details.retry_after_s
    # Full jitter (AWS architecture blog) keeps a fleet of clients from retrying in step.
    return random.uniform(0, min(max_backoff_s, backoff_s * 2 ** (attempt - 1)))
