"""The logical call: every attempt a client makes for one request, whose outcome is its last attempt.

A failure event says a failure *happened* on the way to a reply; it does not say the caller *handled*
it. The unit that decides is the logical call. An SDK's retries and the client helpers' retries are
attempts of one call; two rollouts that send the same prompt are two calls, however alike their
bodies (RL collection sends identical bodies on purpose: `num_repeats`, groups).

On the wire a call is named by two request headers, which the client helpers send and any client may:

    X-Gym-Call-Id       the call's id: printable ASCII, at most `MAX_CALL_ID` characters
    X-Gym-Call-Attempt  the attempt's number within the call, 1 for the first

A server running `FailureReportMiddleware` reports the calls its request made in one reply header,
`X-Gym-Model-Calls` (`MODEL_CALLS_HEADER`; its format and bounds in `gym_failures._attempt_cost`):
the calls, their attempts, the attempts that failed and the tokens the replies reported, which the
collector saves on the attempt's row (`_gf_model_calls`).

`logical_call()` opens a call for a block: every attempt made inside it (an SDK's retries, a
re-issued stream after a cut, `retry_model_call`'s attempts) is an attempt of that call, and
`call_headers()` gives the headers of the next attempt for a client that sends them itself::

    with logical_call():
        for _ in range(3):
            stream = client.responses.create(model=..., input=..., stream=True)
            text = "".join(...)
            if observed_failure(stream) is None:
                break

Outside a `logical_call()`, `observe_attempts` makes one call of each SDK call: the SDKs number
their attempts in `x-stainless-retry-count` (0 on a first attempt), so a retry joins the call before
it and a first attempt opens a new one.

Where a call's outcome is kept: the request's failure log holds each call's latest
`ModelOperationObservation` (`observe_model_operation`, the reference's name), the latest per call id.
A call whose last attempt failed is a call that *ended* in failure; a reply the request sends without
a failure of its own then names that call's failure as its own (`FailureReport.failure_id`,
`gym_failures.reply`), because an answer built on it is not a clean measurement (docs/decisions.md,
"Seen is not handled").

Decisions:
- The current call lives in a ContextVar, as the current request's log does: a task or a thread
  sees its own call, and an SDK's retries (made in the task that made the first attempt) see it too.
- An id a peer sends is read, never trusted: one that is not printable ASCII or is too long is no id
  (`call_id_of`), and the attempt is grouped as if none were sent.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = [
    "CALL_ATTEMPT_HEADER",
    "CALL_ID_HEADER",
    "MAX_CALL_ATTEMPT",
    "MAX_CALL_ID",
    "MODEL_CALLS_HEADER",
    "LogicalCall",
    "call_attempt_of",
    "call_headers",
    "call_id_of",
    "current_call",
    "logical_call",
    "new_call_id",
]

CALL_ID_HEADER = "X-Gym-Call-Id"
"""The request header that names the logical call an attempt belongs to."""
CALL_ATTEMPT_HEADER = "X-Gym-Call-Attempt"
"""The request header that numbers an attempt within its call, from 1."""
MAX_CALL_ID = 96
"""The longest call id read or sent: with `.<attempt>` it stays within an attempt id's 128 characters."""
MAX_CALL_ATTEMPT = 1_000_000
"""The highest attempt number read."""
MODEL_CALLS_HEADER = "X-Gym-Model-Calls"
"""The reply header that counts the logical calls a request made and their attempts
(`gym_failures._attempt_cost`)."""

_CURRENT: ContextVar[LogicalCall | None] = ContextVar("gym_failures_logical_call", default=None)


def new_call_id() -> str:
    """A new call id: 96 random bits, 16 URL-safe characters (as an event id)."""
    return secrets.token_urlsafe(12)


@dataclass(slots=True)
class LogicalCall:
    """One logical call: its id and how many attempts it has made so far."""

    call_id: str
    attempts: int = 0

    def next_attempt(self) -> int:
        """Count one more attempt and return its number (1 for the first)."""
        self.attempts += 1
        return self.attempts

    def headers(self, attempt: int) -> dict[str, str]:
        """The request headers of attempt `attempt` of this call."""
        return {CALL_ID_HEADER: self.call_id, CALL_ATTEMPT_HEADER: str(attempt)}


@contextlib.contextmanager
def logical_call(call_id: str | None = None) -> Iterator[LogicalCall]:
    """Make every attempt inside the block an attempt of one call (`call_id`, or a new id)."""
    if call_id is not None and call_id_of(call_id) is None:
        raise ValueError(f"a call id is printable ASCII of 1 to {MAX_CALL_ID} characters")
    call = LogicalCall(call_id or new_call_id())
    token = _CURRENT.set(call)
    try:
        yield call
    finally:
        _CURRENT.reset(token)


def current_call() -> LogicalCall | None:
    """The call a `logical_call()` block opened, or `None` outside one."""
    return _CURRENT.get()


def call_headers() -> dict[str, str]:
    """The headers of the next attempt of the current call (counting it), or `{}` outside a call."""
    call = _CURRENT.get()
    if call is None:
        return {}
    return call.headers(call.next_attempt())


def call_id_of(value: object) -> str | None:
    """`value` as a call id: a printable ASCII string of 1 to `MAX_CALL_ID` characters, else `None`."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_CALL_ID:
        return None
    return value if value.isascii() and value.isprintable() and " " not in value else None


def call_attempt_of(value: object) -> int | None:
    """`value` as an attempt number (a decimal of 1 to 1,000,000), else `None`."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 7:
        return None
    number = int(value)
    return number if 0 < number <= MAX_CALL_ATTEMPT else None
