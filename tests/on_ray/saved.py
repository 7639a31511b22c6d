"""What a Ray test reads back from a run's files: its rows, their plan, and the run's wholeness."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gym_failures.collection import CollectionConfig, read_rows


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
