"""When the collector sends a rollout's next attempt: backoff, server hints, and whether the agent is up.

Backoff (`Backoff`): a failed attempt that is retried waits before the next one, a bounded exponential
with decorrelated jitter (the AWS Architecture Blog's "Exponential Backoff and Jitter"): each wait is
drawn between `initial` and three times the rollout's previous wait, never past `cap`. The defaults
(`initial` 1 s, `cap` 30 s) are NeMo RL's, which retries Gym rollouts with backoff from 1 s to 30 s.
Decorrelated rather than full jitter: every wait is at least `initial`, so a down agent is never hit
again at once, and the rollouts of one burst still spread out. `initial` 0 retries at once (as before
issue 21).

Hints (`retry_hint`): the failure's own `Retry-After` (seconds or an HTTP date, or `retry-after-ms`,
read by `gym_failures.client.retry_after_s`), else a quota's reset time in its reason
(`gym_failures.failure_kinds.quota_reset_unix`), through `gym_failures.failures.retry_hint_s`, the one
place a hint is read; a hint takes the place of the backoff and is bounded by the run's
`retry_after_max_s`.

Readiness (`accepts_connections`, `wait_ready`): whether the agent accepts a TCP connection, what the
collector probes (every `READY_PROBE_INTERVAL_S`, for at most `wait_ready_s`) before its first attempt
and after `TRANSPORT_RUN` attempts in a row failed with the same transport kind, so that an agent still
starting or down for a while costs no attempt.

The wait is measured against its deadline, `start + wait_ready_s`, and each sleep is what is left to
it (at most an interval): on a clock whose time is the sum of its sleeps (a test's), the last sleep
lands on the deadline exactly, as `deadline - now` is exact when `now` is that close to it. It once
slept `wait_ready_s - waited` instead, `waited` being `now - start` rounded: near the deadline that
remainder could be under half a unit in the last place of `now`, so the sleep left the clock where it
was, and the wait probed for ever (a test hung on it 1 run in 3, its start time a sum of random
backoffs; `tests/collection/test_recovery.py` holds such starts).

The clock (`Clock`) is the collector's own: tests give it one whose sleeps return at once, and read
the waits it was asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import yarl

from gym_failures.failure_kinds import PROVIDER_QUOTA_EXHAUSTED, quota_reset_unix
from gym_failures.failure_records import EpisodeFailure, FailureReport
from gym_failures.failures import NgFailureEvent, retry_hint_s

__all__ = [
    "READY_PROBE_INTERVAL_S",
    "TRANSPORT_RUN",
    "Backoff",
    "Clock",
    "RealClock",
    "WaitFrom",
    "accepts_connections",
    "retry_hint",
    "wait_ready",
]

TRANSPORT_RUN = 3
"""Attempts in a row, across rollouts, failed by the collector with the same transport kind: dispatch
pauses and probes the agent (`wait_ready_s`) before the next."""
READY_PROBE_INTERVAL_S = 0.5
"""Between two readiness probes (NeMo Gym's own client waits 0.5 s between connection retries)."""

WaitFrom = Literal["backoff", "retry_after"]
"""Where a retry's wait came from: the collector's backoff, or the failure's own hint."""


class Clock(Protocol):
    """What the collector reads the time from and sleeps on: `sleep(s)` moves `monotonic()` on by `s`
    (a real clock's time moves on its own too; a test's moves only by its sleeps, in floating point,
    which `wait_ready` allows for)."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """The event loop's clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass
class Backoff:
    """Decorrelated-jitter backoff for each rollout: `wait(key)` is the wait before its next attempt."""

    initial: float
    cap: float
    rng: random.Random = field(default_factory=random.Random)
    _previous: dict[str, float] = field(default_factory=dict)

    def wait(self, key: str) -> float:
        if self.initial <= 0 or self.cap <= 0:
            return 0.0
        low = min(self.initial, self.cap)
        previous = self._previous.get(key, low)
        wait = min(self.cap, self.rng.uniform(low, max(low, previous * 3)))
        self._previous[key] = wait
        return wait

    def forget(self, key: str) -> None:
        """`key`'s rollout is done: its backoff state goes."""
        self._previous.pop(key, None)


def retry_hint(
    raised: NgFailureEvent | None, failure: EpisodeFailure | None, report: FailureReport
) -> float | None:
    """The wait an attempt's failure asks for, in seconds, else None: the `raised` failure's hints
    (its `Retry-After`, a quota's reset time; `retry_hint_s`), else, for a failure the agent answered
    in an episode response, a quota's reset time in its reason or in its report's failure."""
    if raised is not None:
        return retry_hint_s(raised)
    reasons = []
    if failure is not None and failure.failure_kind == PROVIDER_QUOTA_EXHAUSTED:
        reasons.append(failure.failure_reason)
    root = report.events.get(report.failure_id) if report.failure_id is not None else None
    if root is not None and root.failure_kind == PROVIDER_QUOTA_EXHAUSTED:
        reasons.append(root.failure_reason)
    for reason in reasons:
        reset = quota_reset_unix(reason)
        if reset is not None:
            return max(0.0, reset - time.time())
    return None


async def accepts_connections(agent_url: str, timeout_s: float) -> bool:
    """Whether the agent's host accepts a TCP connection within `timeout_s` (closed at once)."""
    url = yarl.URL(agent_url)
    if url.host is None or url.port is None:
        return False
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(url.host, url.port), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def wait_ready(
    probe: Callable[[], Awaitable[bool]],
    clock: Clock,
    bound_s: float,
    on_wait: Callable[[float], None] = lambda waited: None,
) -> bool:
    """Whether `probe` says yes within `bound_s` seconds of `clock`, probing at once, then every
    `READY_PROBE_INTERVAL_S` and at the deadline; `on_wait(waited)` after each no with time left.

    The sleeps are measured to the deadline, never as a remainder of the time waited (see the module
    docstring): on a clock that moves only by its sleeps the wait ends after at most
    `ceil(bound_s / READY_PROBE_INTERVAL_S) + 2` probes (one more than the intervals that fit when the
    sums of intervals round short of the deadline, and the last sleep makes up the few units left)."""
    started = clock.monotonic()
    deadline = started + bound_s
    while not await probe():
        now = clock.monotonic()
        if now >= deadline:
            return False
        on_wait(now - started)
        await clock.sleep(min(READY_PROBE_INTERVAL_S, deadline - now))
    return True
