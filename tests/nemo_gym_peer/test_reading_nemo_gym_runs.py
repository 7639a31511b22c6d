"""NeMo Gym 0.7.0's run directories read as NeMo Gym reads them: the same counts, masks, missing
rollouts and terminal decisions from gym-failures' readers as from NeMo Gym's own functions.

One peer run (`peer/reading_runs.py`) builds every directory with NeMo Gym's own code and reports what
that code says of it; each test reads the same directory with gym-failures and compares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gym_failures.gate import check, read_coverage, rollout_coverage
from gym_failures.nemo_gym import reported_failure
from gym_failures.reporting.explain import rollout_rows
from gym_failures.reporting.summary import summarize
from gym_failures.rows import read_rows, row_files
from tests.nemo_gym_peer.peer_process import run_peer


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The run directories NeMo Gym made, and what its own functions say of each."""
    root = tmp_path_factory.mktemp("nemo-gym-runs")
    readings = run_peer("reading_runs", str(root / "runs"), cwd=root)
    return root / "runs", readings


def _ids(keys: list[list[int]]) -> list[str]:
    return [f"{task}:{rollout}" for task, rollout in keys]


def test_only_nemo_gyms_row_files_are_read_as_rows(runs: tuple[Path, dict[str, Any]]) -> None:
    root, readings = runs
    for case, reading in readings.items():
        run = root / case
        beside = {"rollouts_materialized_inputs.jsonl", "rollout_verdicts.jsonl", "quality_summary.json"}
        assert beside <= set(reading["files"]), "NeMo Gym wrote its reports beside the rows"
        assert [path.name for path in row_files(run)] == [
            name for name in ("rollouts.jsonl", "rollouts_failures.jsonl") if (run / name).exists()
        ]
        summary = summarize([run])
        assert summary.other_rows == 0
        health = reading["health"]
        assert health["artifacts"]["records"] == summary.success_rows, "its checks read the rows we read"
        assert sum(health["verdicts"].values()) == summary.success_rows


def test_the_gate_counts_the_materialized_inputs_as_nemo_gym_does(runs: tuple[Path, dict[str, Any]]) -> None:
    root, readings = runs
    for case, reading in readings.items():
        coverage = read_coverage(row_files(root / case))
        assert coverage.expected_source == "materialized_inputs"
        assert coverage.expected == reading["expected"], case
        successes = (
            coverage.scored + coverage.masked + coverage.unscored + sum(coverage.gate_derived.values())
        )
        assert successes == reading["successes"], case
        if successes < coverage.expected:
            assert (
                f"Rollouts missing from the score: {coverage.expected - successes} of {coverage.expected} "
                in reading["coverage_report"]
            )


def test_the_missing_rollouts_are_those_nemo_gyms_resume_would_run(runs: tuple[Path, dict[str, Any]]) -> None:
    """A rollout without a final outcome is one NeMo Gym's resume dispatches again; those that left no
    row at all are the ones its `count_missing_rollouts_as_zero` would score as zeros."""
    root, readings = runs
    for case, reading in readings.items():
        coverage = read_coverage(row_files(root / case))
        assert coverage.missing_rollouts == _ids(reading["to_run"]), case
        assert coverage.missing == len(reading["to_run"])
        assert coverage.left_no_row == len(reading["left_no_row"])
        assert set(_ids(reading["left_no_row"])) <= set(coverage.missing_rollouts)
        summary = summarize([root / case])
        assert (summary.expected_rollouts, summary.missing_rollouts) == (
            reading["expected"],
            len(reading["left_no_row"]),
        )


def test_a_run_whose_workers_were_killed_fails_only_with_its_inventory(
    runs: tuple[Path, dict[str, Any]],
) -> None:
    root, readings = runs
    files = row_files(root / "killed")
    verdict = check(read_coverage(files))
    assert not verdict.passed
    assert verdict.coverage.missing_rollouts == _ids(readings["killed"]["left_no_row"]) == ["8:0", "9:0"]
    seen_only = rollout_coverage(row for path in files for row in read_rows(path))
    assert check(seen_only).passed, "counting only the rollouts seen, the killed ones are not missed"


def test_masking_is_nemo_gyms_mask_sample_alone(runs: tuple[Path, dict[str, Any]]) -> None:
    root, readings = runs
    run = root / "mixed"
    summary = summarize([run])
    coverage = read_coverage(row_files(run))
    assert (summary.masked_success_rows, summary.degraded_success_rows) == (1, 1)
    assert (coverage.masked, coverage.degraded, coverage.degraded_by_kind) == (1, 1, {"judge_failed": 1})
    masked_pct = round(100 * summary.masked_success_rows / summary.success_rows, 2)
    assert readings["mixed"]["masking"]["progress/agent/masked_pct"] == masked_pct
    assert readings["mixed"]["masking"]["progress/agent/failed"] == summary.failure_rows


def test_each_sidecar_rows_terminal_decision_is_nemo_gyms(runs: tuple[Path, dict[str, Any]]) -> None:
    """`is_terminal_failure` is `bool(_ng_failure_terminal)`: `"false"` is terminal, `0` and `""` not."""
    root, readings = runs
    for case, reading in readings.items():
        ours = [
            [row["task_index"], row["rollout_index"], row["failure"]["terminal"]]
            for row in read_rows(root / case / "rollouts_failures.jsonl")
        ]
        assert ours == reading["terminal"], case
    assert {terminal for *_, terminal in readings["truthy"]["terminal"]} == {True, False}


def test_mask_sample_is_read_by_truthiness_as_nemo_gyms_aggregation_reads_it(
    runs: tuple[Path, dict[str, Any]],
) -> None:
    """Its `_partition_on_mask` masks `1`, `1.0`, `"true"`, even `"false"`; never `0`, `""`, `[]`."""
    root, readings = runs
    for case, reading in readings.items():
        run = root / case
        ours = sorted(
            [row["task_index"], row["rollout_index"]]
            for row in read_rows(run / "rollouts.jsonl")
            if row.get("masked") is True
        )
        assert ours == reading["masked"], case
        assert summarize([run]).masked_success_rows == len(reading["masked"]), case
        assert read_coverage(row_files(run)).masked == len(reading["masked"]), case
    assert 0 < len(readings["truthy"]["masked"]) < len(readings["truthy"]["result_keys"])


def test_a_datasets_columns_named_like_our_keys_are_its_data(runs: tuple[Path, dict[str, Any]]) -> None:
    """NeMo Gym's simple agent copies the request's fields into its result: `task_index: 42`,
    `failure: "none"`, `masked: true` and the like are the dataset's, never our keys."""
    root, readings = runs
    run, reading = root / "dataset", readings["dataset"]
    results = list(read_rows(run / "rollouts.jsonl"))
    assert [[row["task_index"], row["rollout_index"]] for row in results] == reading["result_keys"]
    assert all("failure" not in row and row["attempt"] == 1 for row in results)
    assert {row["result"].get("task_index") for row in results} >= {42}, "the column is kept as data"
    summary = summarize([run])
    assert (summary.success_rows, summary.failure_rows, summary.final_failure_rows) == (9, 1, 0)
    (failure,) = read_rows(run / "rollouts_failures.jsonl")
    assert (failure["rollout_id"], failure["attempt"], failure["final"]) == ("8:1", 1, False)
    assert read_coverage(row_files(run)).missing_rollouts == _ids(reading["to_run"])


def test_a_main_file_row_with_an_error_is_a_result_as_nemo_gym_reads_it(
    runs: tuple[Path, dict[str, Any]],
) -> None:
    """NeMo Gym's resume takes every main-file row as done, and its aggregation measures it."""
    root, readings = runs
    run, reading = root / "error_row", readings["error_row"]
    assert (reading["to_run"], reading["successes"]) == ([], 2)
    assert all("failure" not in row for row in read_rows(run / "rollouts.jsonl"))
    summary = summarize([run])
    assert (summary.success_rows, summary.failure_rows) == (2, 0)
    coverage = read_coverage(row_files(run))
    assert (coverage.missing, sum(coverage.failed.values()), coverage.masked) == (0, 0, 0)


def test_every_label_nemo_gym_wrote_is_classified(runs: tuple[Path, dict[str, Any]]) -> None:
    """Its judge migration's `judge_invalid`, Stirrup's `skipped` and `timeout_exceeded`, the
    collector's own classes: none is of unknown class, so none fails the gate by itself."""
    root, readings = runs
    labels = set(readings["mixed"]["latest_classes"].values())
    assert {
        "judge_invalid",
        "skipped",
        "timeout_exceeded",
        "agent_run_error",
        "environment_server_failed",
    } <= labels
    summary = summarize([root / "mixed"])
    assert [group.value for group in summary.by_class if group.value == "unknown"] == []
    assert read_coverage(row_files(root / "mixed")).failed["unknown"] == 0
    kinds = {kind.value for kind in summary.by_kind}
    assert {"judge_unparseable", "stirrup:skipped", "agent_timeout"} <= kinds


def test_our_agents_failure_is_read_from_the_body_nemo_gym_kept(runs: tuple[Path, dict[str, Any]]) -> None:
    """NeMo Gym keeps no headers: the kind and event id of our agent's failure come back from the
    body its collector kept, a body it cut as far as it goes."""
    root, _ = runs
    run = root / "mixed"
    short = rollout_rows(row_files(run), "2:1")
    (explained,) = [item for item in short if item.outcome == "failure"]
    assert explained.failure is not None
    assert explained.failure["failure_kind"] == "agent_run_error"
    assert explained.reported_failure is not None
    assert explained.reported_failure["failure_kind"] == "model_server_error"
    assert explained.reported_failure["failure_reason"] == "the model server answered 503"
    assert explained.reported_failure["event_id"]
    assert explained.reported_failure["truncated"] is False
    (cut, *_) = rollout_rows(row_files(run), "3:0")
    assert cut.reported_failure is not None
    assert (cut.reported_failure["failure_kind"], cut.reported_failure["truncated"]) == (
        "model_server_error",
        True,
    )
    assert cut.reported_failure["failure_reason"].startswith("the model server answered 503 for every retry")
    assert summarize([run]).by_reported_kind[0].model_dump() == {
        "value": "model_server_error",
        "count": 4,
        "final": 1,
        "share": 0.5,
    }
    assert reported_failure(None) is None
