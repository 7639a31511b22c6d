"""What a written rollout row counts as, and the running counts of a collection for its live view.

`rollout_outcome` reads a row the collector has just written. A success row is counted as the gate
counts it (`gym_failures.gate`, its default rules), so that "scored" means one thing in the live
view, the metrics and the gate: `scored` when it holds a measurement (a verdict, else a finite
`reward`) and no gate class; `masked` when NeMo Gym's `mask_sample` is true; `tainted` when its
report names a failure of its own (a call its answer was built on ended in failure: never scored by
default, `gym_failures.gate`), with that failure's kind and class; `gate_derived` when a
gate rule names a kind (`truncated_answer`, `grading_without_verdict`...), which it carries with its
class. A scored result that names a `failure_kind` without `mask_sample` is `degraded` too. A failure
row is `failed`, with its responsibility class (`classify_failure` of the `EpisodeFailure`'s kind and
stage, else its failure event's, and the failure event's HTTP status: the evidence the gate uses), its
kind and its exception type (the failure event's `exception_type`, else the Gym failure class of its
boundary, `ModelFailure` for a model server's). `omitted` is an attempt that finished without a row
(its row could not be saved, which ends the run). Every outcome also carries what its row says the
attempt cost (`cost`: its seconds, tokens and model attempts, read strictly by
`gym_failures.reporting._cost_keys.row_cost`; nothing for a row that reports none).

`CollectionProgress` is what the collector hands its `on_progress` hook after every change: the
rollouts expected and done (those done on disk when the run started included), this run's successes,
final failures by class, attempts and retried attempts, the rate and an estimated time left.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from gym_failures.failure_kinds import FailureStage, classify_failure
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import failure_type_for
from gym_failures.nemo_gym import FAILURE_CLASS, nemo_label
from gym_failures.reporting._cost_keys import NO_COST, RowCost, row_cost
from gym_failures.row_keys import FINAL

__all__ = ["CollectionProgress", "Outcome", "RolloutOutcome", "rollout_outcome"]

Outcome = Literal["scored", "masked", "tainted", "gate_derived", "failed", "omitted"]
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
    degraded: bool = False
    """A scored result that names a `failure_kind` without `mask_sample`: measured, but degraded."""
    cost: RowCost = NO_COST
    """What the row says the attempt cost: nothing reported unless the row carries the cost keys."""
    rerun: bool = False
    """Whether the attempt is a re-run: past its rollout's first (its attempt number above 1), as
    `summarize` counts what re-runs cost."""


def _success_outcome(read: Mapping[str, Any], cost: RowCost) -> RolloutOutcome:
    """A success row's outcome (`read`: the row as `gym_failures.rows.normalized` reads it), as the
    gate's default rules count it."""
    # Imported here: the gate's modules are loaded only once a success row is counted.
    from gym_failures.gate import derive_gate_kind, gate_kind_class, tainted_failure
    from gym_failures.nemo_gym import degraded_kind

    if read.get("masked") is True:
        return RolloutOutcome("masked", final=True, cost=cost)
    tainted = tainted_failure(read)
    if tainted is not None:
        return RolloutOutcome("tainted", True, failure_class=tainted[1], failure_kind=tainted[0], cost=cost)
    kind = derive_gate_kind(read)
    if kind is not None:
        return RolloutOutcome(
            "gate_derived", True, failure_class=gate_kind_class(kind), failure_kind=kind, cost=cost
        )
    return RolloutOutcome("scored", final=True, degraded=degraded_kind(read) is not None, cost=cost)


def rollout_outcome(row: Mapping[str, Any]) -> RolloutOutcome:
    """The outcome of a row the collector wrote (a success row or a failure row), with its cost and
    whether it is a re-run."""
    from gym_failures.rows import normalized

    read = normalized(row)
    attempt = read.get("attempt")
    return replace(_outcome(row, read), rerun=type(attempt) is int and attempt > 1)


def _outcome(row: Mapping[str, Any], read: Mapping[str, Any]) -> RolloutOutcome:
    cost = row_cost(row)
    # A NeMo Gym agent's flat failure row (`collect --agent-protocol nemo-gym`) has no `failure`: its
    # `_ng_failure_class` says it failed, and names its kind.
    label = nemo_label(row.get(FAILURE_CLASS))
    if "failure" not in row and label is None:
        return _success_outcome(read, cost)
    failure = row.get("failure")
    failure = failure if isinstance(failure, Mapping) else {}
    report = FailureReportRow.report(row)
    event = report.events.get(report.failure_id) if report.failure_id is not None else None
    kind = failure.get("failure_kind", label)
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
        cost=cost,
    )


@dataclass
class CollectionProgress:
    """A collection's running counts; `done` counts rollouts, `attempts` dispatches, both this run's
    and (for `done`) those already finished on disk when it started."""

    expected: int = 0
    already_done: int = 0
    succeeded: int = 0
    """Rollouts whose final outcome is a success: scored, masked, tainted or gate-derived."""
    scored: int = 0
    """Successes the gate scores (a measurement, no gate class), as `Coverage.scored` counts them."""
    degraded: int = 0
    """Of `scored`, the results that name a `failure_kind` without `mask_sample`."""
    masked: int = 0
    tainted: dict[str, int] = field(default_factory=dict)
    """Successes built on a call that ended in failure (not scored), by the failure's class."""
    tainted_by_kind: dict[str, int] = field(default_factory=dict)
    gate_derived: dict[str, int] = field(default_factory=dict)
    """Successes a gate rule names a kind for, by class (`model`, `evaluation`, `unknown`)."""
    gate_derived_by_kind: dict[str, int] = field(default_factory=dict)
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
    breaker: str | None = None
    """While the breaker holds dispatch to probes: the failure it opened on, `<kind> at <boundary>`."""
    failed_attempts_by_kind: dict[str, int] = field(default_factory=dict)
    """This run's failed attempts (final or retried) by kind, `(none)` for a failure without one."""
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
        if outcome.outcome in ("scored", "masked", "tainted", "gate_derived"):
            self.succeeded += 1
            if outcome.outcome == "scored":
                self.scored += 1
                self.degraded += outcome.degraded
            elif outcome.outcome == "masked":
                self.masked += 1
            elif outcome.outcome == "tainted":
                key = outcome.failure_class or "unknown"
                self.tainted[key] = self.tainted.get(key, 0) + 1
                kind = outcome.failure_kind or "(none)"
                self.tainted_by_kind[kind] = self.tainted_by_kind.get(kind, 0) + 1
            else:
                key = outcome.failure_class or "unknown"
                self.gate_derived[key] = self.gate_derived.get(key, 0) + 1
                kind = outcome.failure_kind or "(none)"
                self.gate_derived_by_kind[kind] = self.gate_derived_by_kind.get(kind, 0) + 1
            return
        if outcome.outcome == "omitted":
            self.omitted += 1
            return
        if dispatched:
            kind = outcome.failure_kind or "(none)"
            self.failed_attempts_by_kind[kind] = self.failed_attempts_by_kind.get(kind, 0) + 1
        if outcome.final:
            key = outcome.failure_class or "unknown"
            self.failed[key] = self.failed.get(key, 0) + 1
        else:
            self.retried += 1
