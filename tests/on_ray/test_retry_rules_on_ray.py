"""Retry rules on Ray (issue 30): the workers' dispatchers decide each failure's budget by the rules,
and the driver, which saves every row, counts a rule's run-wide cap; a Ray run's rows say what a
local run's say."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gym_failures.collection import CollectionConfig, collect, read_rows
from gym_failures.ray import collect_on_ray

pytestmark = pytest.mark.usefixtures("ray_address")

RULES = [
    {"name": "capped", "message": "tool run", "max_attempts": 5, "max_retries_per_run": 2},
    {"name": "never", "kind": "model_server_error", "max_attempts": 1},
]


def _config(directory: Path, agent_url: str) -> CollectionConfig:
    directory.mkdir(parents=True)
    tasks = [{"mode": "always_fail"}, {"mode": "fail_as", "kind": "model_server_error"}, {"mode": "ok"}]
    (directory / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return CollectionConfig(
        input_path=directory / "tasks.jsonl",
        output_path=directory / "out" / "rollouts.jsonl",
        agent_url=agent_url,
        num_repeats=3,
        concurrency=4,
        max_attempts=3,
        retry_rules=RULES,
    )


def _decisions(config: CollectionConfig) -> Counter[tuple[Any, ...]]:
    """How many failure rows made each decision: the rule, whether retried, the final reason."""
    return Counter(
        (row["_gf_retry_rule"]["rule"], row["_gf_retry_rule"]["retry"], row["final_reason"])
        for row in read_rows(config.failures_path)
    )


async def test_rules_and_a_rules_run_wide_cap_hold_on_ray(tmp_path: Path, agent_url: str) -> None:
    local = _config(tmp_path / "local", agent_url)
    on_ray = _config(tmp_path / "ray", agent_url)
    local_summary = await collect(local)
    ray_summary = await collect_on_ray(on_ray, workers=2)
    expected = Counter(
        {
            # 3 rollouts failing alike, 2 retries granted in all, then each closed by the cap.
            ("capped", True, None): 2,
            ("capped", False, "retry_cap_reached"): 3,
            # Never retried.
            ("never", False, "retry_rule_budget_exhausted"): 3,
        }
    )
    assert _decisions(on_ray) == _decisions(local) == expected
    assert ray_summary.attempts == local_summary.attempts == 5 + 3 + 3
    assert (ray_summary.succeeded, ray_summary.failed_final) == (3, 6)
