"""What a written rollout row counts as, and the running counts of a collection for its live view.

`rollout_outcome` reads a row the collector has just written: a success row is `scored`; a failure
row is `failed`, with its responsibility class (`classify_failure` of the `EpisodeFailure`'s kind and
stage, else its failure event's, and the failure event's HTTP status: the evidence the gate uses), its
kind and its exception type (the failure event's `exception_type`, else the Gym failure class of its
boundary, `ModelFailure` for a model server's). `omitted` is an attempt that finished without a row
(its row could not be saved, which ends the run).

`CollectionProgress` is what the collector hands its `on_progress` hook after every change: the
rollouts expected and done (those done on disk when the run started included), this run's successes,
final failures by class, attempts and retried attempts, the rate and an estimated time left.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from gym_failures.failure_kinds import FailureStage, classify_failure
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import failure_type_for
from gym_failures.row_keys import FINAL

__all__ = ["CollectionProgress", "Outcome", "RolloutOutcome", "rollout_outcome"]

Outcome = Literal["scored", "failed", "omitted"]
_STAGES: frozenset[str] = frozenset(get_args(FailureStage))


@dataclass(frozen=True, slots=True)
class RolloutOutcome:
    """What one finished attempt's row says, in the terms a counter and a live view count."""

    outcome: Outcome
    final: bool
    """Whether the rollout has its outcome (a success, or a failure that is not retried)."""
    failure_class: str | None = None
    failure_kind: str | None = None
    failure_type: str | None = None


def rollout_outcome(row: Mapping[str, Any]) -> RolloutOutcome:
    """The outcome of a row the collector wrote (a success row or a failure row)."""
    if "failure" not in row:
        return RolloutOutcome("scored", final=True)
    failure = row.get("failure")
    failure = failure if isinstance(failure, Mapping) else {}
    report = FailureReportRow.report(row)
    event = report.events.get(report.failure_id) if report.failure_id is not None else None
    kind = failure.get("failure_kind")
    if not isinstance(kind, str):
        kind = event.failure_kind if event is not None else None
    stage = failure.get("stage")
    if not (isinstance(stage, str) and stage in _STAGES):
        stage = event.stage if event is not None else None
    status = event.http_status if event is not None else None
    failure_type = None
    if event is not None:
        failure_type = event.exception_type or failure_type_for(event.boundary).__name__
    return RolloutOutcome(
        "failed",
        final=row.get("final", row.get(FINAL)) is True,  # saved as `_gf_final` (`gym_failures.row_keys`)
        failure_class=classify_failure(kind, stage, status).value,  # type: ignore[arg-type]
        failure_kind=kind,
        failure_type=failure_type,
    )


@dataclass
class CollectionProgress:
    """A collection's running counts; `done` counts rollouts, `attempts` dispatches, both this run's
    and (for `done`) those already finished on disk when it started."""

    expected: int = 0
    already_done: int = 0
    succeeded: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    """Rollouts whose final outcome is a failure, by class (`model`, `evaluation`, `unknown`)."""
    attempts: int = 0
    retried: int = 0
    """Failed attempts that will be dispatched again."""
    omitted: int = 0
    reopened: int = 0
    """Rollouts an earlier run closed that this run tries again (a raised budget, `retry_terminal`)."""
    backing_off: int = 0
    """Rollouts waiting out a backoff or a `Retry-After` before their next attempt."""
    agent_wait_s: float | None = None
    """Seconds dispatch has been paused waiting for the agent to accept connections; None when not."""
    started: float = field(default_factory=time.monotonic)

    @property
    def done(self) -> int:
        return self.already_done + self.finished

    @property
    def finished(self) -> int:
        """Rollouts this run brought to an outcome."""
        return self.succeeded + sum(self.failed.values())

    @property
    def rate(self) -> float:
        """Rollouts this run finished per second since it started."""
        elapsed = time.monotonic() - self.started
        return self.finished / elapsed if elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds until every expected rollout is done at the current rate; None before a rate."""
        remaining = max(0, self.expected - self.done)
        if remaining == 0:
            return 0.0
        rate = self.rate
        return remaining / rate if rate > 0 else None

    def add(self, outcome: RolloutOutcome, *, dispatched: bool = True) -> None:
        """Count one saved row; `dispatched` is false for a row that closes a rollout without an
        attempt (its recorded attempts already used up the budget)."""
        self.attempts += dispatched
        if outcome.outcome == "scored":
            self.succeeded += 1
        elif outcome.outcome == "omitted":
            self.omitted += 1
        elif outcome.final:
            key = outcome.failure_class or "unknown"
            self.failed[key] = self.failed.get(key, 0) + 1
        else:
            self.retried += 1
