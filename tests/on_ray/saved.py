"""What a Ray test reads back from a run's files: its rows, their plan, and the run's wholeness; and
the config of a run of its own tasks (`config_of`)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from gym_failures.collection import CollectionConfig, read_rows


def config_of(
    directory: Path, agent_url: str, tasks: list[dict[str, Any]], **options: Any
) -> CollectionConfig:
    """A run of `tasks` against `agent_url`, its tasks and output under `directory` (concurrency 4
    and 3 attempts unless `options` say otherwise)."""
    directory.mkdir(parents=True, exist_ok=True)
    tasks_path = directory / "tasks.jsonl"
    tasks_path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return CollectionConfig(
        input_path=tasks_path,
        output_path=directory / "out" / "rollouts.jsonl",
        agent_url=agent_url,
        **{"concurrency": 4, "max_attempts": 3, **options},
    )


def rows_of(config: CollectionConfig) -> list[dict[str, Any]]:
    """The run's success rows, then its failure rows."""
    return list(read_rows(config.output_path)) + list(read_rows(config.failures_path))


def plan_of(rows: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """Each row's rollout, attempt and outcome: what two runs of the same plan agree on."""
    return {
        (
            row["rollout_id"],
            row["attempt"],
            (row.get("failure") or {}).get("failure_kind"),
            row.get("final"),
            row.get("final_reason"),
            (row.get("rollout_failure") or {}).get("delivery"),
        )
        for row in rows
    }


def assert_whole(config: CollectionConfig, rollouts: int) -> list[dict[str, Any]]:
    """Every rollout has one final outcome, its attempts numbered 1..n, none saved twice."""
    rows = rows_of(config)
    keys = [(row["rollout_id"], row["attempt"]) for row in rows]
    assert len(keys) == len(set(keys)), "no attempt is saved twice"
    finals = Counter(row["rollout_id"] for row in rows if "failure" not in row or row["final"])
    assert len(finals) == rollouts
    assert set(finals.values()) == {1}, "exactly one final outcome each"
    attempts: dict[str, list[int]] = {}
    for rollout, attempt in keys:
        attempts.setdefault(rollout, []).append(attempt)
    assert all(sorted(numbers) == list(range(1, len(numbers) + 1)) for numbers in attempts.values())
    return rows
