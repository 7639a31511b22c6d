"""The agent's `seed_session` and `verify` calls, retried when the resources server says it did not
process one: a 429 or a 503, or a request that was never sent.

Decisions:
- Only a request that was not processed is retried. A 500 (the verifier raised) would fail the same
  way again: it ends the attempt, for the collector's attempt budget. `/sandbox/run` never comes here
  (a command may have effects).
- A Retry-After is honoured when it fits in what is left of the call's budget (`RESOURCES_BUDGET_S`);
  when it does not, the call ends at once rather than retrying early, as `retry_model_call` ends a
  model call. The call then fails with the agent's own failure at the resources server's boundary,
  at the call's stage, caused by the reply's failure: the row's chain says what wait was refused and,
  under it, who asked for it (in the demo, the chaos proxy's injected 503).
- A refusal is read with `not_processed_failure`: rebuilt from its report and observed, so a success
  row keeps what it recovered from, but not recorded as a call that ended in failure, which would
  taint the answer the retry then builds (`gym_failures.calls`). A refusal that is never settled
  raises the agent's failure above. A refusal without a report goes through `raise_boundary_failure`
  like any failed reply: recorded, so a success after it is tainted, conservatively.
- Not `retry_model_call`, nor a `logical_call()`: these are not model calls, and a call settled in a
  `logical_call()` counts among the request's model calls (`X-Gym-Model-Calls`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

from gym_failures.client import status_error_failure
from gym_failures.demo._serve import RESOURCES_BUDGET_S, RESOURCES_TRIES
from gym_failures.failure_kinds import FailureStage
from gym_failures.failure_transport import observe_failure
from gym_failures.failures import NgFailureEvent, ResourcesServerFailure

__all__ = ["not_processed_failure", "retry_resources_call"]

T = TypeVar("T")

_NOT_PROCESSED = frozenset({429, 503})


async def retry_resources_call(
    call: Callable[[int], Awaitable[T]],
    *,
    path: str,
    stage: FailureStage,
    tries: int = RESOURCES_TRIES,
    budget_s: float = RESOURCES_BUDGET_S,
    backoff_s: float = 0.1,
) -> T:
    """`call(try_number)` (1, 2, ...) until it returns, at most `tries` times, waiting at most
    `budget_s` seconds in all before retrying; see the module's docstring for what is retried and
    what is raised when the call gives up."""
    deadline = time.monotonic() + budget_s
    for number in range(1, tries + 1):
        try:
            return await call(number)
        except NgFailureEvent as failure:
            wait = _wait_before_retry(failure, number, backoff_s)
            if wait is None:
                raise  # processed, or failed before an answer: a retry would not help
            left = deadline - time.monotonic()
            if wait >= left:
                reason = (
                    f"{path} was not tried again: its reply asks for a wait of {wait:g} s, past what "
                    f"is left of the call's {budget_s:g} s budget"
                )
                raise _gave_up(failure, reason, stage) from failure
            if number == tries:
                reason = f"{path} was still refused after {tries} tries"
                raise _gave_up(failure, reason, stage) from failure
            observe_failure(failure)  # a transport failure outside a call is not in the log yet
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def not_processed_failure(reply: aiohttp.ClientResponse) -> NgFailureEvent | None:
    """The failure of `reply` when it says the server did not process the request (429, 503) and
    carries a failure report: rebuilt with its exchange in `http_details` (its Retry-After included)
    and observed into the request's log, not recorded as a call that ended in failure (the module's
    docstring). `None` for any other reply."""
    if reply.status not in _NOT_PROCESSED:
        return None
    try:
        reply.raise_for_status()
    except aiohttp.ClientResponseError as error:
        return status_error_failure(error)
    return None


def _wait_before_retry(failure: NgFailureEvent, number: int, backoff_s: float) -> float | None:
    """The seconds to wait before trying again after `failure`; `None` when it is not retried."""
    details = failure.http_details
    if details is None:
        return None  # a failure the agent found itself: the same request fails the same way
    if details.delivery != "not_sent" and not (
        details.delivery == "answered" and details.status in _NOT_PROCESSED
    ):
        return None
    if details.retry_after_s is not None:
        return details.retry_after_s
    return random.uniform(0, backoff_s * 2 ** (number - 1))


def _gave_up(failure: NgFailureEvent, reason: str, stage: FailureStage) -> ResourcesServerFailure:
    return ResourcesServerFailure(failure_kind=failure.failure_kind, failure_reason=reason, stage=stage)
