"""Retrying a model call: finite attempts within a total time budget, each failed attempt recorded.

Retry policy: a request never sent (connection refused, DNS, connect timeout) is retried; a reply of
429 or 503 (the server says it did not process the request) is retried; a timeout or a dropped
connection after sending, or a 408/500/502/504, may have been delivered and is retried only when the
call site passes `replay_safe=True`; anything else is final. `Retry-After` is honoured when it fits in
the remaining budget; when it does not, the failure is final at once rather than retried early.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gym_failures.calls import LogicalCall, call_id_of, logical_call
from gym_failures.failure_kinds import TRANSPORT_TIMEOUT
from gym_failures.failure_records import FailureBoundary
from gym_failures.failure_transport import observe_failure, observe_model_operation
from gym_failures.failures import (
    HttpDetails,
    NgFailureEvent,
    exception_type_name,
    failure_type_for,
    new_event_id,
)

# Ids are at most 128 characters (`FailureEvent.attempt_id`, `ModelOperationObservation`).
_MAX_ID = 128

__all__ = ["retry_model_call"]

T = TypeVar("T")

_RETRY_WHEN_ANSWERED = frozenset({429, 503})
_RETRY_WHEN_REPLAY_SAFE = frozenset({408, 500, 502, 504})


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
    the terminal outcome with `observe_model_operation` (its `http_attempts` the call's attempts: an
    SDK client wrapped in `observe_attempts` inside `call` counts its own retries in them); the last
    failure is raised. An attempt still
    running when the budget ends is cancelled and fails as `transport_timeout`.

    The attempts are one logical call (`gym_failures.calls.logical_call`, its id `operation_id` when
    that is a valid call id): an SDK client wrapped in `observe_attempts` sends the call's headers by
    itself, and any other client sends `call_headers()` with its request.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if not budget_s > 0:
        raise ValueError("budget_s must be positive")
    operation_id = operation_id or new_event_id()
    with logical_call(operation_id if call_id_of(operation_id) else None) as logical:
        limits = (max_attempts, budget_s, replay_safe, backoff_s, max_backoff_s)
        return await _retried(call, logical, operation_id, limits, boundary)


async def _retried(
    call: Callable[[str], Awaitable[T]],
    logical: LogicalCall,
    operation_id: str,
    limits: tuple[int, float, bool, float, float],
    boundary: FailureBoundary | str,
) -> T:
    """`retry_model_call`'s attempts, inside its logical call."""
    max_attempts, budget_s, replay_safe, backoff_s, max_backoff_s = limits
    started = time.monotonic()
    deadline = started + budget_s
    waited = 0.0
    transport_failures = 0
    attempt_id = ""

    def finish(failure: NgFailureEvent | None, attempts: int) -> None:
        observe_model_operation(
            operation_id,
            "completed" if failure is None else "failed",
            attempt_id,
            failure_id=None if failure is None else failure.event_id,
            # The call's HTTP attempts: an SDK inside `call` numbers its own retries in the call too.
            http_attempts=max(attempts, logical.attempts),
            transport_failures=transport_failures,
            retry_wait_s=round(waited, 6),
            request_elapsed_ms=round((time.monotonic() - started) * 1000, 3),
        )

    for attempt in range(1, max_attempts + 1):
        # An id is at most 128 characters: a long operation id gives up its end, never the
        # attempt's number.
        suffix = f".{attempt}"
        attempt_id = operation_id[: _MAX_ID - len(suffix)] + suffix
        # The call's next attempt is this one, at least (a client's own retries count on).
        logical.attempts = max(logical.attempts, attempt - 1)
        budget = asyncio.timeout_at(_loop_deadline(deadline))
        try:
            async with budget:
                result = await call(attempt_id)
        except TimeoutError as error:
            # Ask the timeout, not the clock: a loop's timer may fire a little before `deadline` on
            # time.monotonic (uvloop's clock has millisecond steps).
            if not budget.expired():
                raise  # not our budget: the call's own timeout, not a Gym failure
            failure = _over_budget(error, boundary, operation_id, attempt_id, budget_s)
            transport_failures += 1
            observe_failure(failure)
            finish(failure, attempt)
            raise failure from error
        except NgFailureEvent as failure:
            observe_failure(failure)
            details = failure.http_details
            if details is not None and details.delivery != "answered":
                transport_failures += 1
            remaining = deadline - time.monotonic()
            wait = _wait_before_retry(failure, attempt, backoff_s, max_backoff_s)
            if attempt == max_attempts or not _retryable(failure, replay_safe) or wait >= remaining:
                finish(failure, attempt)
                raise
            await asyncio.sleep(wait)
            waited += wait
            continue
        finish(None, attempt)
        return result
    raise AssertionError("unreachable")  # pragma: no cover


def _over_budget(
    error: TimeoutError, boundary: FailureBoundary | str, operation_id: str, attempt_id: str, budget_s: float
) -> NgFailureEvent:
    """The failure of an attempt the budget cancelled: it may have been delivered."""
    failure = failure_type_for(boundary)(
        boundary=boundary,
        failure_kind=TRANSPORT_TIMEOUT,
        failure_reason=f"model call {operation_id} exceeded its {budget_s:g} s budget",
        operation_id=operation_id,
        attempt_id=attempt_id,
        exception_type=exception_type_name(error),
    )
    failure.http_details = HttpDetails(method="", url="", delivery="unknown")
    return failure


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
