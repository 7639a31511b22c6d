"""NeMo Gym 0.7.0's own collector writes runs over NeMo Gym servers; gym-failures reads them as NeMo Gym does.

One world for the module (`NemoGymWorld`: NeMo Gym's head server, an agent and a resources server on
its base classes, its `legacy_agent` relay), and every NeMo Gym run made up front in the fixture; each
test then compares what gym-failures' readers (`gym_failures.rows.normalized`, the summary engine, the
gate, `explain`) read of NeMo Gym's files with what NeMo Gym itself reported (its coverage, its
aggregation's masked and measured counts, the rollouts it dropped, its resume). Where our reader does
not agree today, the test is a strict xfail naming the gap (issue 19): it flips when the fix lands.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gym_failures.collection import CollectionConfig, collect, read_rows
from gym_failures.failure_kinds import FailureClass, classify_failure
from gym_failures.gate import check, read_coverage
from gym_failures.reporting.explain import line_row
from gym_failures.reporting.summary import summarize
from gym_failures.rows import normalized
from tests.nemo_gym_peer.world import PEER_AGENT, NemoGymReading, NemoGymWorld

AGENT = PEER_AGENT
"""Not the world's default name: a configured agent name reaches NeMo Gym's rows as `agent_ref`."""
GYM_FAILURE_EVENT = "evt-world-"


def _task(number: int, **fields: Any) -> dict[str, Any]:
    return {
        "id": f"peer-{number}",
        "responses_create_params": {"input": f"What is 2 + 2? ({number})"},
        "answer": "4",
        "expected": "4",
        "mode": "ok",  # for gym-failures' own test agent, which resumes one of these runs
        **fields,
    }


MIX = [
    _task(0),
    _task(1, answer="5"),
    _task(2, outcome="masked"),
    _task(3, outcome="degraded"),
    _task(4, outcome="judge_error"),
    _task(5, outcome="agent_failure"),
    _task(6, outcome="agent_failure", terminal=True, failure_class="skipped"),
    _task(7, outcome="kill_shaped"),
    _task(8, outcome="http_502"),
    _task(9, outcome="gym_failure"),
    _task(10, outcome="http_empty"),
]
MASKED_ONLY = [_task(20), _task(21, outcome="masked"), _task(22, answer="5")]
RESUMABLE = [
    _task(30),
    _task(31, outcomes=["agent_failure", "success"]),
    _task(32, outcome="agent_failure", terminal=True),
    _task(33, outcomes=["kill_shaped", "success"], outcomes_by="dispatch"),
    _task(34, outcomes=["http_502", "http_502", "success"]),
    _task(35, outcome="agent_failure", failure_class="timeout_exceeded"),
]
KILLED = [*(_task(50 + number) for number in range(5)), _task(55, outcome="kill_shaped")]
"""A run whose workers were killed: every row it left is a success."""
DEGRADED = [
    *(_task(60 + number) for number in range(18)),
    *(_task(78 + n, outcome="degraded") for n in range(2)),
]
"""A run all of whose results are valid measurements, two of them degraded."""
REPEATED_LINE = [_task(70), _task(70), _task(71)]
"""Two identical lines: NeMo Gym gives them one task index (nemo_gym/rollout_collection.py:2160)."""
JUDGE_INVALID = [
    _task(40),
    _task(41, outcomes=["judge_invalid", "success"]),
    _task(42, outcome="judge_invalid"),
]


@dataclass(frozen=True)
class Runs:
    """Every NeMo Gym run the module reads, with what NeMo Gym reported of each."""

    mix: NemoGymReading
    mix_aggregated: NemoGymReading
    masked_only: NemoGymReading
    resumable: NemoGymReading
    """The first collection of RESUMABLE (its directory has been resumed since: `resumable_copy` holds
    its files as this collection left them)."""
    resumable_copy: Path
    resumed: NemoGymReading
    """NeMo Gym's resume of RESUMABLE."""
    judge_invalid: NemoGymReading
    """NeMo Gym's resume with `retry_invalid_judge_responses` of a run with invalid judge answers."""
    killed: NemoGymReading
    degraded: NemoGymReading
    repeated_line: NemoGymReading
    world: NemoGymWorld
    """Up until the module ends, for a test's own job."""
    tasks: dict[str, Path]


def _write_tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, peer_world: NemoGymWorld) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("nemo_gym_runs")
    tasks = {
        name: _write_tasks(root / "input" / f"{name}.jsonl", rows)
        for name, rows in {
            "mix": MIX,
            "masked_only": MASKED_ONLY,
            "resumable": RESUMABLE,
            "judge_invalid": JUDGE_INVALID,
            "killed": KILLED,
            "degraded": DEGRADED,
            "repeated_line": REPEATED_LINE,
        }.items()
    }
    with contextlib.nullcontext(peer_world) as world:  # the session's, its agent named AGENT
        mix = world.collect(root / "mix", tasks["mix"], num_repeats=2)
        # NeMo Gym's health check runs over the mix run only: the others need no report of it.
        mix_aggregated = world.aggregate(root / "mix")
        masked_only = world.collect(root / "masked_only", tasks["masked_only"], disable_health_check=True)
        resumable = world.collect(root / "resumable", tasks["resumable"], disable_health_check=True)
        copy = root / "resumable_copy"
        shutil.copytree(root / "resumable", copy)
        resumed = world.collect(
            root / "resumable", tasks["resumable"], resume=True, disable_health_check=True
        )
        world.collect(root / "judge_invalid", tasks["judge_invalid"], disable_health_check=True)
        judge_invalid = world.collect(
            root / "judge_invalid",
            tasks["judge_invalid"],
            resume=True,
            retry_invalid_judge_responses=True,
            disable_health_check=True,
        )
        killed = world.collect(root / "killed", tasks["killed"], disable_health_check=True)
        degraded = world.collect(root / "degraded", tasks["degraded"], disable_health_check=True)
        repeated_line = world.collect(
            root / "repeated_line", tasks["repeated_line"], disable_health_check=True
        )
        yield Runs(
            mix,
            mix_aggregated,
            masked_only,
            resumable,
            copy,
            resumed,
            judge_invalid,
            killed,
            degraded,
            repeated_line,
            world,
            tasks,
        )


def _files(reading: NemoGymReading) -> list[Path]:
    return [reading.rows_path, reading.failures_path]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --- The world: NeMo Gym's own run directory ---------------------------------------------------


def test_nemo_gym_writes_its_own_run_directory(runs: Runs) -> None:
    reading = runs.mix
    assert reading.error is None
    assert reading.files == [
        "quality_summary.json",
        "rollout_verdicts.jsonl",
        "rollouts.jsonl",
        "rollouts_aggregate_metrics.json",
        "rollouts_failures.jsonl",
        "rollouts_materialized_inputs.jsonl",
    ]
    assert len(_lines(reading.materialized_path)) == reading.expected == len(MIX) * 2
    rows = [json.loads(line) for line in _lines(reading.rows_path) + _lines(reading.failures_path)]
    assert {row["agent_ref"]["name"] for row in rows} == {AGENT}
    assert {row["_ng_environment_server"] for row in rows} == {f"{AGENT}_environment_server"}
    # Every rollout reached the agent once, at NeMo Gym's first attempt index.
    assert reading.dispatched == [(task, rollout, 0) for task in range(len(MIX)) for rollout in range(2)]


def test_what_nemo_gym_refuses_is_a_reading_and_the_world_stays_up(runs: Runs, tmp_path: Path) -> None:
    missing = runs.world.collect(tmp_path / "run", tmp_path / "no-such-input.jsonl")
    assert missing.error is not None
    assert missing.error["type"] == "ConfigPathNotFoundError"
    # NeMo Gym's default: a failed /run ends the run, after the materialized inputs are written.
    tasks = _write_tasks(tmp_path / "tasks.jsonl", [_task(90), _task(91, outcome="http_502")])
    ended = runs.world.collect(tmp_path / "ended", tasks, route_failures_to_sidecar=False)
    assert ended.error is not None
    assert ended.error["type"] == "ClientResponseError"
    assert len(_lines(ended.materialized_path)) == 2
    assert runs.world.collect(tmp_path / "after", tasks).error is None


def test_nemo_gym_keeps_our_error_body_and_none_for_an_empty_one(runs: Runs) -> None:
    by_task = {row["_ng_task_index"]: row for row in map(json.loads, _lines(runs.mix.failures_path))}
    ours = json.loads(by_task[9]["_ng_failure_response_body"])
    assert ours["failure_kind"] == "model_policy_response_timeout"
    assert ours["event_id"].startswith(GYM_FAILURE_EVENT)
    assert by_task[9]["_ng_failure_class"] == "agent_run_error"
    assert by_task[10]["_ng_failure_response_body"] is None
    assert by_task[10]["_ng_failure_class"] == "agent_request_failed"


# --- Counts ----------------------------------------------------------------------------------------


def test_the_rows_read_as_nemo_gym_persisted_and_dropped_them(runs: Runs) -> None:
    reading = runs.mix
    rows = [normalized(row, 3) for path in _files(reading) for row in read_rows(path)]
    successes = [row for row in rows if "failure" not in row]
    failures = [row for row in rows if "failure" in row]
    assert len(successes) == reading.scored, "NeMo Gym's coverage/scored counts every persisted result"
    assert len(failures) == sum(reading.dropped.values()) == reading.failed
    assert len(successes) + len(failures) + reading.omitted == reading.expected


def test_the_summary_counts_rows_as_nemo_gym_does(runs: Runs) -> None:
    reading = runs.mix
    summary = summarize(_files(reading), max_attempts=3)
    assert (summary.success_rows, summary.failure_rows) == (reading.scored, reading.failed)
    assert summary.not_persisted_rows == 0, "NeMo Gym saves no kill-shaped row"


def test_a_masked_run_is_masked_and_scored_as_nemo_gym_aggregates_it(runs: Runs) -> None:
    reading = runs.masked_only
    coverage = read_coverage(_files(reading), max_attempts=3)
    assert (coverage.masked, coverage.scored) == (reading.masked, reading.measured) == (1, 2)
    assert summarize(_files(reading), max_attempts=3).masked_success_rows == reading.masked


def test_degraded_results_are_scored_as_nemo_gym_aggregates_them(runs: Runs) -> None:
    reading = runs.mix_aggregated
    coverage = read_coverage(_files(reading), max_attempts=3)
    assert (coverage.masked, coverage.scored) == (reading.masked, reading.measured)


def test_the_summary_masks_as_nemo_gym_does(runs: Runs) -> None:
    reading = runs.mix_aggregated
    assert summarize(_files(reading), max_attempts=3).masked_success_rows == reading.masked


def test_the_gate_owes_the_rollouts_nemo_gym_materialized(runs: Runs) -> None:
    reading = runs.mix
    coverage = read_coverage(_files(reading), max_attempts=3)
    assert coverage.expected == reading.expected
    # NeMo Gym's missing is every owed rollout without a result: ours without any outcome, and final failures.
    assert coverage.missing + sum(coverage.failed.values()) == reading.missing


def test_the_gate_fails_a_run_whose_workers_were_killed(runs: Runs) -> None:
    """NeMo Gym reports the killed rollout missing from the score; the gate must not pass the run."""
    reading = runs.killed
    assert (reading.expected, reading.scored, reading.missing) == (6, 5, 1)
    verdict = check(read_coverage(_files(reading), max_attempts=3))
    assert not verdict.passed
    assert verdict.coverage.missing == reading.missing


def test_the_gate_passes_a_run_nemo_gym_measured_whole(runs: Runs) -> None:
    """NeMo Gym measures all 20 results, degraded ones included; the gate must score as many."""
    reading = runs.degraded
    assert (reading.measured, reading.masked) == (20, 0)
    verdict = check(read_coverage(_files(reading), max_attempts=3))
    assert verdict.passed, verdict.reasons
    assert verdict.coverage.scored == reading.measured


def test_nemo_gym_aggregation_reads_the_run_its_collector_wrote(runs: Runs) -> None:
    """`gym eval aggregate` agrees with the collector on what it scored (it does not see killed rollouts)."""
    aggregated, collected = runs.mix_aggregated, runs.mix
    assert aggregated.error is None
    assert aggregated.agent_metrics == collected.agent_metrics
    assert aggregated.scored == collected.scored
    assert collected.expected is not None
    assert aggregated.expected == collected.expected - collected.omitted


# --- Causes ---------------------------------------------------------------------------------------


def _gym_failure_line(reading: NemoGymReading) -> tuple[int, dict[str, Any]]:
    for number, line in enumerate(_lines(reading.failures_path), 1):
        row = json.loads(line)
        if row["_ng_task_index"] == 9:
            return number, row
    raise AssertionError("no row for the gym-failures failure")


def test_explain_reads_our_failure_from_the_body_nemo_gym_kept(runs: Runs) -> None:
    number, row = _gym_failure_line(runs.mix)
    ours = json.loads(row["_ng_failure_response_body"])
    explanation = line_row(runs.mix.failures_path, number)
    assert explanation is not None
    assert explanation.reported_failure is not None
    assert explanation.reported_failure["event_id"] == ours["event_id"]
    assert explanation.reported_failure["failure_kind"] == ours["failure_kind"]
    assert explanation.reported_failure["truncated"] is False


def test_the_summary_counts_our_failure_from_the_body_nemo_gym_kept(runs: Runs) -> None:
    summary = summarize(_files(runs.mix), max_attempts=3)
    assert "model_policy_response_timeout" in {item.value for item in summary.by_reported_kind}


# --- Labels NeMo Gym and its agents write ---------------------------------------------------------


def _labelled_rows(runs: Runs) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for reading in (runs.mix, runs.resumed, runs.judge_invalid):
        for line in _lines(reading.failures_path):
            row = json.loads(line)
            rows.setdefault(row["_ng_failure_class"], row)
    return rows


@pytest.mark.parametrize(
    "label",
    [
        "agent_run_error",
        "agent_request_failed",
        "judge_failed",
        "judge_invalid",
        "remote_agent_error",
        "skipped",
        "timeout_exceeded",
    ],
)
def test_every_label_nemo_gym_wrote_is_classified(runs: Runs, label: str) -> None:
    row = normalized(_labelled_rows(runs)[label], 3)
    failure = row["failure"]
    status = row.get("_ng_failure_http_status")
    assert classify_failure(failure["failure_kind"], failure.get("stage"), status) != FailureClass.UNKNOWN


def test_nemo_gym_migrates_invalid_judge_answers_under_judge_invalid(runs: Runs) -> None:
    reading = runs.judge_invalid
    migrated = [json.loads(line) for line in _lines(reading.failures_path)]
    assert [(row["_ng_task_index"], row["_ng_failure_class"]) for row in migrated] == [
        (1, "judge_invalid"),
        (2, "judge_invalid"),
    ]
    assert all(row["_ng_migrated_invalid_judge_response"] for row in migrated)
    assert reading.dispatched == [(1, 0, 1), (2, 0, 1)]
    failures = [normalized(row, 3) for row in read_rows(reading.failures_path)]
    # NeMo Gym's migration names judge_invalid the condition its vocabulary calls judge_unparseable
    # (rollout_collection.py:1303): read as that kind.
    assert [row["failure"]["failure_kind"] for row in failures] == ["judge_unparseable", "judge_unparseable"]
    assert not any(row["final"] for row in failures), "NeMo Gym retries them, and one recovered"


# --- Resume, both ways ----------------------------------------------------------------------------


def test_nemo_gym_resumes_the_open_rollouts_our_reader_finds(runs: Runs) -> None:
    """The rollouts NeMo Gym's resume ran, at which attempt, are the ones our gate finds open."""
    resumed = runs.resumed
    assert resumed.resume is not None
    copy = runs.resumable_copy
    coverage = read_coverage([copy / "rollouts.jsonl", copy / "rollouts_failures.jsonl"], max_attempts=3)
    # The materialized inputs are the gate's inventory: what left no row is missing there too.
    assert coverage.expected == len(RESUMABLE)
    assert resumed.resume["to_run"] == coverage.missing
    assert resumed.dispatched == [(1, 0, 1), (3, 0, 0), (4, 0, 1), (5, 0, 1)]


async def test_gym_failures_resumes_a_run_nemo_gym_wrote_without_rerunning_finished_rollouts(
    runs: Runs, agent_url: str, tmp_path: Path
) -> None:
    """gym-failures' collector, its output the NeMo Gym run's rows file, dispatches exactly what NeMo
    Gym's own resume of the same files did, at the same attempts, and keeps every row."""
    run = tmp_path / "run"
    shutil.copytree(runs.resumable_copy, run)
    before = set(_lines(run / "rollouts.jsonl")) | set(_lines(run / "rollouts_failures.jsonl"))
    summary = await collect(
        CollectionConfig(
            input_path=runs.tasks["resumable"],
            output_path=run / "rollouts.jsonl",
            agent_url=agent_url,
            max_attempts=3,
        )
    )
    after = _lines(run / "rollouts.jsonl") + _lines(run / "rollouts_failures.jsonl")
    assert before <= set(after), "no row NeMo Gym wrote is lost"
    added = [json.loads(line) for line in after if line not in before]
    dispatched = sorted(
        (row["_ng_task_index"], row["_ng_rollout_index"], row.get("_ng_attempt_index", 0)) for row in added
    )
    assert dispatched == runs.resumed.dispatched
    assert summary.already_done == len(RESUMABLE) - len(dispatched)
    # And back: NeMo Gym's resume of the run gym-failures resumed finds nothing left to run.
    again = runs.world.collect(run, runs.tasks["resumable"], resume=True, disable_health_check=True)
    assert again.error is None
    assert again.resume is not None
    assert (again.resume["to_run"], again.dispatched) == (0, [])
    assert set(after) <= set(_lines(run / "rollouts.jsonl") + _lines(run / "rollouts_failures.jsonl"))


async def test_gym_failures_resumes_a_run_whose_input_repeats_a_line_as_nemo_gym_numbers_it(
    runs: Runs, agent_url: str, tmp_path: Path
) -> None:
    reading = runs.repeated_line
    indices = sorted(_key(json.loads(line)) for line in _lines(reading.rows_path))
    assert indices == [(0, 0), (0, 1), (1, 0)], "NeMo Gym's numbering: one task, two rollouts"
    run = tmp_path / "run"
    shutil.copytree(reading.run_dir, run)
    summary = await collect(
        CollectionConfig(
            input_path=runs.tasks["repeated_line"], output_path=run / "rollouts.jsonl", agent_url=agent_url
        )
    )
    assert (summary.already_done, summary.attempts) == (3, 0)


def _key(row: dict[str, Any]) -> tuple[int, int]:
    return (row["_ng_task_index"], row["_ng_rollout_index"])
