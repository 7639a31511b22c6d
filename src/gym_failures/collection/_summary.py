"""What a collection run did, and what it found on disk when it started: `CollectionSummary`.

Filled in by the run's steps in turn: the inventory (`_inventory`: tasks, blank and invalid task
lines, invalid materialized lines), the resume plan (`_resume`: expected, already done, reopened, torn
and invalid row lines), then the collector (`_collector`: attempts, successes, final failures,
omitted attempts, dispatch errors, the breaker's trip).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gym_failures.collection._breaker import BreakerTrip
from gym_failures.rows import JsonlScan


@dataclass
class CollectionSummary:
    """What a run did, and what it found on disk when it started."""

    expected: int = 0
    already_done: int = 0
    succeeded: int = 0
    failed_final: int = 0
    closed_on_resume: int = 0
    """Rollouts closed without a dispatch: their attempts already used up a lowered budget."""
    reopened: int = 0
    """Rollouts an earlier run closed (by the budget, or as terminal with `retry_terminal`) tried again:
    the budget is now larger than their attempts."""
    attempts: int = 0
    dispatch_errors: int = 0
    """Attempts recorded as `collection_dispatch_failed`: an unexpected fault of the collector."""
    torn_lines: int = 0
    invalid_lines: int = 0
    tasks: int = 0
    blank_task_lines: int = 0
    invalid_task_lines: int = 0
    not_persisted_rows: int = 0
    """Rows on disk that NeMo Gym marked never to be saved: ignored by the resume."""
    invalid_materialized_lines: int = 0
    """Lines of the run's materialized inputs that name no rollout (or one already named): skipped."""
    omitted: int = 0
    """Attempts whose reply NeMo Gym's protocol marks never to be saved (`_ng_no_persist`): no row."""
    left_open: int = 0
    """Rollouts without a final outcome a `fill_short_groups` resume left as they are: no short group
    needed them (`gym_failures.collection._groups`). A later resume dispatches (or closes) them."""
    unfillable_groups: int = 0
    """Groups a `fill_short_groups` resume could not bring to `min_valid_per_group` valid members, even
    if every member it may re-run came back valid: left as they are."""
    breaker: BreakerTrip | None = None
    """The failure the breaker ended the run on (`BreakerOpen`); None when it did not."""
    scans: list[JsonlScan] = field(default_factory=list)
