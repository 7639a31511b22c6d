"""The JSON body of a failure reply, in the shape its callers' clients read.

Documented, and reached, as `gym_failures.asgi.error_body` and `gym_failures.asgi.ErrorShape`; the
server middleware (`gym_failures.asgi.FailureReportMiddleware`) sends it.

The shapes (`error_shape`): `"gym"` (the default, `{"failure_kind", "failure_reason", "event_id",
"boundary"}`), `"openai"` (`{"error": {"message", "type", "code", ...}}`) or `"anthropic"`
(`{"type": "error", "error": {"type", "message", ...}}`). Each API's own error type is chosen by the
reply's status; the message reads `<kind>: <reason> (event <id>)`, and the error object also holds
`failure_kind`, `event_id` and `boundary`, so an SDK's exception says what failed and which event it
was. The report itself stays in the header.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from gym_failures._http_status import is_server_error
from gym_failures.failure_records import FailureEvent

ErrorShape = Literal["gym", "openai", "anthropic"]
"""The shape of a failure reply's JSON body: this library's own, or an API's error object."""

ERROR_TYPES: dict[str, tuple[dict[int, str], str]] = {
    # Each API's error `type` by status, and its type for any other status.
    "gym": ({}, ""),
    "openai": (
        {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            409: "conflict_error",
            422: "unprocessable_entity_error",
            429: "rate_limit_error",
        },
        "server_error",
    ),
    "anthropic": (
        {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            413: "request_too_large",
            429: "rate_limit_error",
            529: "overloaded_error",
        },
        "api_error",
    ),
}


def error_body(event: FailureEvent, *, status: int, shape: ErrorShape = "gym") -> bytes:
    """A failure reply's JSON body for `event` in `shape` (see this module's docstring), ASCII."""
    facts = {"failure_kind": event.failure_kind, "event_id": event.event_id, "boundary": event.boundary.value}
    if shape == "gym":
        body: dict[str, Any] = {
            "failure_kind": event.failure_kind,
            "failure_reason": event.failure_reason,
            "event_id": event.event_id,
            "boundary": event.boundary.value,
        }
    else:
        by_status, other = ERROR_TYPES[shape]
        error_type = by_status.get(status, other if is_server_error(status) else "invalid_request_error")
        reason = f": {event.failure_reason}" if event.failure_reason else ""
        message = f"{event.failure_kind}{reason} (event {event.event_id})"
        if shape == "openai":
            body = {"error": {"message": message, "type": error_type, "code": event.failure_kind, **facts}}
        else:
            body = {"type": "error", "error": {"type": error_type, "message": message, **facts}}
    return json.dumps(body, ensure_ascii=True).encode("ascii")
