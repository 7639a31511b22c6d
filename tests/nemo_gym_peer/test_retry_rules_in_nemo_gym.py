"""Runs collected with retry rules (issue 30), read by NeMo Gym 0.7.0's own code (`peer/our_runs.py`):
its aggregation takes no metric of the `_gf_retry_rule` key, and its resume, at a raised budget, plans
what ours plans under the same rules: the rollouts `--max-attempts` closed are reopened, those a rule
closed (`_ng_failure_terminal` true) are not."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gym_failures.collection import CollectionConfig, collect, read_rows
from tests.nemo_gym_peer.peer_process import run_peer

AGENT = "policy_agent"
RAISED = 5


def _task(number: int, mode: str, **fields: Any) -> dict[str, Any]:
    # NeMo Gym's materialization needs `responses_create_params` on every row.
    return {"responses_create_params": {"input": f"q{number}"}, "mode": mode, **fields}


def _run(
    root: Path, name: str, agent_url: str, tasks: list[dict[str, Any]], **options: Any
) -> CollectionConfig:
    (root / f"{name}-input").mkdir()
    (root / f"{name}-input" / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    config = CollectionConfig(
        input_path=root / f"{name}-input" / "tasks.jsonl",
        output_path=root / name / "rollouts.jsonl",
        agent_url=agent_url,
        agent_name=AGENT,
        **options,
    )
    asyncio.run(collect(config))
    return config


def _our_plan(config: CollectionConfig, max_attempts: int) -> list[list[int]]:
    """The (task, rollout, attempt index) our collector sends first for each rollout when it resumes
    `config`'s run (on a copy) at `max_attempts`, under the same rules."""
    copy = config.output_path.parent.with_name(config.output_path.parent.name + "-ours")
    shutil.copytree(config.output_path.parent, copy)
    resumed = config.model_copy(
        update={"output_path": copy / config.output_path.name, "max_attempts": max_attempts}
    )
    rows = [*read_rows(resumed.output_path), *read_rows(resumed.failures_path)]
    before = {(row["rollout_id"], row["attempt"]) for row in rows}
    asyncio.run(collect(resumed))
    first: dict[str, int] = {}
    for row in [*read_rows(resumed.output_path), *read_rows(resumed.failures_path)]:
        if (row["rollout_id"], row["attempt"]) not in before:
            first[row["rollout_id"]] = min(row["attempt"], first.get(row["rollout_id"], row["attempt"]))
    return sorted([*map(int, key.split(":")), attempt - 1] for key, attempt in first.items())


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory, agent_url: str) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("retry-rules-runs")
    # One row a rollout (NeMo Gym aggregates one attempt's rows): every failure closed by the rule.
    one_each = _run(
        root,
        "one_each",
        agent_url,
        [_task(0, "ok"), _task(1, "always_fail"), _task(2, "terminal"), _task(3, "raise")],
        retry_rules=[{"max_attempts": 1, "max_retries_per_run": 0}],
    )
    closed = _run(
        root,
        "closed",
        agent_url,
        [_task(0, "always_fail"), _task(1, "fail_as", kind="agent_timeout"), _task(2, "ok")],
        max_attempts=2,
        retry_rules=[{"name": "never", "message": "^tool run", "max_attempts": 1}],
    )
    jobs: list[dict[str, Any]] = [
        {"name": "one_each", "run_dir": str(one_each.output_path.parent), "input": str(one_each.input_path)},
        {
            "name": "closed",
            "run_dir": str(closed.output_path.parent),
            "input": str(closed.input_path),
            "max_attempts": RAISED,
        },
    ]
    (root / "jobs.json").write_text(
        json.dumps([{**job, "agent_name": AGENT, "num_repeats": 1} for job in jobs])
    )
    result: dict[str, Any] = run_peer("our_runs", str(root / "jobs.json"), cwd=root)
    result["ours"] = _our_plan(closed, RAISED)
    result["closed_rows"] = list(read_rows(closed.failures_path))
    result["one_each_rows"] = list(read_rows(one_each.failures_path))
    return result


def test_nemo_gyms_aggregation_takes_no_metric_of_the_retry_rule_key(found: dict[str, Any]) -> None:
    assert all("_gf_retry_rule" in row for row in found["one_each_rows"]), "every failure row has the key"
    nemo_gym = found["one_each"]
    for kind in ("result_metrics", "failure_metrics"):
        names = {metric.split("/", 1)[-1] for metric in nemo_gym[kind]}
        assert "reward" in names, f"{kind}: the measurement is aggregated"
        assert not {name for name in names if "retry" in name or "rule" in name or "max_" in name}, names


def test_a_raised_budget_reopens_what_max_attempts_closed_not_what_a_rule_closed(
    found: dict[str, Any],
) -> None:
    rows = found["closed_rows"]
    reasons = {(row["task_index"], row["final_reason"]) for row in rows if row["final"]}
    assert reasons == {(0, "retry_rule_budget_exhausted"), (1, "attempt_budget_exhausted")}
    assert found["closed"]["planned"] == found["ours"] == [[1, 0, 2]], "the budget's rollout only"
