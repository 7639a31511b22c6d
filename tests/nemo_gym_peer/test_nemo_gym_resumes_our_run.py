"""End to end: NeMo Gym 0.7.0's full collector, `resume_from_cache=True`, resumes a run gym-failures'
collector wrote, over NeMo Gym's own servers (`tests.nemo_gym_peer.world`); then our collector resumes
the directory NeMo Gym resumed. No row is lost, no finished rollout runs again, either way.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gym_failures.collection import CollectionConfig, collect, read_rows
from gym_failures.rows import JsonlScan
from tests.nemo_gym_peer.world import NemoGymWorld

AGENT = "gf_writer_agent"
BOOKKEEPING = {
    "task_index",
    "rollout_index",
    "attempt",
    "final",
    "closed_on_resume",
    "task_id",
    "final_reason",
}


def _task(number: int, mode: str) -> dict[str, Any]:
    # Fields for both agents: our test agent's `mode`, NeMo Gym world's question and answer.
    return {
        "id": f"w-{number}",
        "responses_create_params": {"input": f"What is 2 + 2? ({number})"},
        "answer": "4",
        "expected": "4",
        "mode": mode,
    }


TASKS = [
    _task(0, "ok"),
    _task(1, "always_fail"),
    _task(2, "terminal"),
    _task(3, "retry_then_ok"),
    _task(4, "ok"),
]


def _first_attempts_only(path: Path, drop_last: bool) -> None:
    """As if our collector had been killed after each rollout's first attempt (and while it wrote
    the last of them, with `drop_last`)."""
    lines = path.read_bytes().splitlines(keepends=True)
    kept = [line for line, row in zip(lines, read_rows(path), strict=True) if row["attempt"] == 1]
    path.write_bytes(b"".join(kept[:-1] if drop_last else kept))


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines() if path.exists() else []


def test_nemo_gyms_collector_resumes_our_run_and_our_collector_resumes_it_back(
    tmp_path: Path, agent_url: str
) -> None:
    input_path = tmp_path / "input" / "tasks.jsonl"
    input_path.parent.mkdir()
    input_path.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    run = tmp_path / "run"
    config = CollectionConfig(
        input_path=input_path,
        output_path=run / "rollouts.jsonl",
        agent_url=agent_url,
        max_attempts=3,
        agent_name=AGENT,
    )
    asyncio.run(collect(config))
    _first_attempts_only(config.output_path, drop_last=False)
    _first_attempts_only(config.failures_path, drop_last=True)
    ours = {path: _lines(path) for path in (config.output_path, config.failures_path)}
    rows = [row for path in ours for row in read_rows(path)]
    done = {row["task_index"] for row in rows if "failure" not in row or row["final"]}
    open_rollouts = {(task, 0) for task in range(len(TASKS)) if task not in done}
    failed_once = {(row["task_index"], 0) for row in rows if "failure" in row}
    assert failed_once & open_rollouts, "a rollout open at its second attempt"
    assert open_rollouts - failed_once, "and one at its first (its attempt left no row)"

    with NemoGymWorld(agent_name=AGENT, cwd=tmp_path) as world:
        reading = world.collect(run, input_path, resume=True)

    assert reading.error is None
    for path, lines in ours.items():
        assert _lines(path)[: len(lines)] == lines, f"{path.name}: every row we wrote is kept"
    assert {(task, rollout) for task, rollout, _ in reading.dispatched} == open_rollouts
    attempts = {(task, rollout): attempt for task, rollout, attempt in reading.dispatched}
    assert attempts == {key: 1 if key in failed_once else 0 for key in open_rollouts}, (
        "our attempts, continued"
    )
    # NeMo Gym's aggregation groups our rows with its own, under our agent, and averages no bookkeeping.
    assert reading.aggregate_metrics is not None
    assert [entry["agent_ref"]["name"] for entry in reading.aggregate_metrics] == [AGENT]
    names = {metric.split("/", 1)[-1] for metric in reading.agent_metrics}
    assert "reward" in names
    assert not names & BOOKKEEPING

    # The run NeMo Gym resumed is still ours to read and resume: nothing is open, nothing runs again.
    scans = [JsonlScan(path) for path in (config.output_path, config.failures_path)]
    rows = [row for scan in scans for row in read_rows(scan.path, scan)]
    assert all(not scan.invalid_lines and scan.torn_tail is None for scan in scans)
    assert len(rows) == sum(len(_lines(scan.path)) for scan in scans)
    again = asyncio.run(collect(config))
    assert (again.attempts, again.already_done, again.expected) == (0, len(TASKS), len(TASKS))
