"""The SDK hook's logical calls: which call each attempt is of, its headers, and how each one ended.

`observe_attempts` (`client/_sdk.py`) calls `begin_attempt` from an httpx request hook, before an
attempt is sent, and `end_attempt` when it knows the attempt's outcome (its reply's status, its
stream's end, or the transport error that left it without a reply, seen by
`client/_observed_transport.py`). The client helpers call `reply_outcome` for a reply they read and
`attempt_failed` for an attempt `map_transport_errors` saw get no reply.

Which call an attempt is of (`gym_failures.calls` says why the call is the unit):

1. the call the request names itself (`X-Gym-Call-Id`, sent by the caller), else
2. the call a `logical_call()` block opened, else
3. the SDK's own: an attempt whose `x-stainless-retry-count` is above 0 is a retry of the call the
   task's last first attempt opened; any other attempt opens a new call.

The attempt is sent with the call's headers (`X-Gym-Call-Id`, `X-Gym-Call-Attempt`), so a server that
journals attempts (`gym-failures serve model`) groups them by call, never by body. Its outcome goes
into the request's log as the call's latest `ModelOperationObservation` (`observe_model_operation`):
`failed` with the failure the attempt ended in, or `completed`.

Decisions:
- An attempt's outcome never overwrites a later attempt's: a stream closed late must not reopen a call
  its retry settled.
- A success reply whose own report names a failure (`failure_id`: the server answered with a call of
  its own that ended in failure) is a failed attempt: the answer is built on that failure, one hop
  further down.
- A streamed reply is `completed` when its status line arrives, and `failed` if its body then breaks
  off, is cut before its terminal event or ends in a failure event.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, cast

from gym_failures.calls import (
    CALL_ATTEMPT_HEADER,
    CALL_ID_HEADER,
    LogicalCall,
    call_attempt_of,
    call_id_of,
    current_call,
    new_call_id,
)
from gym_failures.failure_records import FailureReport
from gym_failures.failure_transport import RequestFailureLog, observe_failure, observe_model_operation
from gym_failures.failures import NgFailureEvent, rebuild_failure

__all__ = [
    "CALL_EXTENSION",
    "FAILURE_EXTENSION",
    "Ended",
    "attempt_failed",
    "begin_attempt",
    "call_failure",
    "end_attempt",
    "reply_outcome",
]

CALL_EXTENSION = "gym_failures.call"
"""The request extension where the hook keeps the attempt's call id and number."""
FAILURE_EXTENSION = "gym_failures.failure"
_RETRY_COUNT = "x-stainless-retry-count"

# The call the SDK's last first attempt opened in this task or thread: its retries join it.
_SDK_CALL: ContextVar[LogicalCall | None] = ContextVar("gym_failures_sdk_call", default=None)


def begin_attempt(request: Any) -> None:
    """Name the call `request` is an attempt of, in its headers and its extensions."""
    headers = request.headers
    sent = call_id_of(headers.get(CALL_ID_HEADER))
    if sent is not None:
        attempt = call_attempt_of(headers.get(CALL_ATTEMPT_HEADER)) or 1
        request.extensions[CALL_EXTENSION] = (sent, attempt)
        return
    call = current_call()
    if call is None:
        retry = headers.get(_RETRY_COUNT)
        call = _SDK_CALL.get()
        if call is None or retry is None or not retry.isdigit() or int(retry) == 0:
            call = LogicalCall(new_call_id())
            _SDK_CALL.set(call)
    attempt = call.next_attempt()
    headers.update(call.headers(attempt))
    request.extensions[CALL_EXTENSION] = (call.call_id, attempt)


Ended = NgFailureEvent | FailureReport | None
"""How an attempt ended: the failure it raised, a success's report that names a failure of its own,
or `None` (it ended well)."""


def end_attempt(request: Any, ended: Ended) -> None:
    """Record how the attempt `request` ended (`Ended`) as its call's latest outcome, unless a later
    attempt of the call already ended."""
    named = request.extensions.get(CALL_EXTENSION)
    log = RequestFailureLog.current()
    if named is None or log is None:
        return
    call_id, attempt = named
    _record(log, call_id, attempt, ended)


def _failure_id(ended: Ended) -> str | None:
    if isinstance(ended, NgFailureEvent):
        return ended.event_id
    return None if ended is None else ended.failure_id


def _record(log: RequestFailureLog, call_id: str, attempt: int, ended: Ended) -> None:
    """Attempt `attempt` of call `call_id` as the call's latest outcome in `log`, unless a later
    attempt of the call already ended. The failure a call ends in is kept in the log past its bound
    (`RequestFailureLog.keep`): it is what the reply names as its own."""
    prior = log.model_operations.get(call_id)
    if prior is not None and (prior.http_attempts or 0) > attempt:
        return
    failure_id = _failure_id(ended)
    if failure_id is not None and failure_id not in log.report.events:
        log.keep(ended.failure_report() if isinstance(ended, NgFailureEvent) else cast(FailureReport, ended))
    observe_model_operation(
        call_id,
        "completed" if failure_id is None else "failed",
        f"{call_id}.{attempt}",
        failure_id=failure_id,
        http_attempts=attempt,
    )


def reply_outcome(ended: Ended) -> None:
    """Record a reply the client helpers read (`raise_boundary_failure`, `raise_for_status`) as an
    attempt of the current `logical_call()`. Outside a call, a reply is a call of its own: one that
    ended in failure (a failed reply, a success that names a failure of its own) is recorded as such,
    so an agent that catches it and answers anyway answers from a failed call; a retry that should
    settle it is an attempt of one `logical_call()`."""
    log = RequestFailureLog.current()
    if log is None:
        return
    call = current_call()
    if call is None:
        if _failure_id(ended) is None:
            return
        call_id, attempt = new_call_id(), 1
    else:
        call_id, attempt = call.call_id, max(call.attempts, 1)
    _record(log, call_id, attempt, ended)


def attempt_failed(failure: NgFailureEvent) -> None:
    """An attempt of the current `logical_call()` got no reply (`map_transport_errors` names it): its
    failure is observed and ends the attempt, whoever catches it."""
    observe_failure(failure)
    reply_outcome(failure)


def call_failure() -> NgFailureEvent | None:
    """The failure the current call's latest attempt ended in (the `logical_call()` block's call, else
    the SDK's last first attempt's), rebuilt from the request's log, or `None` when it ended well or
    nothing was observed: what an SDK error that carries no request of its own stands for."""
    log = RequestFailureLog.current()
    call = current_call() or _SDK_CALL.get()
    if log is None or call is None:
        return None
    operation = log.model_operations.get(call.call_id)
    if operation is None or operation.outcome != "failed" or operation.failure_id is None:
        return None
    return rebuild_failure(log.report, operation.failure_id)
