"""The breaker for fast failures (issue 30): a run whose attempts all fail alike stops spending budgets.

The readiness pause (`_collector`, `_pacing`) stops a run whose agent is gone; an agent that answers
at once with the same failure every time (its model server down behind it) passes that probe, and
every rollout would spend its whole budget on the one failure (NeMo Gym #2527: 6.17 million retries
in 22.5 h). The breaker (`Breaker`, one a run) watches the attempts as they are recorded, across
rollouts:

- **It opens** when the last `breaker_attempts` (N, 10 by default) attempts all failed with the same
  kind at the same boundary (`failure_signature`). Dispatch then takes no new attempt; the attempts
  in flight come back and count as any; then one rollout at a time is probed.
- **It closes** (full concurrency again) on any attempt that is not that failure: a success, an
  omitted attempt, or a failure of another kind or at another boundary (which starts a run of its
  own). So a mix of failures never opens it, nor N - 1 alike with a success after them.
- **It ends the run** when `BREAKER_PROBES` (3) probes in a row failed the same way: `BreakerOpen`,
  the rollouts not yet final kept, those never tried without a row (their budgets whole: a resume
  sends them at attempt 1).

A probe is a real attempt of a real rollout: it counts against that rollout's budget, and its row is
saved as any. It is a rollout of a task the run of failures did not come from (one broken task, its
repeats dispatched together and retried first, makes a run of its own that says nothing about the
agent; a rollout of another task does), not yet tried when there is one (it spends the first attempt
of a whole budget, not the last of a retried one), else a retry; so the 3 probes that end a run are
of 3 more tasks. When every open rollout is of a task the failures came from (a broken task at the
end of a run), no probe could tell a broken task from a broken dependency: the breaker stands down
for the rest of the run, and those rollouts spend their budgets as without it. Before each probe
dispatch waits, on the collector's clock, the run's backoff (`--backoff-initial` to `--backoff-max`,
decorrelated, as a rollout's retries wait), or the last failure's own hint (`Retry-After`, a quota's
reset) when it asked for longer: a probe sent at once would meet the same failure.

N = 10: prime-rl stops a run after 10 consecutive errored rollouts (#2835), and 10 attempts alike in
a row, with no success between them, is what a down dependency makes at once and what ordinary
failures (a few per cent of attempts, of several kinds, among successes) almost never make: at a 20 %
rate of one kind, 10 in a row is 1 in 10 million; and an opened breaker that is wrong costs a pause,
not the run, as the probe succeeds.

A failed attempt's kind is the one its row's `rollout_failure` record names (both agent protocols
write one on every failure row); its boundary is the boundary of the failure its saved report names
(`_ng_failure_id` in `_ng_failure_events`), and for a row whose report names none (an episode failure
answered without a report, a NeMo Gym agent's flat failure row) the side that answered it:
`collection` when the collector saw the failure itself (no reply came), else `agent`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gym_failures.collection._pacing import Backoff
from gym_failures.failure_transport import FailureReportRow

if TYPE_CHECKING:
    from gym_failures.collection._attempt_row import AttemptRow
    from gym_failures.collection._schedule import Retry
    from gym_failures.collection._summary import CollectionSummary

__all__ = [
    "BREAKER_ATTEMPTS",
    "BREAKER_PROBES",
    "Breaker",
    "BreakerOpen",
    "BreakerTrip",
    "failure_signature",
]

BREAKER_ATTEMPTS = 10
"""Attempts in a row, across rollouts, failed with the same kind at the same boundary: the breaker
opens (`CollectionConfig.breaker_attempts`, `collect --breaker`)."""
BREAKER_PROBES = 3
"""Probes in a row that fail the same way, one at a time, before the breaker ends the run."""

Change = Literal["opened", "closed", "gave_up"]
"""What an attempt did to the breaker."""


def failure_signature(outcome: AttemptRow) -> tuple[str, str] | None:
    """A failed attempt's kind and boundary (see the module docstring); None for a success or an
    attempt without a row."""
    if outcome.succeeded or not outcome.persisted:
        return None
    row = outcome.row
    record = row.get("rollout_failure")
    record = record if isinstance(record, dict) else {}
    failure = record.get("failure", row.get("failure"))
    kind = failure.get("failure_kind") if isinstance(failure, dict) else None
    events, failure_id = row.get(FailureReportRow.EVENTS), row.get(FailureReportRow.FAILURE_ID)
    event = events.get(failure_id) if isinstance(events, dict) and isinstance(failure_id, str) else None
    boundary = event.get("boundary") if isinstance(event, dict) else None
    if not isinstance(boundary, str):
        boundary = "collection" if record.get("source") == "collector" else "agent"
    return (kind if isinstance(kind, str) else "(none)", boundary)


@dataclass(frozen=True)
class BreakerTrip:
    """The failure the breaker ended a run on (`CollectionSummary.breaker`, `collect --json`'s
    `breaker`)."""

    failure_kind: str
    boundary: str
    in_a_row: int
    """Attempts in a row, across rollouts, that failed with this kind at this boundary, probes included."""
    probes: int
    """Of them, the probes sent one at a time once the breaker opened."""
    breaker_attempts: int
    """The run's N (`--breaker`)."""


class BreakerOpen(Exception):
    """The breaker ended the run: its last attempts all failed the same way, and so did its probes.
    The rollouts not yet final are kept; those never tried have no row, their budgets whole."""

    def __init__(self, reason: str, trip: BreakerTrip, summary: CollectionSummary) -> None:
        super().__init__(reason)
        self.reason = reason
        self.trip = trip
        self.summary = summary
        """What the run did up to its end, `summary.breaker` the trip."""


class Breaker:
    """One run's breaker: `saw` each recorded attempt, in the order they are recorded."""

    def __init__(self, attempts: int, backoff: Backoff) -> None:
        self.attempts = attempts
        """N; 0 turns the breaker off."""
        self.failure: tuple[str, str] | None = None
        """The kind and boundary of the run of failures the last attempts make; None after a success."""
        self.in_a_row = 0
        self.tasks: set[int] = set()
        """The tasks the run of failures came from: no probe is taken from them."""
        self.is_open = False
        self.probes = 0
        """Probes that failed the same way since the breaker opened."""
        self._backoff = backoff
        self._hint_s = 0.0

    @property
    def gave_up(self) -> bool:
        """Its probes failed as the attempts before them did: the run ends (`BreakerOpen`)."""
        return self.is_open and self.probes >= BREAKER_PROBES

    @property
    def shown(self) -> str:
        """`<kind> at <boundary>`, as the live line says it."""
        kind, boundary = self.failure or ("(none)", "(none)")
        return f"{kind} at {boundary}"

    def saw(self, outcome: AttemptRow, retry: Retry | None, task: int, *, probe: bool) -> Change | None:
        """Count one recorded attempt of a rollout of `task` (`probe`: the one dispatch let through
        while the breaker is open); what it changed, if anything."""
        if self.attempts <= 0:
            return None
        failure = failure_signature(outcome)
        self._hint_s = retry.wait_s if retry is not None and retry.wait_from == "retry_after" else 0.0
        if failure is not None and failure == self.failure:
            self.in_a_row += 1
            self.tasks.add(task)
            if not self.is_open:
                self.is_open = self.in_a_row >= self.attempts
                return "opened" if self.is_open else None
            self.probes += probe
            return "gave_up" if self.probes >= BREAKER_PROBES else None
        # Another outcome: a success, or another failure, which starts a run of its own.
        was_open = self.is_open
        self.failure, self.in_a_row, self.probes = failure, int(failure is not None), 0
        self.tasks.clear()
        if failure is not None:
            self.tasks.add(task)
        self.is_open = failure is not None and self.in_a_row >= self.attempts
        if self.is_open:
            return "opened"
        if was_open:
            self._backoff.forget(_KEY)
            return "closed"
        return None

    def stand_down(self) -> None:
        """Off for the rest of the run: every open rollout is of a task the failures came from, and
        no probe could tell a broken task from a broken dependency (their budgets bound them)."""
        self.attempts = 0
        self.is_open = False

    def probe_wait(self) -> float:
        """The wait before the next probe: the run's backoff, or the last failure's hint when longer
        (rounded to the millisecond, as a row's wait is)."""
        return round(max(self._backoff.wait(_KEY), self._hint_s), 3)

    def trip(self) -> BreakerTrip:
        kind, boundary = self.failure or ("(none)", "(none)")
        return BreakerTrip(kind, boundary, self.in_a_row, self.probes, self.attempts)


_KEY = "\0breaker"
"""The breaker's own key in the run's `Backoff` (no rollout id holds a NUL)."""
