"""Collection over NeMo Gym run directories: resume, rows written in both forms, the per-attempt record."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gym_failures import nemo_gym
from gym_failures.collection import CollectionConfig, collect, normalized, read_rows
from gym_failures.failure_kinds import AGENT_REQUEST_FAILED, TRANSPORT_TIMEOUT, TRANSPORT_UNREACHABLE
from gym_failures.rollout_failure import read_rollout_failure
from tests.processes import free_port

RUNS = Path(__file__).resolve().parents[2] / "examples" / "nemo_gym_runs"
CASES = sorted(path.name for path in RUNS.iterdir() if path.is_dir())


def _copy(case: str, tmp_path: Path) -> Path:
    run = tmp_path / case
    shutil.copytree(RUNS / case, run)
    return run


def _config(run: Path, agent_url: str, **options: Any) -> CollectionConfig:
    expected = json.loads((run / "expected.json").read_text())
    return CollectionConfig(
        input_path=run / "input" / "tasks.jsonl",
        output_path=run / "rollouts.jsonl",
        agent_url=agent_url,
        num_repeats=expected["num_repeats"],
        max_attempts=3,
        **options,
    )


def _rows(run: Path) -> list[dict[str, Any]]:
    return [row for name in ("rollouts.jsonl", "rollouts_failures.jsonl") for row in read_rows(run / name)]


def test_every_case_is_in_the_fixtures() -> None:
    assert CASES == [
        "completed",
        "degraded",
        "exhausted",
        "failed",
        "judge_failed",
        "judge_invalid",
        "killed",
        "masked",
        "mixed",
        "resumed",
        "terminal",
    ]


@pytest.mark.parametrize("case", CASES)
async def test_resuming_a_nemo_gym_run_dispatches_only_the_open_rollouts(
    case: str, tmp_path: Path, agent_url: str
) -> None:
    """Successes, terminal and exhausted rollouts are not dispatched again; attempts continue."""
    run = _copy(case, tmp_path)
    before = {line for name in ("rollouts.jsonl", "rollouts_failures.jsonl") for line in _lines(run / name)}
    summary = await collect(_config(run, agent_url))
    expected = json.loads((run / "expected.json").read_text())["resume"]
    assert summary.already_done == expected["already_done"]
    assert summary.closed_on_resume == expected["closed_on_resume"]
    new = [
        row
        for name in ("rollouts.jsonl", "rollouts_failures.jsonl")
        for line in _lines(run / name)
        if line not in before
        for row in [normalized(json.loads(line))]
        if not row.get("closed_on_resume")
    ]
    assert {row["rollout_id"]: row["attempt"] for row in new} == expected["dispatched"]
    assert summary.attempts == len(expected["dispatched"])


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("case", CASES)
async def test_a_resumed_run_keeps_every_rollout_once_with_continuous_attempts(
    case: str, tmp_path: Path, agent_url: str
) -> None:
    """NeMo Gym run -> resume with gym-failures -> read back: each rollout has one outcome, and its
    attempts are 1, 2, ... without a gap or a repeat (a closing row repeats its last attempt)."""
    run = _copy(case, tmp_path)
    config = _config(run, agent_url)
    await collect(config)
    outcomes: dict[str, int] = defaultdict(int)
    attempts: dict[str, list[int]] = defaultdict(list)
    for row in _rows(run):
        if nemo_gym.is_not_persisted(row):
            continue
        if "failure" not in row or row["final"]:
            outcomes[row["rollout_id"]] += 1
        if not row.get("closed_on_resume"):
            attempts[row["rollout_id"]].append(row["attempt"])
    tasks = len(_lines(run / "input" / "tasks.jsonl"))
    assert set(outcomes) == {
        f"{task}:{repeat}" for task in range(tasks) for repeat in range(config.num_repeats)
    }
    assert set(outcomes.values()) == {1}
    for rollout, numbers in attempts.items():
        assert sorted(numbers) == list(range(1, len(numbers) + 1)), rollout


async def test_rows_written_into_a_nemo_gym_run_carry_nemo_gym_keys(tmp_path: Path, agent_url: str) -> None:
    run = _copy("failed", tmp_path)
    before = set(_lines(run / "rollouts.jsonl"))
    await collect(_config(run, agent_url))
    (added,) = [
        row
        for line in _lines(run / "rollouts.jsonl")
        if line not in before
        for row in [json.loads(line)]
        if row[nemo_gym.TASK_INDEX] == 1
    ]
    assert added[nemo_gym.ROLLOUT_INDEX] == 0
    assert added[nemo_gym.ATTEMPT_INDEX] == 1, "NeMo Gym's 0-based index: one failed attempt before"
    assert added["reward"] == 1.0
    assert "response" not in added["result"], "the response is saved once, at the top level"


async def test_a_failure_row_carries_nemo_gym_failure_keys_and_its_record(
    tmp_path: Path, agent_url: str
) -> None:
    config = CollectionConfig(
        input_path=_tasks(tmp_path, [{"mode": "terminal"}]),
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url=agent_url,
    )
    await collect(config)
    (raw,) = [json.loads(line) for line in _lines(config.failures_path)]
    assert raw[nemo_gym.FAILURE_CLASS] == "agent_run_error"
    assert raw[nemo_gym.FAILURE_TERMINAL] is True
    assert raw[nemo_gym.FAILURE_MESSAGE] == "tool run failed"
    assert raw[nemo_gym.FAILURE_STAGE] == "agent"
    assert nemo_gym.ATTEMPT_INDEX not in raw, "NeMo Gym leaves the index out on the first attempt"
    record = read_rollout_failure(raw["rollout_failure"])
    assert (record.source, record.delivery, record.http_status) == ("environment", "delivered", 200)
    assert (record.episode_id.rollout_id, record.episode_id.attempt) == ("0-0", 0)  # NeMo Gym's form
    assert (record.episode_id.gym_rollout_id, record.episode_id.gym_attempt) == ("0:0", 1)
    manifest = json.loads(config.manifest_path.read_text())
    assert record.run_id == manifest["run_id"]


def _tasks(tmp_path: Path, tasks: list[dict[str, Any]]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


CANARY_KEY = "sk-canary0123456789abcdefghijklmnop"
CANARY_PASSWORD = "canary-password-42"


async def test_an_error_reply_without_a_report_keeps_its_redacted_body(
    tmp_path: Path, agent_url: str
) -> None:
    """The body is the only account of the failure: kept, bounded, and without a secret."""
    body = (
        f"upstream failed: Authorization: Bearer {CANARY_KEY} "
        f"retry at https://user:{CANARY_PASSWORD}@internal.example/run?token={CANARY_PASSWORD} " + "x" * 2000
    )
    config = CollectionConfig(
        input_path=_tasks(tmp_path, [{"mode": "error_body", "body": body}]),
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url=agent_url,
        max_attempts=1,
    )
    await collect(config)
    text = config.failures_path.read_text()
    assert CANARY_KEY not in text
    assert CANARY_PASSWORD not in text
    (row,) = read_rows(config.failures_path)
    excerpt = row[nemo_gym.FAILURE_RESPONSE_BODY]
    assert excerpt.startswith("upstream failed: Authorization: [REDACTED]")
    assert len(excerpt) <= 512
    assert (row[nemo_gym.FAILURE_HTTP_STATUS], row["failure"]["failure_kind"]) == (502, AGENT_REQUEST_FAILED)
    record = read_rollout_failure(row["rollout_failure"])
    assert (record.source, record.delivery, record.http_status) == ("environment", "delivered", 502)


async def test_a_refused_connection_is_recorded_as_not_sent(tmp_path: Path) -> None:
    config = CollectionConfig(
        input_path=_tasks(tmp_path, [{"mode": "ok"}]),
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url=f"http://127.0.0.1:{free_port()}",
        max_attempts=1,
    )
    await collect(config)
    (row,) = read_rows(config.failures_path)
    record = read_rollout_failure(row["rollout_failure"])
    assert (record.source, record.delivery) == ("collector", "not_sent")
    assert record.failure.failure_kind == TRANSPORT_UNREACHABLE
    assert record.exception_type is not None


async def test_a_timeout_after_sending_is_possibly_delivered_and_replayed_only_when_allowed(
    tmp_path: Path, agent_url: str
) -> None:
    tasks = _tasks(tmp_path, [{"mode": "ok", "sleep": 2}])
    replayed = CollectionConfig(
        input_path=tasks,
        output_path=tmp_path / "a" / "rollouts.jsonl",
        agent_url=agent_url,
        max_attempts=2,
        timeout_s=0.3,  # speed-ok: fires: the agent holds the reply 2 s
    )
    kept = replayed.model_copy(
        update={"output_path": tmp_path / "b" / "rollouts.jsonl", "replay_possibly_delivered": False}
    )
    await collect(replayed)
    await collect(kept)
    first = list(read_rows(replayed.failures_path))
    assert [row["final_reason"] for row in first] == [None, "attempt_budget_exhausted"]
    (only,) = read_rows(kept.failures_path)
    assert only["final_reason"] == "possibly_delivered"
    assert only[nemo_gym.FAILURE_TERMINAL] is True, "NeMo Gym's resume must not replay it either"
    record = read_rollout_failure(only["rollout_failure"])
    assert (record.source, record.delivery, record.failure.failure_kind) == (
        "collector",
        "possibly_delivered",
        TRANSPORT_TIMEOUT,
    )


async def test_a_masked_result_is_saved_as_a_masked_success(tmp_path: Path, agent_url: str) -> None:
    config = CollectionConfig(
        input_path=_tasks(tmp_path, [{"mode": "masked"}]),
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url=agent_url,
    )
    await collect(config)
    (raw,) = [json.loads(line) for line in _lines(config.output_path)]
    assert (raw["mask_sample"], raw["failure_reason"], raw["reward"]) == (True, "no verdict", 0.0)
    assert not config.failures_path.exists() or not _lines(config.failures_path)
    (row,) = read_rows(config.output_path)
    assert row["masked"] is True


async def test_a_nemo_gym_run_directory_names_its_rows_file(tmp_path: Path, agent_url: str) -> None:
    run = _copy("failed", tmp_path)
    config = CollectionConfig(input_path=run / "input" / "tasks.jsonl", output_path=run, agent_url=agent_url)
    assert config.output_path == run / "rollouts.jsonl"
    summary = await collect(config)
    assert (summary.already_done, summary.attempts) == (1, 3)


async def test_a_run_directory_names_its_rows_file(tmp_path: Path, agent_url: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(RUNS / "failed" / "rollouts.jsonl", run / "rollouts.jsonl")
    shutil.copy(RUNS / "failed" / "rollouts_failures.jsonl", run / "rollouts_failures.jsonl")
    tasks = RUNS / "failed" / "input" / "tasks.jsonl"
    config = CollectionConfig(input_path=tasks, output_path=run, agent_url=agent_url)
    assert config.output_path == run / "rollouts.jsonl"
    summary = await collect(config)
    assert (summary.already_done, summary.attempts) == (1, 3)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert CollectionConfig(input_path=tasks, output_path=empty, agent_url=agent_url).output_path == (
        empty / "rollouts.jsonl"
    )


def test_a_run_directory_with_two_row_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.jsonl").write_text("")
    with pytest.raises(ValidationError, match="several row files"):
        CollectionConfig(
            input_path=tmp_path / "t.jsonl", output_path=tmp_path, agent_url="http://127.0.0.1:1"
        )


def test_a_run_directory_with_its_manifest_names_its_rows_file_among_others(tmp_path: Path) -> None:
    """A demo run's directory holds tasks.jsonl and injected_faults.jsonl beside its rows: its one
    collection manifest says which file is the run's."""
    for name in ("tasks.jsonl", "injected_faults.jsonl", "rollouts.jsonl"):
        (tmp_path / name).write_text("")
    (tmp_path / "rollouts.manifest.json").write_text("{}")
    config = CollectionConfig(
        input_path=tmp_path / "tasks.jsonl", output_path=tmp_path, agent_url="http://127.0.0.1:1"
    )
    assert config.output_path == tmp_path / "rollouts.jsonl"


@pytest.mark.parametrize(("size", "kept"), [(512, "b" * 512), (513, "b" * 511 + "…")])
async def test_the_kept_body_is_bounded_at_512_characters(
    size: int, kept: str, tmp_path: Path, agent_url: str
) -> None:
    """Cut with the mark, so that a scrub after the cut sees where a secret may have been cut through."""
    body = "b" * size
    config = CollectionConfig(
        input_path=_tasks(tmp_path, [{"mode": "error_body", "body": body}]),
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url=agent_url,
        max_attempts=1,
    )
    await collect(config)
    (row,) = read_rows(config.failures_path)
    assert row[nemo_gym.FAILURE_RESPONSE_BODY] == kept
