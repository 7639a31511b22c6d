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

For the prompt groups (`gym_failures.collection._groups`) the plan also counts, when asked, each
task's valid members on disk: the rollouts whose success row (the highest attempt's, as the gate takes
it) the live view counts `scored` (`gym_failures.telemetry.rollout_outcome`).
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
from gym_failures.telemetry import rollout_outcome


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
    reopened: bool = False
    """An earlier run closed it (by the budget, or as terminal with `retry_terminal`): reopened."""


@dataclass
class _Recorded:
    """What the run's rows on disk record of each rollout (`rollout_id`)."""

    done: set[str] = field(default_factory=set)
    attempts: dict[str, int] = field(default_factory=dict)
    failure_rows: Counter[str] = field(default_factory=Counter)
    closed: dict[str, set[object]] = field(default_factory=dict)
    """Why each rollout was closed by a final failure row (every such row's reason)."""
    last: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    """The last failure row of each rollout not yet done: what closes it when its budget is spent."""
    scored: dict[str, tuple[int, bool]] | None = None
    """Whether each rollout's success row (its highest attempt's) is valid, when asked for."""

    def used(self, key: str) -> int:
        """The attempts `key` has used: its highest attempt number, or its failure rows when more."""
        return max(self.attempts.get(key, 0), self.failure_rows[key])

    def read(self, config: CollectionConfig, summary: CollectionSummary) -> None:
        """Read both output files' rows (a torn tail cut off first), counting what they hold."""
        for path in (config.output_path, config.failures_path):
            torn = repair_torn_tail(path)
            summary.torn_lines += torn is not None
            scan = JsonlScan(path)
            for row in read_rows(path, scan, config.max_attempts):
                key = row.get("rollout_id")
                if is_rollout_row(row) and isinstance(key, str):
                    self._add(key, row)
            summary.invalid_lines += len(scan.invalid_lines)
            summary.not_persisted_rows += scan.not_persisted
            summary.scans.append(scan)

    def _add(self, key: str, row: dict[str, Any]) -> None:
        attempt = row.get("attempt")
        attempt = attempt if type(attempt) is int else 0
        self.attempts[key] = max(self.attempts.get(key, 0), attempt)
        if "failure" not in row:
            self.done.add(key)
            scored = self.scored
            if scored is not None and (key not in scored or attempt >= scored[key][0]):
                scored[key] = (attempt, rollout_outcome(row).outcome == "scored")
            return
        self.failure_rows[key] += 1  # NeMo Gym counts every sidecar row as an attempt, a final one too
        if row.get("final") is True:
            self.closed.setdefault(key, set()).add(row.get("final_reason"))
        elif key not in self.last or attempt >= self.last[key][0]:
            self.last[key] = (attempt, row)


def pending_rollouts(
    config: CollectionConfig,
    inventory: list[MaterializedRollout],
    summary: CollectionSummary,
    valid: Counter[int] | None = None,
) -> tuple[list[PendingRollout], list[dict[str, Any]]]:
    """Every rollout without a final outcome, at its next attempt number; and the rows that close
    the rollouts whose recorded attempts already use up the budget. With `valid`, each task's done
    rollouts whose success row is valid are counted in it (see the module docstring).

    A rollout closed by the budget (`attempt_budget_exhausted`) is reopened when the budget is now
    larger than its attempts, as NeMo Gym's resume does (nemo_gym/rollout_collection.py:2299, which
    gates only successes, terminal rows and rollouts at the budget); one closed as `terminal` too when
    `retry_terminal` is set; one closed as `possibly_delivered` never.

    A rollout has used as many attempts as its highest attempt number, or as its failure rows when
    they are more (NeMo Gym's rule, one attempt per sidecar row: older rows carry no attempt index).
    """
    recorded = _Recorded(scored=None if valid is None else {})
    recorded.read(config, summary)
    done = recorded.done
    reopenable = {"attempt_budget_exhausted", *(("terminal",) if config.retry_terminal else ())}
    reopened: set[str] = set()
    for key, reasons in recorded.closed.items():
        if key in done:
            continue
        if reasons <= reopenable and recorded.used(key) < config.max_attempts:
            summary.reopened += 1
            reopened.add(key)
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
            if valid is not None and recorded.scored is not None and recorded.scored.get(key, (0, False))[1]:
                valid[item.task_index] += 1
            continue
        used = recorded.used(key)
        if used >= config.max_attempts and key in recorded.last:
            closing.append(
                saved(
                    {
                        **recorded.last[key][1],
                        nemo_gym.AGENT_REF: {"name": agent},
                        "final": True,
                        "final_reason": "attempt_budget_exhausted",
                        "closed_on_resume": True,
                    }
                )
            )
            continue
        rollouts.append(
            PendingRollout(
                item.task_index,
                item.rollout_index,
                task_of(item.row),
                used + 1,
                agent,
                item.row,
                key in reopened,
            )
        )
    return rollouts, closing
