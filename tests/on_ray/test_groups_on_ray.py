"""A resume that fills short groups (issue 30) on Ray: the Ray driver plans its resume as a local run
does (`Collector.run`), so it re-runs the same members and counts the same groups."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gym_failures.collection import CollectionConfig, collect, read_rows
from gym_failures.ray import RayCollector
from tests.collection.test_groups import TASKS

pytestmark = pytest.mark.usefixtures("ray_address")


def _attempts(config: CollectionConfig) -> Counter[tuple[str, int]]:
    return Counter(
        (row["rollout_id"], row["attempt"])
        for path in (config.output_path, config.failures_path)
        for row in read_rows(path)
    )


async def test_a_fill_resume_on_ray_reruns_the_members_a_local_one_does(
    tmp_path: Path, agent_url: str
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    config = CollectionConfig(
        input_path=tasks,
        output_path=tmp_path / "run" / "rollouts.jsonl",
        agent_url=agent_url,
        num_repeats=4,
        max_attempts=1,
        min_valid_per_group=2,
    )
    await collect(config)
    before = _attempts(config)
    filled = config.model_copy(update={"max_attempts": 2, "fill_short_groups": True})
    collector = RayCollector(filled, workers=1)
    summary = await collector.run()
    assert sorted(_attempts(config) - before) == [("0:0", 2), ("2:0", 2), ("2:1", 2)]
    assert (summary.left_open, summary.unfillable_groups, summary.reopened) == (6, 2, 3)
    groups = collector.progress.groups
    assert groups is not None
    assert (groups.complete, groups.short, groups.pending) == (4, 2, 0)
