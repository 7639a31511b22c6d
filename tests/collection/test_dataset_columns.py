"""A NeMo Gym run whose dataset has columns named like gym-failures' row keys: NeMo Gym copies the
input row's fields to the top level of every row it writes, and those are its data, not our keys
(`gym_failures.nemo_gym.written_by_gym_failures`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gym_failures.collection import CollectionConfig, collect

# One dataset column a task, each named like a key of the row contract.
DATASET: list[dict[str, Any]] = [
    {"task_index": 42},
    {"rollout_index": 7},
    {"attempt": 3},
    {"result": "4"},
    {"failure": "none"},
    {"rollout_id": "abc"},
    {"final": True},
    {"masked": True},
]


def _lines(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


async def test_resuming_a_finished_nemo_gym_run_whose_dataset_names_our_keys_runs_nothing(
    tmp_path: Path, agent_url: str
) -> None:
    """Before: `task_index: 42` read as rollout 42:0 and `failure: "none"` as a failure, so the resume
    re-ran finished rollouts and duplicated their rows (which NeMo Gym's aggregation then refuses)."""
    tasks = [
        {"id": f"t{index}", "responses_create_params": {"input": "q"}, "mode": "ok", **column}
        for index, column in enumerate(DATASET)
    ]
    inputs = tmp_path / "tasks.jsonl"
    inputs.write_text(_lines(tasks))
    run = tmp_path / "run"
    run.mkdir()
    materialized = [
        {**task, "agent_ref": {"name": "agent"}, "_ng_task_index": index, "_ng_rollout_index": 0}
        for index, task in enumerate(tasks)
    ]
    (run / "rollouts_materialized_inputs.jsonl").write_text(_lines(materialized))
    # As NeMo Gym's simple agent writes a result: the request's fields, then the verifier's.
    results = [{**row, "response": {"output": []}, "reward": 1.0} for row in materialized]
    (run / "rollouts.jsonl").write_text(_lines(results))
    before = (run / "rollouts.jsonl").read_text()
    summary = await collect(
        CollectionConfig(
            input_path=inputs,
            output_path=run / "rollouts.jsonl",
            agent_url=agent_url,
            num_repeats=1,
            max_attempts=3,
        )
    )
    assert (summary.expected, summary.already_done, summary.attempts) == (len(DATASET), len(DATASET), 0)
    assert (run / "rollouts.jsonl").read_text() == before
    assert not (run / "rollouts_failures.jsonl").exists() or not (run / "rollouts_failures.jsonl").read_text()
