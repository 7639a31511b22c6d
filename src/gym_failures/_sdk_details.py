"""SDK detail selection: the `SdkErrorDetails` an adapter keeps of a foreign (third-party SDK) error.

A foreign exception never becomes an event by itself: an adapter selects `SdkErrorDetails` with
`sdk_error_details` (the exception's type, an HTTP status, and the message field the adapter chose)
and raises its own Gym failure `from` the foreign error. Documented, and reached, as
`gym_failures.failures.sdk_error_details`.

`str()` of a foreign exception is never read into a failure, here or anywhere in gym-failures: it
can quote the request the SDK sent, its headers and body included (docs/decisions.md, "A foreign
exception's text is never read").
"""

from __future__ import annotations

from gym_failures._failure_text import bounded_reason, exception_type_name
from gym_failures._http_status import http_status as _evidence_status
from gym_failures.failure_records import SdkErrorDetails


def sdk_error_details(
    error: BaseException, message: str, *, http_status: int | None = None
) -> SdkErrorDetails:
    """The `SdkErrorDetails` an adapter selected from a foreign `error`.

    `message` is the field the adapter chose (an SDK's `message` or `code`), never `str(error)`.
    It is redacted and cut to 2000 characters; an `http_status` outside 100-599 is dropped as no evidence.
    """
    return SdkErrorDetails(
        exception_type=exception_type_name(error),
        http_status=_evidence_status(http_status),
        message=bounded_reason(message),
    )


def bounded_sdk_details(error: SdkErrorDetails | None) -> SdkErrorDetails | None:
    """`error` with its message redacted and cut, for an adapter that built `SdkErrorDetails` itself
    rather than with `sdk_error_details`."""
    if error is None:
        return None
    message = bounded_reason(error.message)
    return error if message == error.message else error.model_copy(update={"message": message})
