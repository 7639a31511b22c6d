"""A run NeMo Gym 0.7.0's collector wrote, in groups of 3 (`num_repeats`), resumed by `gym-failures
collect --fill-short-groups` (issue 30): its groups are its materialized inputs' (whatever
`--num-repeats` says), its valid members read from NeMo Gym's own rows, only the members a short group
needs go to NeMo Gym's agent, and NeMo Gym's own resume then re-runs the member left open."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cli.invoke import run_cli
from tests.nemo_gym_peer.world import NemoGymWorld


def _task(number: int, **fields: Any) -> dict[str, Any]:
    return {
        "id": f"group-{number}",
        "responses_create_params": {"input": f"What is 2 + 2? ({number})"},
        "answer": "4",
        "expected": "4",
        **fields,
    }


TASKS = [
    _task(0),  # 3 valid: complete
    _task(1, outcomes=["agent_failure", "success"]),  # every first attempt fails: 2 of 3 needed again
    _task(2, outcome="masked"),  # 3 masked: no member can be re-run
    _task(3, outcome="agent_failure", terminal=True),  # terminal: not reopened
]


def _rows(run: Path) -> list[str]:
    return [
        line
        for name in ("rollouts.jsonl", "rollouts_failures.jsonl")
        if (run / name).exists()
        for line in (run / name).read_text().splitlines()
    ]


def test_a_nemo_gym_run_fills_its_short_groups_and_nemo_gym_resumes_the_rest(
    peer_world: NemoGymWorld, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    run = tmp_path / "run"
    first = peer_world.collect(run, tasks, num_repeats=3, disable_health_check=True)
    assert first.error is None
    before = set(_rows(run))

    # No --num-repeats: the groups of 3 are the materialized inputs'.
    code, out, err = run_cli(
        "collect", tasks, "--agent-url", peer_world.urls[peer_world.agent_name], "--output", run,
        "--max-attempts", "2", "--min-valid-per-group", "2", "--fill-short-groups", "--json",
    )  # fmt: skip
    assert code == 0, err
    added = [json.loads(line) for line in _rows(run) if line not in before]
    assert sorted(
        (row["_ng_task_index"], row["_ng_rollout_index"], row["_ng_attempt_index"]) for row in added
    ) == [
        (1, 0, 1),
        (1, 1, 1),
    ]
    assert all("_ng_failure_class" not in row for row in added)
    summary = json.loads(out)
    assert (summary["left_open"], summary["unfillable_groups"]) == (1, 2)
    live = [line for line in err.splitlines() if line.startswith("collecting: ")][-1]
    assert "groups (min 2 valid): 2 complete, 2 short, 0 pending" in live
    _, verdict, _ = run_cli("gate", run, "--min-valid-per-group", "2", "--json")
    groups = json.loads(verdict)["coverage"]["groups"]
    assert (groups["complete"], groups["short"], groups["valid"]) == (2, 2, 5), "the gate counts them alike"

    # The member left open is open still, to NeMo Gym's own resume: it runs that one and no other.
    resumed = peer_world.collect(
        run, tasks, num_repeats=3, resume=True, max_attempts=2, disable_health_check=True
    )
    assert resumed.error is None
    assert resumed.dispatched == [(1, 2, 1)]
