"""Retry hints: how long one failure says to wait before a retry, bounded.

A failure knows when a retry can succeed in three ways, read in this order: an explicit hint
(`NgFailureEvent.retry_after_s`), the `Retry-After` of the reply a caller rebuilt it from
(`HttpDetails.retry_after_s`, such as a provider's own), and a quota's reset time in a
`provider_quota_exhausted` reason ("resets at ... UTC"). `own_retry_hint_s` reads one failure's;
`gym_failures.failures.retry_hint_s` walks a failure's explicit chain and returns the first it meets.

Every wait is bounded to 0-`MAX_RETRY_AFTER_S`: a hint can come from a peer's header. Documented, and
reached, as `gym_failures.failures.MAX_RETRY_AFTER_S` and `...retry_hint_s`.
"""

from __future__ import annotations

import time
from typing import Protocol

from gym_failures._quota_reset import quota_reset_unix
from gym_failures._vocabulary import PROVIDER_QUOTA_EXHAUSTED

MAX_RETRY_AFTER_S = 86400.0
"""The longest wait a retry hint may ask for (a day); a longer one, or one that is not a finite
number, is bounded here rather than trusted: a hint can come from a peer's header."""


class _ReplySeen(Protocol):
    @property
    def retry_after_s(self) -> float | None: ...


class HintedFailure(Protocol):
    """What a retry hint reads of a failure (an `NgFailureEvent` has all of it)."""

    @property
    def retry_after_s(self) -> float | None: ...
    @property
    def http_details(self) -> _ReplySeen | None: ...
    @property
    def failure_kind(self) -> str: ...
    @property
    def failure_reason(self) -> str: ...


def bounded_wait(seconds: float) -> float | None:
    """`seconds` within 0-`MAX_RETRY_AFTER_S`; `None` when it is not a number (or is NaN)."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds != seconds:
        return None
    try:
        return min(max(float(seconds), 0.0), MAX_RETRY_AFTER_S)
    except OverflowError:  # an int past a float's range: a wait past any bound
        return MAX_RETRY_AFTER_S if seconds > 0 else 0.0


def own_retry_hint_s(failure: HintedFailure, *, now: float | None = None) -> float | None:
    """The wait `failure` itself asks for (its causes not read), in the order above; `None` when it
    knows none."""
    if failure.retry_after_s is not None:
        return failure.retry_after_s
    details = failure.http_details
    if details is not None and details.retry_after_s is not None:
        return bounded_wait(details.retry_after_s)
    if failure.failure_kind == PROVIDER_QUOTA_EXHAUSTED:
        reset = quota_reset_unix(failure.failure_reason)
        if reset is not None:
            return bounded_wait(reset - (time.time() if now is None else now))
    return None
