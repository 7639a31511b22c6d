"""The logical calls of a journal: which attempts are one call, and how that is known (its basis).

The verdict's unit is the logical call (`gym_failures.calls`): every attempt a client makes for one
request, its SDK's retries and its own, in order; its outcome is its last attempt. Never the request
body: RL collection sends identical bodies on purpose (`num_repeats`, groups), so a hundred rollouts
of five prompts are a hundred calls, not five.

Each attempt is grouped by the first basis it allows (`BASES`):

    call_id  it names a call (`X-Gym-Call-Id`): every attempt naming the same id is one call. Certain.
    sdk      no call id, but the official SDKs' `x-stainless-retry-count`: a count of 0 opens a new
             call; a count n > 0 joins the most recent open sdk call with the same body whose last
             attempt had count n - 1 and failed before this one started; if none fits, it opens its
             own call. When several fit (rollouts of one prompt, each waiting to retry), which one it
             retried is a guess: the call keeps the others' last attempts (`alternatives`).
    guess    neither: it joins the most recent guessed call with the same body whose last attempt
             FAILED and ENDED before it started (nobody retries a success, and an attempt that
             overlaps another is not its retry); otherwise it opens a new call.

Decisions:
- "Before it started" is the moment the client could know of the failure (`known_s`: a failed
  status's status line, else the reply's end) against the next attempt's arrival, on the server's one
  clock: causally ordered, no slack needed. One exception, for the sdk basis only: a reply the client
  left (`disconnected`) is seen ended by the server only when it notices, which can be after the
  SDK's retry arrived; the retry count already says it is that attempt's retry.
- "Most recent" is the open call whose last attempt started last: in-flight calls (which do not fit)
  are the most recent ones, so the search stops after about as many calls as were in flight.
- A call's attempt count (`Call.attempt_count`) is the number of its attempts in the journal, or the
  highest attempt number the client gave (`call_attempt`, `sdk_retry_count + 1`) when that is larger:
  a journal that forgot old attempts still knows how far the client went.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from gym_failures._http_status import is_error, is_server_error
from gym_failures.model_endpoint._journal import Attempt

__all__ = ["BASES", "Basis", "Call", "by_basis", "failed", "group_calls", "known_s", "retryable"]

Basis = Literal["call_id", "sdk", "guess"]
BASES: tuple[Basis, ...] = ("call_id", "sdk", "guess")
"""The grouping bases, from certain to guessed."""

BREAKS = ("dropped", "cut", "failed_stream", "malformed", "disconnected")
"""The outcomes of a reply that broke off or ended in failure without an error status."""


@dataclass(slots=True)
class Call:
    """One logical call: its key, how its attempts were grouped, and its attempts in order."""

    key: str
    """`id:<call id>`, or `<request>@<index of its first attempt>` for the sdk and guess bases."""
    basis: Basis
    attempts: list[Attempt] = field(default_factory=list)
    alternatives: dict[int, list[Attempt]] = field(default_factory=dict)
    """For an SDK retry that several open calls with its body awaited (by the retry's index): the last
    attempts of the calls it was not joined to. Which one it retried is a guess; the verdict judges
    its timing against each."""

    @property
    def last(self) -> Attempt:
        """The attempt whose outcome is the call's."""
        return self.attempts[-1]

    @property
    def attempt_count(self) -> int:
        """How many attempts the call made (see the module's docstring)."""
        count = len(self.attempts)
        for attempt in self.attempts:
            if attempt.call_attempt is not None:
                count = max(count, attempt.call_attempt)
            if attempt.sdk_retry_count is not None:
                count = max(count, attempt.sdk_retry_count + 1)
        return count


def failed(attempt: Attempt) -> bool:
    """Whether the attempt failed: an error status, or a reply that broke off or failed."""
    return attempt.outcome != "ok" or is_error(attempt.status)


def retryable(attempt: Attempt) -> bool:
    """Whether a retry can recover from the attempt's failure: 408, 409, 429 and every 5xx (the
    official SDKs' rule), a broken reply, and a reply the client left (its own timeout)."""
    if attempt.outcome in BREAKS:
        return True
    status = attempt.status
    return is_server_error(status) or status in (408, 409, 429)


def known_s(attempt: Attempt) -> float:
    """When the client could know how the attempt ended: a failed status from its status line (an
    SDK streaming a request reads no further), anything else at the reply's end."""
    if attempt.outcome == "failed" and attempt.answered_s is not None:
        return attempt.answered_s
    return attempt.ended_s


def group_calls(attempts: Iterable[Attempt]) -> list[Call]:
    """The calls of `attempts`, in the order they began (see the module's docstring)."""
    served = sorted(attempts, key=lambda a: (a.started_s, a.index))
    calls: list[Call] = []
    named: dict[str, Call] = {}
    # The open calls (last attempt failed) of each basis and body, least recent first.
    open_calls: dict[tuple[Basis, str], dict[str, Call]] = {}

    def opened(attempt: Attempt, basis: Basis, key: str) -> Call:
        call = Call(key, basis, [attempt])
        calls.append(call)
        return call

    for attempt in served:
        if attempt.call_id is not None:
            call = named.get(attempt.call_id)
            if call is None:
                named[attempt.call_id] = opened(attempt, "call_id", f"id:{attempt.call_id}")
            else:
                call.attempts.append(attempt)
            continue
        basis: Basis = "sdk" if attempt.sdk_retry_count is not None else "guess"
        waiting = open_calls.setdefault((basis, attempt.request), {})
        joined = None
        if basis == "guess" or attempt.sdk_retry_count:
            fits = (c for c in reversed(waiting.values()) if _retries(c.last, attempt, basis))
            joined = next(fits, None)
            if joined is not None and basis == "sdk":
                others = [c.last for c in fits]
                if others:
                    joined.alternatives[attempt.index] = others
        if joined is None:
            joined = opened(attempt, basis, f"{attempt.request}@{attempt.index}")
        else:
            joined.attempts.append(attempt)
            del waiting[joined.key]
        if failed(attempt):
            waiting[joined.key] = joined
    return calls


def _retries(last: Attempt, attempt: Attempt, basis: Basis) -> bool:
    """Whether `attempt` can be the retry of `last`, the last attempt of an open call of `basis`."""
    if basis == "sdk":
        if last.sdk_retry_count is None or attempt.sdk_retry_count != last.sdk_retry_count + 1:
            return False
        return last.outcome == "disconnected" or known_s(last) <= attempt.started_s
    return known_s(last) <= attempt.started_s


def by_basis(calls: Iterable[Call]) -> dict[str, int]:
    """How many calls each basis grouped, every basis named."""
    counted = Counter(call.basis for call in calls)
    return {basis: counted[basis] for basis in BASES}
