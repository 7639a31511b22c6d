"""Resume under retry rules: a rollout a rule gives more attempts than `max_attempts` stays open.

The resume plan (`gym_failures.collection._resume`) knows one budget, `max_attempts`: it closes a
rollout whose attempts use it up (`closed_on_resume`), and reopens one an earlier run closed by the
budget when `max_attempts` is now larger. With rules a failure's budget may be larger than that. So
when a rule's `max_attempts` is larger, `with_rule_budgets` plans again at the largest budget, and
for each rollout that plan keeps open and the first one did not (closed by this resume, or closed
before by `attempt_budget_exhausted`), matches the rules against its last failure row, as saved
(`facts_of_row`: its kind, reason, stage and status; a NeMo Gym row's label read as its kind): a rule
whose budget is more than the attempts the rollout used keeps it open, at its next attempt number.
Any other rollout is planned as without rules.

Not reopened: a rollout a rule or its cap closed (`retry_rule_budget_exhausted`, `retry_cap_reached`)
stays closed, as one closed as `terminal` does (NeMo Gym's resume reads the row's
`_ng_failure_terminal`, true on such rows, and agrees). A rollout left open whose last failure a rule
now gives fewer attempts than it used (the rules changed between runs) is sent once more, and that
attempt's failure closes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gym_failures import _http_status, nemo_gym
from gym_failures.collection._config import CollectionConfig
from gym_failures.collection._resume import PendingRollout, pending_rollouts
from gym_failures.collection._retry_rules import FailureFacts
from gym_failures.collection._summary import CollectionSummary
from gym_failures.failure_transport import FailureReportRow
from gym_failures.materialized import MaterializedRollout
from gym_failures.rows import JsonlScan, is_rollout_row, read_rows, rollout_id


def facts_of_row(row: Mapping[str, Any]) -> FailureFacts:
    """What a rule matches a saved failure row (read by `gym_failures.rows.read_rows`) on; the status
    as the dispatcher sees it: the report's failure event's, else the failed reply's."""
    failure = row.get("failure")
    failure = failure if isinstance(failure, Mapping) else {}
    kind, reason, stage = (failure.get(name) for name in ("failure_kind", "failure_reason", "stage"))
    status = None
    report = FailureReportRow.report(row)
    event = report.events.get(report.failure_id) if report.failure_id is not None else None
    if event is not None and _http_status.is_error(_http_status.http_status(event.http_status)):
        status = _http_status.http_status(event.http_status)
    if status is None:
        status = _http_status.http_status(row.get(nemo_gym.FAILURE_HTTP_STATUS))
    return FailureFacts(
        kind if isinstance(kind, str) else None,
        reason if isinstance(reason, str) else "",
        stage if isinstance(stage, str) else None,
        status if _http_status.is_error(status) else None,
    )


def with_rule_budgets(
    config: CollectionConfig,
    inventory: list[MaterializedRollout],
    rollouts: list[PendingRollout],
    closing: list[dict[str, Any]],
    summary: CollectionSummary,
) -> tuple[list[PendingRollout], list[dict[str, Any]]]:
    """The resume plan (`rollouts` to dispatch, `closing` rows), with the rollouts the rules give more
    attempts than `max_attempts` kept open (see the module docstring); `summary` counts those an
    earlier run closed as reopened."""
    largest = config.retry_rules.largest_budget(config.max_attempts)
    if largest <= config.max_attempts:
        return rollouts, closing
    wider = config.model_copy(update={"max_attempts": largest})
    open_now = {rollout_id(rollout.task_index, rollout.rollout_index) for rollout in rollouts}
    candidates = {
        key: rollout
        for rollout in pending_rollouts(wider, inventory, CollectionSummary())[0]
        if (key := rollout_id(rollout.task_index, rollout.rollout_index)) not in open_now
    }
    if not candidates:
        return rollouts, closing
    last = _last_failures(config, set(candidates))
    kept: dict[str, PendingRollout] = {}
    for key, rollout in candidates.items():
        row = last.get(key)
        if row is None:
            continue
        budget = config.retry_rules.decide(facts_of_row(row), config.max_attempts).max_attempts
        if rollout.next_attempt <= budget:
            kept[key] = rollout
    closed_here = {row.get("rollout_id") for row in closing}
    reopened = sum(key not in closed_here for key in kept)
    summary.reopened += reopened
    summary.already_done -= reopened
    return [*rollouts, *kept.values()], [row for row in closing if row.get("rollout_id") not in kept]


def _last_failures(config: CollectionConfig, keys: set[str]) -> dict[str, dict[str, Any]]:
    """The last failure row (the highest attempt's; the later of equals) of each rollout of `keys`."""
    last: dict[str, tuple[int, dict[str, Any]]] = {}
    path = config.failures_path
    for row in read_rows(path, JsonlScan(path), config.max_attempts):
        key = row.get("rollout_id")
        if not is_rollout_row(row) or key not in keys or "failure" not in row:
            continue
        assert isinstance(key, str)
        attempt = row.get("attempt")
        attempt = attempt if type(attempt) is int else 0
        if key not in last or attempt >= last[key][0]:
            last[key] = (attempt, row)
    return {key: row for key, (_, row) in last.items()}
