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
from gym_failures.materialized import NEMO_GYM, materialize, materialized_path
from gym_failures.rows import TaskScan
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


def _line(task: dict[str, Any]) -> bytes:
    return json.dumps(task).encode()


_A, _B = _line(_task(0, "ok")), _line(_task(1, "ok"))


def _result_task(number: int, result: dict[str, Any]) -> dict[str, Any]:
    return _task(number, "result", result=result)


READ_AS_NEMO_GYM_READS = {
    # Every terminator text mode knows, and an unterminated last line (a text of its own).
    "line_ends": _A + b"\r" + _B + b"\r\n" + _A + b"\n" + _A + b"\r\n" + _B + b"\r" + _A,
    # Lines Python's json reads and NeMo Gym's orjson refuses, between lines both read.
    "unreadable": b"\n".join(
        [
            _A,
            _A.replace(b'"ok"', b'"ok", "x": NaN'),
            _B,
            _A.replace(b'"ok"', b'"ok", "x": Infinity'),
            _A.replace(b'"ok"', b'"ok", "x": -1e400'),
            _A.replace(b'"ok"', b'"ok", "x": "\\ud800"'),
            _A.replace(b'"mode"', b'"\\udfff": 1, "mode"'),
            b"\xef\xbb\xbf" + _A,
            _A.replace(b'"ok"', b'"ok", "x": ' + b"[" * 1025 + b"]" * 1025),
            _line(_task(2, "ok")),
        ]
    )
    + b"\n",
    # Results with metrics of their own, one without a reward, one with keys a row has itself.
    "result_metrics": b"".join(
        _line(task) + b"\n"
        for task in [
            _result_task(0, {"reward": 1.0, "accuracy": 1, "answer": "a"}),
            _result_task(1, {"reward": 0.0, "accuracy": 0}),
            _result_task(2, {"accuracy": 1, "answer": "no reward"}),
            _result_task(
                3,
                {
                    "reward": 1.0,
                    "accuracy": 0,
                    "rollout_id": "9:9",
                    "agent_ref": {"name": "other"},
                    "_ng_task_index": 99,
                    "_gf_final": False,
                    "failure": "theirs",
                    "result": 5,
                },
            ),
        ]
    ),
}
"""Inputs collected by us whose run directories NeMo Gym's own readers and aggregation are given."""


@dataclass
class Interop:
    configs: dict[str, CollectionConfig]
    found: dict[str, dict[str, Any]]
    """What the peer reported of each run (filled by the `runs` fixture's one peer run)."""

    def jobs(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "run_dir": str(config.output_path.parent),
                "input": str(config.input_path),
                "agent_name": AGENT,
                "num_repeats": config.num_repeats,
            }
            for name, config in self.configs.items()
        ]


@pytest.fixture(scope="module")
def _interop_runs(tmp_path_factory: pytest.TempPathFactory, agent_url: str) -> Interop:
    root = tmp_path_factory.mktemp("interop-runs")
    configs = {}
    for name, content in READ_AS_NEMO_GYM_READS.items():
        (root / f"{name}-input").mkdir()
        (root / f"{name}-input" / "tasks.jsonl").write_bytes(content)
        config = CollectionConfig(
            input_path=root / f"{name}-input" / "tasks.jsonl",
            output_path=root / name / "rollouts.jsonl",
            agent_url=agent_url,
            agent_name=AGENT,
        )
        asyncio.run(collect(config))
        configs[name] = config
    return Interop(configs, {})


@pytest.fixture(scope="module")
def interop(runs: Any, _interop_runs: Interop) -> Interop:
    """The interop runs, with what NeMo Gym made of them (reported by the `runs` fixture's peer run)."""
    return _interop_runs


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
def runs(
    tmp_path_factory: pytest.TempPathFactory, agent_url: str, _interop_runs: Interop
) -> dict[str, tuple[Run, dict[str, Any]]]:
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
    (root / "jobs.json").write_text(json.dumps(jobs + _interop_runs.jobs()))
    found = run_peer("our_runs", str(root / "jobs.json"), cwd=root)
    _interop_runs.found.update({name: found[name] for name in _interop_runs.configs})
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


# --- Inputs NeMo Gym reads its own way, results with metrics of their own ---------------------------


def _materialized(config: CollectionConfig) -> list[dict[str, Any]]:
    return [json.loads(line) for line in materialized_path(config.output_path).read_bytes().splitlines()]


def test_tasks_are_numbered_on_the_lines_nemo_gym_reads(interop: Interop) -> None:
    """NeMo Gym reads its input in text mode (`_preprocess_rows_from_config`,
    nemo_gym/rollout_collection.py:1989): a lone `\\r` ends a line as `\\n` and `\\r\\n` do."""
    config, nemo_gym = interop.configs["line_ends"], interop.found["line_ends"]
    assert nemo_gym["input_lines_read"] == [True] * 6, "six lines, as text mode splits them"
    assert _materialized(config) == nemo_gym["fresh_materialized"]
    keys = [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in _materialized(config)]
    assert keys == [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1), (2, 0)], "an unterminated last line: its own"


def test_task_lines_nemo_gym_cannot_read_are_the_ones_we_count_invalid(interop: Interop) -> None:
    config, nemo_gym = interop.configs["unreadable"], interop.found["unreadable"]
    scan = TaskScan(config.input_path)
    materialize(config.input_path, 1, AGENT, NEMO_GYM, scan)
    refused = [number for number, read in enumerate(nemo_gym["input_lines_read"]) if not read]
    assert refused == scan.invalid_lines == [1, 3, 4, 5, 6, 7, 8]
    assert "Malformed JSON" in nemo_gym["fresh_error"], "NeMo Gym itself stops at the first of them"
    # Our run of the others is one NeMo Gym's resume reads (with orjson) and finds complete.
    assert nemo_gym["materialized_lines_read"] == len(_materialized(config)) == 3
    assert nemo_gym["resumes"]
    assert (nemo_gym["planned"], nemo_gym["kept_results"]) == ([], 3)


def test_nemo_gyms_aggregation_averages_the_agents_own_result_metrics(interop: Interop) -> None:
    """NeMo Gym averages a row's numeric top-level keys (`compute_aggregate_metrics`,
    nemo_gym/reward_profile.py:417): an agent's result metric is one of them, as in its own flat rows."""
    nemo_gym = interop.found["result_metrics"]
    means = nemo_gym["result_means"]
    assert means["mean/accuracy"] == 0.5
    assert means["mean/reward"] == pytest.approx(2 / 3), "the result without a reward is not a zero"
    names = {name.split("/", 1)[1] for name in means}
    assert not names & {"result", "failure", "rollout_id", "answer"}, "a row's own keys stay its own"
    assert nemo_gym["groups"] == [AGENT], "a result's agent_ref is not the row's"
    assert (nemo_gym["planned"], nemo_gym["kept_results"]) == ([], 4)


def test_a_result_whose_keys_are_a_rows_own_reads_back_as_the_agent_gave_it(interop: Interop) -> None:
    config = interop.configs["result_metrics"]
    rows = {row["rollout_id"]: row for row in read_rows(config.output_path)}
    assert set(rows) == {"0:0", "1:0", "2:0", "3:0"}
    given = json.loads(config.input_path.read_bytes().splitlines()[3])["result"]
    assert rows["3:0"]["result"] == given
    assert (rows["3:0"]["task_index"], rows["3:0"]["agent_ref"]) == (3, {"name": AGENT})
    assert "failure" not in rows["3:0"], "a success, whatever its result names"
