"""Collection against a real agent server process that fails in planned ways."""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gym_failures.collection import (
    NONFINITE,
    CollectionConfig,
    JsonlScan,
    RowWriter,
    TaskScan,
    _dispatcher,
    _replies,
    collect,
    read_rows,
    read_tasks,
    repair_torn_tail,
)
from gym_failures.failure_kinds import (
    AGENT_RUN_ERROR,
    COLLECTION_DISPATCH_FAILED,
    COLLECTION_RESUME_REFUSED,
    ENVIRONMENT_PROTOCOL_VIOLATION,
    MODEL_SERVER_ERROR,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_UNREACHABLE,
)
from gym_failures.failure_records import FailureBoundary
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import CollectionFailure
from tests.processes import free_port, stop

ROOT = Path(__file__).resolve().parents[2]


def _tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


def _config(tmp_path: Path, agent_url: str, tasks: list[dict[str, Any]], **options: Any) -> CollectionConfig:
    return CollectionConfig(
        input_path=_tasks(tmp_path / "tasks.jsonl", tasks),
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url=agent_url,
        **options,
    )


def _rows(path: Path) -> list[dict[str, Any]]:
    return list(read_rows(path))


def _outcomes(config: CollectionConfig) -> dict[str, list[dict[str, Any]]]:
    """Every rollout's final outcomes (a success row, or a final failure row)."""
    outcomes: dict[str, list[dict[str, Any]]] = {}
    for row in _rows(config.output_path) + _rows(config.failures_path):
        if "failure" not in row or row["final"]:
            outcomes.setdefault(row["rollout_id"], []).append(row)
    return outcomes


async def test_a_success_row_keeps_its_result_and_recovered_observations(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [{"id": "t0", "mode": "ok"}], num_repeats=2)
    summary = await collect(config)
    rows = sorted(_rows(config.output_path), key=lambda row: str(row["rollout_id"]))
    assert summary.succeeded == 2
    assert [(row["rollout_id"], row["attempt"], row["task_id"]) for row in rows] == [
        ("0:0", 1, "t0"),
        ("0:1", 1, "t0"),
    ]
    report = FailureReportRow.report(rows[0])
    assert rows[0]["reward"] == 1.0
    assert report.failure_id is None
    assert [event.failure_kind for event in report.events.values()] == [MODEL_SERVER_ERROR]


async def test_a_terminal_failure_is_never_retried(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "terminal"}])
    await collect(config)
    (row,) = _rows(config.failures_path)
    assert (row["attempt"], row["final"], row["final_reason"]) == (1, True, "terminal")
    assert "reward" not in row
    report = FailureReportRow.report(row)
    assert report.failure_id is not None
    root = report.events[report.failure_id]
    assert root.failure_kind == AGENT_RUN_ERROR
    assert root.cause_id is not None
    assert report.events[root.cause_id].boundary is FailureBoundary.SANDBOX


async def test_a_failure_is_retried_until_it_recovers(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "retry_then_ok"}])
    await collect(config)
    (failure,) = _rows(config.failures_path)
    (success,) = _rows(config.output_path)
    assert (failure["attempt"], failure["final"], failure["final_reason"]) == (1, False, None)
    assert success["attempt"] == 2


async def test_an_exhausted_attempt_budget_is_final_and_visible(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "always_fail"}], max_attempts=3)
    summary = await collect(config)
    rows = _rows(config.failures_path)
    assert [row["attempt"] for row in rows] == [1, 2, 3]
    assert [row["final"] for row in rows] == [False, False, True]
    assert rows[-1]["final_reason"] == "attempt_budget_exhausted"
    assert summary.failed_final == 1


async def test_a_failed_reply_is_saved_with_the_agents_rebuilt_failure(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "raise"}], max_attempts=1)
    await collect(config)
    (row,) = _rows(config.failures_path)
    report = FailureReportRow.report(row)
    assert report.failure_id is not None
    assert report.events[report.failure_id].failure_kind == MODEL_SERVER_ERROR
    assert row["failure"]["failure_kind"] == MODEL_SERVER_ERROR


async def test_a_2xx_reply_that_is_no_episode_response_is_a_protocol_violation(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "garbage"}], max_attempts=1)
    await collect(config)
    (row,) = _rows(config.failures_path)
    report = FailureReportRow.report(row)
    assert report.failure_id is not None
    event = report.events[report.failure_id]
    assert (event.boundary, event.failure_kind) == (
        FailureBoundary.COLLECTION,
        ENVIRONMENT_PROTOCOL_VIOLATION,
    )


async def test_an_unreachable_agent_is_the_collectors_own_transport_failure(tmp_path: Path) -> None:
    config = _config(tmp_path, f"http://127.0.0.1:{free_port()}", [{"mode": "ok"}], max_attempts=2)
    await collect(config)
    rows = _rows(config.failures_path)
    assert len(rows) == 2
    report = FailureReportRow.report(rows[-1])
    assert report.failure_id is not None
    event = report.events[report.failure_id]
    assert (event.boundary, event.failure_kind) == (FailureBoundary.COLLECTION, TRANSPORT_UNREACHABLE)
    assert event.exception_type is not None


async def test_a_reply_that_never_arrives_is_a_transport_timeout(tmp_path: Path, agent_url: str) -> None:
    # speed-ok: fires: the agent holds the reply 2 s, nearly 7 times the timeout
    config = _config(tmp_path, agent_url, [{"mode": "ok", "sleep": 2}], max_attempts=1, timeout_s=0.3)
    await collect(config)
    (row,) = _rows(config.failures_path)
    assert row["failure"]["failure_kind"] == TRANSPORT_TIMEOUT


async def test_a_dropped_connection_is_a_peer_drop(tmp_path: Path) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.transport.abort()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        config = _config(tmp_path, f"http://127.0.0.1:{port}", [{"mode": "ok"}], max_attempts=1)
        await collect(config)
    (row,) = _rows(config.failures_path)
    assert row["failure"]["failure_kind"] == TRANSPORT_PEER_DROP


async def test_resume_dispatches_only_rollouts_without_a_final_outcome(
    tmp_path: Path, agent_url: str
) -> None:
    tasks = [{"mode": "ok"}, {"mode": "terminal"}, {"mode": "ok"}]
    config = _config(tmp_path, agent_url, tasks)
    await collect(config)
    again = await collect(config)
    assert (again.expected, again.already_done, again.attempts) == (3, 3, 0)
    assert sum(len(rows) for rows in _outcomes(config).values()) == 3


async def test_resume_of_a_different_input_is_refused(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok"}])
    await collect(config)
    _tasks(config.input_path, [{"mode": "ok"}, {"mode": "ok"}])
    with pytest.raises(CollectionFailure) as refused:
        await collect(config)
    assert refused.value.failure_kind == COLLECTION_RESUME_REFUSED
    forced = await collect(config.model_copy(update={"force_resume": True}))
    assert forced.attempts == 1


async def test_the_manifest_holds_no_endpoint(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok"}])
    await collect(config)
    manifest = config.manifest_path.read_text()
    assert "127.0.0.1" not in manifest
    assert "input_sha256" in manifest


async def test_a_torn_last_line_is_reported_skipped_and_cut(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok"}, {"mode": "ok"}])
    await collect(config)
    lines = config.output_path.read_bytes().splitlines(keepends=True)
    # Keep the first row, tear the second as a crash mid-append would.
    config.output_path.write_bytes(lines[0] + lines[1][:10])
    scan = JsonlScan(config.output_path)
    assert len(list(read_rows(config.output_path, scan))) == 1
    assert scan.torn_tail == lines[1][:10]
    summary = await collect(config)
    assert (summary.torn_lines, summary.attempts) == (1, 1)
    assert Path(f"{config.output_path}.torn").read_bytes() == lines[1][:10] + b"\n"
    assert len(_rows(config.output_path)) == 2


def test_repairing_a_file_without_a_torn_line_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    assert repair_torn_tail(path) is None
    assert path.read_bytes() == b'{"a": 1}\n'


async def test_a_legacy_sidecar_row_counts_as_a_final_outcome(tmp_path: Path, agent_url: str) -> None:
    # Two tasks: identical lines would be one task (NeMo Gym's numbering).
    config = _config(tmp_path, agent_url, [{"id": "a", "mode": "ok"}, {"id": "b", "mode": "ok"}])
    config.output_path.parent.mkdir(parents=True)
    legacy = {
        "task_index": 1,
        "rollout_index": 0,
        "_ng_failure_class": "judge_invalid",
        "_ng_failure_terminal": True,
    }
    config.failures_path.write_text(json.dumps(legacy) + "\n")
    summary = await collect(config.model_copy(update={"force_resume": True}))
    assert (summary.already_done, summary.attempts) == (1, 1)
    (row,) = _rows(config.failures_path)
    # NeMo Gym's `judge_invalid` label is read as the shared kind its code names (`judge_unparseable`).
    assert row["failure"] == {"failure_kind": "judge_unparseable", "failure_reason": "", "terminal": True}


_COLLECT_SCRIPT = """
import asyncio, sys
from pathlib import Path
from gym_failures.collection import CollectionConfig, collect
asyncio.run(collect(CollectionConfig(
    input_path=Path(sys.argv[1]), output_path=Path(sys.argv[2]), agent_url=sys.argv[3],
    concurrency=4, max_attempts=3)))
"""


async def test_a_collector_killed_mid_run_resumes_without_loss_or_duplicates(
    tmp_path: Path, agent_url: str
) -> None:
    # The last 20 tasks wait at a gate until the kill: the run is mid-way when killed by construction
    # (the first 40 write at least 40 rows and at most 80, then the gated ones hold every slot).
    gate = tmp_path / "gate"
    tasks = [
        {
            "mode": ("retry_then_ok", "always_fail", "ok")[i % 3],
            "sleep": 0.05,
            **({"until": str(gate)} if i >= 40 else {}),
        }
        for i in range(60)
    ]
    config = _config(tmp_path, agent_url, tasks)
    process = subprocess.Popen(
        [sys.executable, "-c", _COLLECT_SCRIPT, str(config.input_path), str(config.output_path), agent_url],
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60  # a hang guard
        while time.monotonic() < deadline:
            written = sum(len(_rows(path)) for path in (config.output_path, config.failures_path))
            if written >= 25:
                break
            await asyncio.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        stop(process)
        gate.touch()
    assert process.returncode == -signal.SIGKILL
    before = _rows(config.output_path) + _rows(config.failures_path)
    assert 25 <= len(before) < 60 + 40, "the kill must land mid-run"
    await collect(config)
    rows = _rows(config.output_path) + _rows(config.failures_path)
    keys = [(row["rollout_id"], row["attempt"]) for row in rows]
    assert len(keys) == len(set(keys)), "no attempt is saved twice"
    assert all(row in rows for row in before), "no row is lost"
    outcomes = _outcomes(config)
    assert len(outcomes) == 60
    assert all(len(final) == 1 for final in outcomes.values()), "exactly one final outcome each"
    by_rollout: dict[str, list[int]] = {}
    for rollout, attempt in keys:
        by_rollout.setdefault(rollout, []).append(attempt)
    assert all(sorted(attempts) == list(range(1, len(attempts) + 1)) for attempts in by_rollout.values())


# --- A reply that cannot be read, an unexpected fault ----------------------------------------------


async def test_a_reply_aiohttp_cannot_read_is_a_retryable_protocol_violation(tmp_path: Path) -> None:
    # A header line over aiohttp's 8190 bytes: aiohttp raises ClientResponseError 400, quoting the bytes.
    async def oversized_header(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: " + b"q" * 9000 + b"\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(oversized_header, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        tasks = [{"id": "a", "mode": "ok"}, {"id": "b", "mode": "ok"}]
        config = _config(tmp_path, f"http://127.0.0.1:{port}", tasks, max_attempts=2)
        summary = await collect(config)
    rows = _rows(config.failures_path)
    assert (summary.attempts, summary.failed_final) == (4, 2)
    assert sorted((row["rollout_id"], row["attempt"], row["final"]) for row in rows) == [
        ("0:0", 1, False),
        ("0:0", 2, True),
        ("1:0", 1, False),
        ("1:0", 2, True),
    ]
    report = FailureReportRow.report(rows[0])
    assert report.failure_id is not None
    event = report.events[report.failure_id]
    assert (event.boundary, event.failure_kind) == (
        FailureBoundary.COLLECTION,
        ENVIRONMENT_PROTOCOL_VIOLATION,
    )
    assert event.exception_type == "aiohttp.client_exceptions.ClientResponseError"
    assert "ClientResponseError" in event.failure_reason
    assert b"qqqq" not in config.failures_path.read_bytes(), "the reply's bytes are never saved"


async def test_a_resume_counts_the_lines_that_are_not_rows_in_both_files_once(
    tmp_path: Path, agent_url: str
) -> None:
    # They were counted once per rollout reopened or closed by an earlier final row, from the failures
    # file alone: none at all on a resume with no such rollout.
    config = _config(tmp_path, agent_url, [{"mode": "ok"}, {"mode": "ok"}])
    await collect(config)
    for path in (config.output_path, config.failures_path):
        with path.open("a", encoding="utf-8") as handle:
            handle.write("not a row\n")
    summary = await collect(config)
    assert summary.already_done == 2
    assert summary.invalid_lines == 2
    assert [scan.path for scan in summary.scans] == [config.output_path, config.failures_path]


async def test_an_unexpected_error_in_one_rollout_is_recorded_and_the_others_go_on(
    tmp_path: Path, agent_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No real reply makes the collector fail unexpectedly; inject one fault into its reading.
    real = _replies.read_episode_response
    calls = 0

    def fails_once(body: bytes, url: str) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("text that must not be saved")
        return real(body, url)

    monkeypatch.setattr(_dispatcher, "read_episode_response", fails_once)
    tasks = [{"mode": "ok"}, {"mode": "ok"}, {"mode": "ok"}]
    config = _config(tmp_path, agent_url, tasks, max_attempts=1, concurrency=3)
    summary = await collect(config)
    assert (summary.succeeded, summary.failed_final, summary.dispatch_errors) == (2, 1, 1)
    (row,) = _rows(config.failures_path)
    assert row["failure"]["failure_kind"] == COLLECTION_DISPATCH_FAILED
    assert "RuntimeError" in row["failure"]["failure_reason"]
    assert b"must not be saved" not in config.failures_path.read_bytes()


# --- Tasks -----------------------------------------------------------------------------------------


async def test_tasks_are_numbered_as_nemo_gym_numbers_them_and_an_unterminated_last_task_is_a_task(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [])
    config.input_path.write_bytes(
        b'{"id": "a", "mode": "echo"}\n'
        b"\n"
        b"[1, 2]\n"
        b'{"id": "b", "mode": "echo", "task_index": 7}'  # no newline: the input is never appended to
    )
    summary = await collect(config)
    assert (summary.tasks, summary.blank_task_lines, summary.invalid_task_lines) == (2, 1, 1)
    assert (summary.expected, summary.succeeded) == (2, 2)
    rows = sorted(_rows(config.output_path), key=lambda row: int(row["task_index"]))
    # Skipped lines take no index: the valid rows are numbered 0, 1 (NeMo Gym's numbering).
    assert [(row["task_index"], row["rollout_id"], row["task_id"]) for row in rows] == [
        (0, "0:0", "a"),
        (1, "1:0", "b"),
    ]
    # The task reached the agent as written: nothing (such as a rollout id) was added to it.
    assert rows[1]["result"]["task"] == {"id": "b", "mode": "echo", "task_index": 7}


def test_reading_tasks_counts_every_line_and_reports_the_skipped_ones(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b'{"id": 1}\n  \nnot json\n' + b"[" * 100_000 + b'\n{"id": 2}')
    scan = TaskScan(path)
    assert list(read_tasks(path, scan)) == [(0, {"id": 1}), (4, {"id": 2})]
    assert (scan.tasks, scan.blank_lines, scan.invalid_lines) == (2, 1, [2, 3])


# --- The report of a reply -------------------------------------------------------------------------


async def test_a_report_too_large_for_the_header_is_saved_whole_from_the_body(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "big_report"}])
    await collect(config)
    (row,) = _rows(config.output_path)
    report = FailureReportRow.report(row)
    assert len(report.events) == 20
    assert report.omitted is False, "the header's omitted marker only said the report did not fit it"


async def test_a_report_that_lost_events_on_the_way_stays_omitted(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "dropped_report"}])
    await collect(config)
    (row,) = _rows(config.output_path)
    report = FailureReportRow.report(row)
    assert len(report.events) == 64
    assert report.omitted is True


# --- The manifest and the lock ---------------------------------------------------------------------


async def test_the_manifest_holds_the_rollouts_expected(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok"}, {"mode": "terminal"}], num_repeats=3)
    await collect(config)
    manifest = json.loads(config.manifest_path.read_text())
    assert manifest["expected_rollouts"] == 6
    assert manifest["num_repeats"] == 3


async def test_a_manifest_without_the_expected_count_still_resumes(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok"}])
    await collect(config)
    manifest = json.loads(config.manifest_path.read_text())
    del manifest["expected_rollouts"]
    config.manifest_path.write_text(json.dumps(manifest))
    again = await collect(config)
    assert (again.already_done, again.attempts) == (1, 0)
    assert json.loads(config.manifest_path.read_text())["expected_rollouts"] == 1


async def test_the_manifest_is_replaced_whole_never_rewritten_in_place(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok"}])
    await collect(config)
    first = config.manifest_path.stat().st_ino
    await collect(config)
    assert config.manifest_path.stat().st_ino != first, "written to a new file, then renamed over"
    assert sorted(path.name for path in config.manifest_path.parent.iterdir()) == [
        "rollouts.jsonl",
        "rollouts.lock",
        "rollouts.manifest.json",
        "rollouts_failures.jsonl",
        "rollouts_materialized_inputs.jsonl",
    ]


async def test_a_second_collector_on_the_same_output_is_refused(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok", "sleep": 0.3}])
    first = asyncio.create_task(collect(config))
    await asyncio.sleep(0)  # the first run takes the lock before its first await
    with pytest.raises(CollectionFailure) as refused:
        await collect(config.model_copy(update={"force_resume": True}))
    assert refused.value.failure_kind == COLLECTION_RESUME_REFUSED
    assert "another collector is writing" in refused.value.failure_reason
    assert f"process {os.getpid()} holds {config.lock_path}" in refused.value.failure_reason
    summary = await first
    assert (summary.attempts, len(_rows(config.output_path))) == (1, 1)


async def test_the_lock_is_held_against_another_process(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok"}])
    config.lock_path.parent.mkdir(parents=True)
    with config.lock_path.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(CollectionFailure):
            await collect(config)
    assert not config.output_path.exists()
    assert (await collect(config)).succeeded == 1


# --- Non-finite numbers ----------------------------------------------------------------------------


def _strict_json(line: bytes) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(line, parse_constant=refuse)


def test_the_row_writer_never_writes_nan_or_infinity(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    with RowWriter(path) as writer:
        writer.write({"reward": math.nan, "result": {"a/b": [1.5, -math.inf, math.inf]}, "ok": 2.0})
    row = _strict_json(path.read_bytes())
    assert row["reward"] is None
    assert row["result"] == {"a/b": [1.5, None, None]}
    assert row["ok"] == 2.0
    assert row[NONFINITE] == {"/reward": "NaN", "/result/a~1b/1": "-Infinity", "/result/a~1b/2": "Infinity"}


async def test_a_reply_with_a_nan_reward_is_a_protocol_violation(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "nan_reward"}], max_attempts=1)
    summary = await collect(config)
    assert (summary.succeeded, summary.failed_final) == (0, 1)
    assert not config.output_path.read_bytes()
    (line,) = config.failures_path.read_bytes().splitlines()
    row = _strict_json(line)
    assert row["failure"]["failure_kind"] == ENVIRONMENT_PROTOCOL_VIOLATION
    assert "reward is nan" in row["failure"]["failure_reason"]


# --- A budget lowered on resume --------------------------------------------------------------------


async def test_a_rollout_past_a_lowered_budget_is_closed_without_a_dispatch(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "always_fail"}, {"mode": "always_fail"}], max_attempts=3)
    await collect(config)
    # As if the collector was killed after each rollout's second attempt.
    lines = config.failures_path.read_bytes().splitlines(keepends=True)
    kept_lines = [
        line for line, row in zip(lines, _rows(config.failures_path), strict=True) if row["attempt"] <= 2
    ]
    config.failures_path.write_bytes(b"".join(kept_lines))
    kept = _rows(config.failures_path)
    summary = await collect(config.model_copy(update={"max_attempts": 2}))
    assert (summary.attempts, summary.closed_on_resume, summary.failed_final) == (0, 2, 2)
    rows = _rows(config.failures_path)
    closing = rows[len(kept) :]
    assert len(closing) == 2
    for row in closing:
        last = next(old for old in kept if old["rollout_id"] == row["rollout_id"] and old["attempt"] == 2)
        assert row == {
            **last,
            "final": True,
            "final_reason": "attempt_budget_exhausted",
            "closed_on_resume": True,
            # As saved (`gym_failures.row_keys`), beside the contract keys a reader adds.
            "_gf_final": True,
            "_gf_final_reason": "attempt_budget_exhausted",
            "_gf_closed_on_resume": True,
        }
    again = await collect(config.model_copy(update={"max_attempts": 2}))
    assert (again.already_done, again.attempts, again.closed_on_resume) == (2, 0, 0)


async def test_an_invalid_agent_url_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="agent_url"):
        _config(tmp_path, "127.0.0.1:8000", [{"mode": "ok"}])
    assert not (tmp_path / "out").exists()


async def test_resume_of_an_earlier_manifest_version_is_refused(tmp_path: Path, agent_url: str) -> None:
    """Version 1 numbered tasks by valid row, version 2 by line: the rollout ids can differ."""
    config = _config(tmp_path, agent_url, [{"mode": "ok"}])
    await collect(config)
    manifest = json.loads(config.manifest_path.read_text())
    manifest["version"] = 1
    config.manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CollectionFailure) as refused:
        await collect(config)
    assert refused.value.failure_kind == COLLECTION_RESUME_REFUSED
    assert (await collect(config.model_copy(update={"force_resume": True}))).attempts == 0


def test_a_config_error_never_echoes_the_agent_url(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="agent_url") as refused:
        CollectionConfig(
            input_path=tmp_path / "t.jsonl",
            output_path=tmp_path / "o.jsonl",
            agent_url="http://user:S3cretPassw0rd@host:99999/",
        )
    assert "S3cretPassw0rd" not in str(refused.value)


async def test_a_reply_over_the_size_bound_is_a_protocol_violation(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok"}], max_attempts=1, max_reply_bytes=10)
    await collect(config)
    (row,) = _rows(config.failures_path)
    assert row["failure"]["failure_kind"] == ENVIRONMENT_PROTOCOL_VIOLATION
    assert "over 10" in row["failure"]["failure_reason"]


async def test_a_task_holding_a_lone_surrogate_is_counted_invalid_and_the_others_collected(
    tmp_path: Path, agent_url: str
) -> None:
    """Valid JSON (`"\\ud800"`) that is no valid text stopped every run and resume before issue 14.
    NeMo Gym's orjson refuses it (its resume would stop on our materialized inputs), so it is a bad
    task line, skipped and counted like any other, and the run goes on."""
    config = _config(tmp_path, agent_url, [{"id": "bad-\ud800", "mode": "ok"}, {"mode": "ok"}])

    summary = await collect(config)

    rows = _rows(config.output_path)
    assert (summary.attempts, summary.invalid_task_lines) == (1, 1)
    assert [row["rollout_id"] for row in rows] == ["0:0"]
    config.output_path.read_bytes().decode("utf-8")
    config.materialized_path.read_bytes().decode("utf-8")
    assert (await collect(config)).attempts == 0, "a resume finds the rollout done"


async def test_the_agent_urls_credentials_never_reach_a_row(tmp_path: Path, agent_url: str) -> None:
    """An agent URL with user info makes the client send a Basic credential; an agent that quotes it in
    a hand-built body (failure reason, result) has it replaced before the row is saved."""
    password = "Zq9AgentUrlPassword"
    url = agent_url.replace("http://", f"http://collector:{password}@")
    config = _config(tmp_path, url, [{"mode": "quote_credentials"}], max_attempts=2)

    await collect(config)

    saved = config.output_path.read_text() + config.failures_path.read_text()
    token = base64.b64encode(f"collector:{password}".encode()).decode()
    assert "refused" in saved, "the control: the agent quoted what it was sent"
    assert password not in saved
    assert token not in saved


async def test_an_agent_url_with_a_query_keeps_it_after_the_run_path(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, f"{agent_url}/?token=Zq9QueryToken", [{"mode": "ok"}])

    summary = await collect(config)

    assert summary.succeeded == 1
    assert "Zq9QueryToken" not in config.output_path.read_text()


async def test_an_agents_body_report_is_bounded_like_a_request_log(tmp_path: Path, agent_url: str) -> None:
    """`huge_body_report` replies with 100 events in its body: past 64, the row's report is omitted."""
    config = _config(tmp_path, agent_url, [{"mode": "huge_body_report"}])

    await collect(config)

    (row,) = _rows(config.output_path)
    report = FailureReportRow.report(row)
    assert len(report.events) <= 64
    assert report.omitted


async def test_a_password_the_excerpt_cut_through_is_removed_from_the_row(
    tmp_path: Path, agent_url: str
) -> None:
    """The kept body excerpt is cut at 512 characters with the mark, so the collector's own scrub sees
    the first characters of its URL's password there too."""
    password = "Zq9CutThroughPassword"
    url = agent_url.replace("http://", f"http://collector:{password}@")
    body = "x" * 505 + password
    config = _config(tmp_path, url, [{"mode": "error_body", "body": body}], max_attempts=1)

    await collect(config)

    saved = config.failures_path.read_text()
    assert "xxxx" in saved, "the control: the excerpt was kept"
    assert password[:6] not in saved
