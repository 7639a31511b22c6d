"""Resume planning: which rollouts of the inventory are still open, at which attempt each goes on.

Both output files are read, in any form NeMo Gym or gym-failures wrote
(`gym_failures.rows.normalized`; rows NeMo Gym marked never to be saved are ignored and counted); a
rollout with a success row or a final failure row is done, and any other continues at its next attempt
number (`PendingRollout.next_attempt`): one past the highest attempt, or past its number of failure
rows when that is more (older NeMo Gym rows carry no attempt index), which is NeMo Gym's
`_ng_attempt_index` continued.

A rollout whose recorded attempts already use up `max_attempts` (lowered since the earlier run) is
not dispatched again: a copy of its last failure row closes it (`final_reason`
`attempt_budget_exhausted`, `closed_on_resume` true). A resume with a larger `max_attempts` reopens
the rollouts the budget closed (and, with `retry_terminal`, those closed as terminal), continuing their
attempt numbers; one closed as `possibly_delivered` is never reopened.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gym_failures import nemo_gym
from gym_failures.collection._config import CollectionConfig
from gym_failures.collection._summary import CollectionSummary
from gym_failures.materialized import MaterializedRollout, task_of
from gym_failures.row_keys import saved
from gym_failures.rows import JsonlScan, is_rollout_row, read_rows, repair_torn_tail, rollout_id


@dataclass
class PendingRollout:
    """A rollout without a final outcome, and the attempt number it continues at."""

    task_index: int
    rollout_index: int
    task: dict[str, Any]
    next_attempt: int
    agent_name: str = "agent"
    """Its rows' `agent_ref.name`."""
    materialized: dict[str, Any] = field(default_factory=dict)
    """Its materialized row, as the run's materialized inputs hold it: what the `nemo-gym` protocol sends."""


def pending_rollouts(
    config: CollectionConfig, inventory: list[MaterializedRollout], summary: CollectionSummary
) -> tuple[list[PendingRollout], list[dict[str, Any]]]:
    """Every rollout without a final outcome, at its next attempt number; and the rows that close
    the rollouts whose recorded attempts already use up the budget.

    A rollout closed by the budget (`attempt_budget_exhausted`) is reopened when the budget is now
    larger than its attempts, as NeMo Gym's resume does (nemo_gym/rollout_collection.py:2299, which
    gates only successes, terminal rows and rollouts at the budget); one closed as `terminal` too when
    `retry_terminal` is set; one closed as `possibly_delivered` never.

    A rollout has used as many attempts as its highest attempt number, or as its failure rows when
    they are more (NeMo Gym's rule, one attempt per sidecar row: older rows carry no attempt index).
    """
    done: set[str] = set()
    attempts: dict[str, int] = {}
    failure_rows: Counter[str] = Counter()
    # Why each rollout was closed by a final failure row (every such row's reason).
    closed: dict[str, set[object]] = {}
    # The last failure row of each rollout not yet done: what closes it when its budget is spent.
    last: dict[str, tuple[int, dict[str, Any]]] = {}
    for path in (config.output_path, config.failures_path):
        torn = repair_torn_tail(path)
        summary.torn_lines += torn is not None
        scan = JsonlScan(path)
        for row in read_rows(path, scan, config.max_attempts):
            key = row.get("rollout_id")
            if not is_rollout_row(row) or not isinstance(key, str):
                continue
            attempt = row.get("attempt")
            attempt = attempt if type(attempt) is int else 0
            attempts[key] = max(attempts.get(key, 0), attempt)
            if "failure" not in row:
                done.add(key)
                continue
            failure_rows[key] += 1  # NeMo Gym counts every sidecar row as an attempt, a final one too
            if row.get("final") is True:
                closed.setdefault(key, set()).add(row.get("final_reason"))
                continue
            if key not in last or attempt >= last[key][0]:
                last[key] = (attempt, row)
        summary.invalid_lines += len(scan.invalid_lines)
        summary.not_persisted_rows += scan.not_persisted
        summary.scans.append(scan)
    reopenable = {"attempt_budget_exhausted", *(("terminal",) if config.retry_terminal else ())}
    for key, reasons in closed.items():
        if key in done:
            continue
        if reasons <= reopenable and max(attempts.get(key, 0), failure_rows[key]) < config.max_attempts:
            summary.reopened += 1
        else:
            done.add(key)
    rollouts: list[PendingRollout] = []
    closing: list[dict[str, Any]] = []
    for item in inventory:
        key = rollout_id(item.task_index, item.rollout_index)
        agent = item.agent_name or config.agent_name
        summary.expected += 1
        if key in done:
            summary.already_done += 1
            continue
        used = max(attempts.get(key, 0), failure_rows[key])
        if used >= config.max_attempts and key in last:
            closing.append(
                saved(
                    {
                        **last[key][1],
                        nemo_gym.AGENT_REF: {"name": agent},
                        "final": True,
                        "final_reason": "attempt_budget_exhausted",
                        "closed_on_resume": True,
                    }
                )
            )
            continue
        rollouts.append(
            PendingRollout(item.task_index, item.rollout_index, task_of(item.row), used + 1, agent, item.row)
        )
    return rollouts, closing
