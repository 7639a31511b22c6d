"""The failures the proxy answers with itself: an injected status, and its own refusals.

An injected failure names the proxy (its reason starts "[proxy] injected", its `exception_type` is
`INJECTED_TYPE`) at the upstream's boundary, with the event id the reply announces; its kind follows
the status (`status_kind`). A refusal (a fault header that is not a fault, a body over the limit) and
an upstream the proxy cannot reach are real failures, marked "[proxy]" but not injected. No reason
quotes the request: its path may hold an id or a token.
"""

from __future__ import annotations

from gym_failures._injected import INJECTED_TYPE
from gym_failures.failure_kinds import (
    INFRASTRUCTURE_ERROR,
    INVALID_REQUEST_PARAMETER,
    MODEL_REQUEST_ERROR,
    MODEL_SERVER_ERROR,
    PROVIDER_QUOTA_EXHAUSTED,
    PROVIDER_UNAVAILABLE,
    TRANSPORT_UNREACHABLE,
)
from gym_failures.failure_records import FailureBoundary
from gym_failures.failures import NgFailureEvent, failure_type_for
from gym_failures.model_endpoint._faults import Fault
from gym_failures.proxy._exchange import MAX_REQUEST_BYTES
from gym_failures.proxy._plan import DEFAULT_STATUS

__all__ = [
    "INJECTED_TYPE",
    "bad_fault_header",
    "injected_failure",
    "not_a_path",
    "status_kind",
    "too_large",
    "unreachable",
]


def status_kind(boundary: FailureBoundary, code: int) -> str:
    """The kind of an injected `code` at `boundary`: 429 `provider_quota_exhausted`; 502, 503, 504,
    529 `provider_unavailable`; other 5xx `infrastructure_error` (`model_server_error` at the model);
    4xx `invalid_request_parameter` (`model_request_error` at the model)."""
    model = boundary is FailureBoundary.MODEL
    if code == 429:
        return PROVIDER_QUOTA_EXHAUSTED
    if code in (502, 503, 504, 529):
        return PROVIDER_UNAVAILABLE
    if code >= 500:
        return MODEL_SERVER_ERROR if model else INFRASTRUCTURE_ERROR
    return MODEL_REQUEST_ERROR if model else INVALID_REQUEST_PARAMETER


def injected_failure(boundary: FailureBoundary, fault: Fault, event_id: str) -> NgFailureEvent:
    """The failure a `status` fault answers with."""
    code = fault.code or DEFAULT_STATUS
    wait = fault.retry_after_s if code in (429, 503, 529) else None
    return failure_type_for(boundary)(
        failure_kind=status_kind(boundary, code),
        failure_reason=f"[proxy] injected {code} (status fault): the upstream never saw the request",
        http_status=code,
        event_id=event_id,
        exception_type=INJECTED_TYPE,
        retry_after_s=wait,
    )


def too_large(boundary: FailureBoundary) -> NgFailureEvent:
    return failure_type_for(boundary)(
        failure_kind=INVALID_REQUEST_PARAMETER,
        failure_reason=f"[proxy] the request's body is over the proxy's {MAX_REQUEST_BYTES >> 20} MiB",
        http_status=413,
    )


def not_a_path(boundary: FailureBoundary) -> NgFailureEvent:
    """A request target that is not a path (`@host/x`, `*`, an absolute URL): refused, never forwarded
    to whatever host it would name."""
    return failure_type_for(boundary)(
        failure_kind=INVALID_REQUEST_PARAMETER,
        failure_reason="[proxy] the request target is not a path: nothing was forwarded",
        http_status=400,
    )


def bad_fault_header(boundary: FailureBoundary, problem: str | None) -> NgFailureEvent:
    """A fault header that is not a fault: refused, so a misspelt fault never passes silently."""
    return failure_type_for(boundary)(
        failure_kind=INVALID_REQUEST_PARAMETER,
        failure_reason=f"[proxy] {problem or 'the X-Gym-Fault header is not a fault'}",
        http_status=400,
    )


def unreachable(boundary: FailureBoundary, upstream: str, error: BaseException) -> NgFailureEvent:
    """The 502 of an upstream the proxy cannot reach: a real failure, not an injected one."""
    return failure_type_for(boundary)(
        failure_kind=TRANSPORT_UNREACHABLE,
        failure_reason=f"[proxy] cannot reach the upstream {upstream}: {type(error).__name__}",
        http_status=502,
        exception_type=type(error).__name__,
    )
