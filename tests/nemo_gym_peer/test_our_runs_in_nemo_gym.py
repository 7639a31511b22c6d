"""Run directories gym-failures' collector writes, resumed and aggregated by NeMo Gym 0.7.0's own code.

The runs are made up front (module fixture) by our collector against the test agent
(`tests.collection.agent_app`); then one peer run (`peer/our_runs.py`) has NeMo Gym plan each resume
(`RolloutCollectionHelper()._load_from_cache`), materialize the same input afresh, group the rows
(`_metrics_group`) and aggregate them (`compute_aggregate_metrics`, its `/aggregate_metrics`). Each test
compares that with what our collector wrote and does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gym_failures.collection import CollectionConfig, collect, read_rows
from gym_failures.materialized import materialized_path
from tests.nemo_gym_peer.peer_process import run_peer
from tests.saved_rows import success_row

AGENT = "policy_agent"
BOOKKEEPING = {
    "task_index",
    "rollout_index",
    "attempt",
    "final",
    "closed_on_resume",
    "task_id",
    "final_reason",
}


def _task(number: int, mode: str, **fields: Any) -> dict[str, Any]:
    # NeMo Gym's materialization needs `responses_create_params` on every row.
    return {"responses_create_params": {"input": f"q{number}"}, "mode": mode, **fields}


TASKS = [
    _task(0, "ok", id=7),
    _task(1, "always_fail"),
    _task(0, "ok", id=7),  # the same line again: one task, its rollouts numbered on
    _task(2, "terminal"),
    _task(3, "retry_then_ok"),
    _task(4, "ok"),
]


@dataclass(frozen=True)
class Run:
    config: CollectionConfig
    planned_by_us: list[list[int]]
    """(task, rollout, attempt index) of every attempt our collector sends when it resumes the run."""


def _write_tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


def _our_plan(config: CollectionConfig, max_attempts: int = 3) -> list[list[int]]:
    """What our collector dispatches when it resumes `config`'s run (on a copy, at `max_attempts`,
    NeMo Gym's budget 3 unless raised)."""
    copy = config.output_path.parent.with_name(config.output_path.parent.name + "-ours")
    shutil.copytree(config.output_path.parent, copy)
    update = {"output_path": copy / config.output_path.name, "max_attempts": max_attempts}
    resumed = config.model_copy(update=update)
    before = {(row["rollout_id"], row["attempt"]) for row in _all_rows(resumed)}
    asyncio.run(collect(resumed))
    first: dict[str, int] = {}
    for key, attempt in {(row["rollout_id"], row["attempt"]) for row in _all_rows(resumed)} - before:
        first[key] = min(attempt, first.get(key, attempt))
    return sorted([*map(int, key.split(":")), attempt - 1] for key, attempt in first.items())


def _all_rows(config: CollectionConfig) -> list[dict[str, Any]]:
    return list(read_rows(config.output_path)) + list(read_rows(config.failures_path))


def _keep_first_attempts(path: Path, drop_last: bool) -> None:
    """`path` as if the collector had been killed after every rollout's first attempt (and, with
    `drop_last`, while it wrote the last of them: that attempt left no row)."""
    lines = path.read_bytes().splitlines(keepends=True)
    kept = [line for line, row in zip(lines, read_rows(path), strict=True) if row["attempt"] == 1]
    path.write_bytes(b"".join(kept[:-1] if drop_last else kept))


def _fresh_run(root: Path, agent_url: str) -> CollectionConfig:
    """Our run at NeMo Gym's budget (3), killed after the first attempts: its retried rollouts are open
    at their second attempt, one at its first."""
    config = CollectionConfig(
        input_path=_write_tasks(root / "fresh-input" / "tasks.jsonl", TASKS),
        output_path=root / "fresh" / "rollouts.jsonl",
        agent_url=agent_url,
        num_repeats=2,
        max_attempts=3,
        agent_name=AGENT,
    )
    asyncio.run(collect(config))
    _keep_first_attempts(config.output_path, drop_last=False)
    _keep_first_attempts(config.failures_path, drop_last=True)
    return config


def _old_run(root: Path, agent_url: str) -> CollectionConfig:
    """A run a gym-failures collector before issue 19 saved (line numbers, rows in the old form, no
    materialized inputs), then resumed by ours, which writes them with the run's own numbering."""
    tasks = [_task(0, "ok"), _task(0, "ok"), _task(1, "ok")]
    config = CollectionConfig(
        input_path=_write_tasks(root / "old-input" / "tasks.jsonl", tasks),
        output_path=root / "old" / "rollouts.jsonl",
        agent_url=agent_url,
        max_attempts=3,
        agent_name=AGENT,
    )
    config.output_path.parent.mkdir(parents=True)
    # As that collector saved it: the contract keys at the top level, NeMo Gym's indices beside them.
    old = {**success_row("1:0"), "_ng_task_index": 1, "_ng_rollout_index": 0}
    config.output_path.write_text(json.dumps(old) + "\n")
    manifest = {
        "version": 2,
        "input_sha256": hashlib.sha256(config.input_path.read_bytes()).hexdigest(),
        "num_repeats": 1,
        "expected_rollouts": 3,
    }
    config.manifest_path.write_text(json.dumps(manifest))
    asyncio.run(collect(config))
    # Killed as it wrote its last row: that rollout is still open.
    lines = config.output_path.read_bytes().splitlines(keepends=True)
    config.output_path.write_bytes(b"".join(lines[:-1]))
    return config


RAISED = 5
"""The budget the closed run is resumed at, by NeMo Gym and by us."""


def _closed_run(root: Path, agent_url: str) -> CollectionConfig:
    """Our run collected to its end at a budget of 2: a rollout closed by the budget
    (`attempt_budget_exhausted`), one closed as terminal, and successes; then resumed at `RAISED`."""
    config = CollectionConfig(
        input_path=_write_tasks(root / "closed-input" / "tasks.jsonl", TASKS),
        output_path=root / "closed" / "rollouts.jsonl",
        agent_url=agent_url,
        max_attempts=2,
        agent_name=AGENT,
    )
    asyncio.run(collect(config))
    return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, agent_url: str) -> dict[str, tuple[Run, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("our-runs")
    made = {
        "fresh": _fresh_run(root, agent_url),
        "old": _old_run(root, agent_url),
        "closed": _closed_run(root, agent_url),
    }
    budgets = {"closed": RAISED}
    planned = {name: _our_plan(config, budgets.get(name, 3)) for name, config in made.items()}
    jobs = [
        {
            "name": name,
            "run_dir": str(config.output_path.parent),
            "input": str(config.input_path),
            "agent_name": AGENT,
            "num_repeats": config.num_repeats,
            **({"max_attempts": budgets[name]} if name in budgets else {}),
        }
        for name, config in made.items()
    ]
    (root / "jobs.json").write_text(json.dumps(jobs))
    found = run_peer("our_runs", str(root / "jobs.json"), cwd=root)
    return {name: (Run(config, planned[name]), found[name]) for name, config in made.items()}


@pytest.mark.parametrize("name", ["fresh", "old", "closed"])
def test_nemo_gyms_resume_takes_our_run_as_its_own_and_plans_the_open_rollouts_as_we_do(
    runs: dict[str, tuple[Run, dict[str, Any]]], name: str
) -> None:
    run, nemo_gym = runs[name]
    assert nemo_gym["resumes"], "its materialized inputs are there: NeMo Gym resumes, deleting nothing"
    assert nemo_gym["planned"], "the run has open rollouts"
    assert name != "fresh" or {attempt for *_, attempt in nemo_gym["planned"]} == {0, 1}
    assert nemo_gym["planned"] == run.planned_by_us
    successes = len(run.config.output_path.read_bytes().splitlines())
    assert nemo_gym["kept_results"] == successes, "every success row is kept"


def test_the_materialized_inputs_are_what_nemo_gym_writes_for_the_same_input(
    runs: dict[str, tuple[Run, dict[str, Any]]],
) -> None:
    run, nemo_gym = runs["fresh"]
    ours = [json.loads(line) for line in materialized_path(run.config.output_path).read_bytes().splitlines()]
    assert ours == nemo_gym["fresh_materialized"]
    assert [list(row) for row in ours] == [list(row) for row in nemo_gym["fresh_materialized"]], "key order"
    keys = [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in ours]
    assert keys[:6] == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)], "identical lines: one task"


def test_nemo_gym_groups_every_row_of_our_run_by_our_agent(
    runs: dict[str, tuple[Run, dict[str, Any]]],
) -> None:
    _, nemo_gym = runs["fresh"]
    assert nemo_gym["groups"] == [AGENT]
    assert nemo_gym["groups_behind_a_server"] == ["env_server"], "the one server fronting the agent"


def test_nemo_gyms_aggregation_takes_none_of_our_bookkeeping_for_a_metric(
    runs: dict[str, tuple[Run, dict[str, Any]]],
) -> None:
    _, nemo_gym = runs["fresh"]
    for kind in ("result_metrics", "failure_metrics"):
        names = {metric.split("/", 1)[-1] for metric in nemo_gym[kind]}
        assert "reward" in names, f"{kind}: the measurement is aggregated"
        assert not names & BOOKKEEPING, kind


def test_rows_saved_before_issue_19_still_gave_nemo_gym_bookkeeping_metrics(
    runs: dict[str, tuple[Run, dict[str, Any]]],
) -> None:
    """The old run's first row is in the old form (migrated on read, never rewritten): NeMo Gym
    averages its `attempt`, as it did; the rows written since carry none."""
    _, nemo_gym = runs["old"]
    names = {metric.split("/", 1)[-1] for metric in nemo_gym["result_metrics"]}
    assert {"attempt", "task_index"} <= names


def test_a_raised_budget_reopens_the_same_rollouts_for_nemo_gym_and_for_us(
    runs: dict[str, tuple[Run, dict[str, Any]]],
) -> None:
    """Both reopen the rollouts the budget closed, at the attempt after their last; neither the ones
    the agent marked terminal, nor the ones that succeeded."""
    run, nemo_gym = runs["closed"]
    closed = sorted(
        [row["task_index"], row["rollout_index"], row["attempt"]]
        for row in read_rows(run.config.failures_path)
        if row["final_reason"] == "attempt_budget_exhausted"
    )
    assert closed, "the run has rollouts the budget closed"
    assert nemo_gym["planned"] == run.planned_by_us == closed, "reopened at the attempt index after the last"
    terminal = {
        (row["task_index"], row["rollout_index"])
        for row in read_rows(run.config.failures_path)
        if row["final_reason"] == "terminal"
    }
    assert terminal, "the run has a rollout the agent closed as terminal"
    assert not terminal & {(task, rollout) for task, rollout, _ in nemo_gym["planned"]}
