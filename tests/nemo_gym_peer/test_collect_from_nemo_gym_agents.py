"""`gym-failures collect --agent-protocol nemo-gym` collects from NeMo Gym 0.7.0's own agent server.

The session's world (`peer_world`: NeMo Gym's head server, an agent on its `SimpleResponsesAPIAgent`,
a resources server, its `legacy_agent` relay), and every run made up front:
NeMo Gym's own collector and gym-failures' collector over the same input, each into its own run
directory, one attempt a rollout (NeMo Gym's collector makes one; `--max-attempts 1` makes ours make
one too). The tests then compare the two runs' files row by row, and what NeMo Gym's aggregation and
resume make of each.

The keys NeMo Gym's rows have that ours do not: `_ng_environment_server` and `_ng_result_type`, which
its relay's route stamps (our collector sends to the agent itself). The keys ours have beyond NeMo
Gym's: gym-failures' bookkeeping (`OURS`).
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

from tests.cli.invoke import run_cli
from tests.nemo_gym_peer.world import NemoGymReading, NemoGymWorld

RELAY_STAMPS = frozenset({"_ng_environment_server", "_ng_result_type"})
"""What NeMo Gym's collector stamps for the environment server it routed through."""
OURS = frozenset(
    {
        "rollout_id",
        "_gf_task_id",
        "_gf_final",
        "_gf_final_reason",
        "rollout_failure",
        "_ng_failure_events",
        "_ng_failure_id",
        "_ng_failure_events_omitted",
        "_gf_duration_s",
        "_gf_usage",
        "_gf_model_calls",
        "_gf_retry_rule",
    }
)
"""gym-failures' own keys on a row (`gym_failures.row_keys`, `failure_transport.FailureReportRow`)."""


def _task(number: int, **fields: Any) -> dict[str, Any]:
    return {
        "id": f"ng-agent-{number}",
        "responses_create_params": {"input": f"What is 2 + 2? ({number})"},
        "answer": "4",
        "expected": "4",
        **fields,
    }


ANSWERED = [
    _task(0),
    _task(1, answer="5"),
    _task(2, outcome="masked"),
    _task(3, outcome="degraded"),
    _task(4, outcome="judge_invalid"),
    _task(5, outcome="judge_error"),
    _task(6, outcome="agent_failure"),
    _task(7, outcome="agent_failure", terminal=True, failure_class="skipped"),
    _task(8, outcome="kill_shaped"),
]
"""Every outcome the agent answers 2xx: the reply is the row."""
FAILED_RUN = [
    _task(9, outcome="http_502"),
    _task(10, outcome="gym_failure"),
    _task(11, outcome="http_500"),
    _task(12, outcome="http_empty"),
]
"""Every `/run` that fails: a failure row as gym-failures' collector makes them."""
MIX = ANSWERED + FAILED_RUN
COUNTED = ["agent_run_error", "agent_request_failed"]
"""The classes NeMo Gym writes for a failed `/run`, counted as zeros (`+count_failure_classes_as_zero`)."""
RESUMABLE = [
    _task(30),
    _task(31, outcomes=["agent_failure", "success"]),
    _task(32, outcomes=["http_502", "success"]),
    _task(33, outcome="agent_failure", terminal=True),
]


@dataclass(frozen=True)
class Runs:
    world: NemoGymWorld
    tasks: dict[str, Path]
    nemo_gym: NemoGymReading
    """NeMo Gym's collection of MIX."""
    ours: Path
    """gym-failures' collection of MIX, `--agent-protocol nemo-gym`: the run directory."""
    ours_exit: int
    ours_summary: dict[str, Any]
    nemo_gym_aggregated: NemoGymReading
    ours_aggregated: NemoGymReading
    nemo_gym_counted: NemoGymReading
    """NeMo Gym's aggregation of its run with `count_failure_classes_as_zero` (`COUNTED`)."""
    ours_counted: NemoGymReading
    nemo_gym_resumed: NemoGymReading
    """NeMo Gym's resume (budget 1) of a copy of its own run."""
    ours_resumed_by_nemo_gym: NemoGymReading
    """NeMo Gym's resume (budget 1) of a copy of our run."""
    resumable: Path
    """NeMo Gym's collection of RESUMABLE, then resumed by gym-failures with no protocol named."""
    resumable_before: set[str]
    resumed_exit: int
    resumed_by_nemo_gym_after: NemoGymReading


def _write_tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _rows(path: Path) -> dict[tuple[int, int], dict[str, Any]]:
    rows = [json.loads(line) for line in _lines(path)]
    return {(row["_ng_task_index"], row["_ng_rollout_index"]): row for row in rows}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, peer_world: NemoGymWorld) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("ng_agent_runs")
    tasks = {
        "mix": _write_tasks(root / "input" / "mix.jsonl", MIX),
        "resumable": _write_tasks(root / "input" / "resumable.jsonl", RESUMABLE),
    }
    with contextlib.nullcontext(peer_world) as world:
        url = world.urls[world.agent_name]
        nemo_gym = world.collect(root / "nemo_gym", tasks["mix"], disable_health_check=True)
        ours = root / "ours"
        ours.mkdir()  # a run directory: its rows are `rollouts.jsonl`, as NeMo Gym's are
        code, out, _ = run_cli(
            "collect", tasks["mix"], "--agent-url", url, "--output", ours, "--agent-protocol", "nemo-gym",
            "--agent-name", world.agent_name, "--max-attempts", "1", "--concurrency", "1", "--json",
        )  # fmt: skip
        summary = json.loads(out)
        nemo_gym_aggregated = world.aggregate(root / "nemo_gym")
        ours_aggregated = world.aggregate(ours / "rollouts.jsonl")
        nemo_gym_counted = world.aggregate(root / "nemo_gym", count_failure_classes_as_zero=COUNTED)
        ours_counted = world.aggregate(ours / "rollouts.jsonl", count_failure_classes_as_zero=COUNTED)
        shutil.copytree(root / "nemo_gym", root / "nemo_gym_copy")
        nemo_gym_resumed = world.collect(
            root / "nemo_gym_copy", tasks["mix"], resume=True, max_attempts=1, disable_health_check=True
        )
        shutil.copytree(ours, root / "ours_copy")
        ours_resumed = world.collect(
            root / "ours_copy" / "rollouts.jsonl", tasks["mix"], resume=True, max_attempts=1,
            disable_health_check=True,
        )  # fmt: skip
        resumable = root / "resumable"
        world.collect(resumable, tasks["resumable"], disable_health_check=True)
        before = {*_lines(resumable / "rollouts.jsonl"), *_lines(resumable / "rollouts_failures.jsonl")}
        resumed_exit, _, _ = run_cli(
            "collect", tasks["resumable"], "--agent-url", url, "--output", resumable, "--max-attempts", "2",
        )  # fmt: skip
        after = world.collect(
            resumable, tasks["resumable"], resume=True, max_attempts=2, disable_health_check=True
        )
        yield Runs(
            world=world,
            tasks=tasks,
            nemo_gym=nemo_gym,
            ours=ours,
            ours_exit=code,
            ours_summary=summary,
            nemo_gym_aggregated=nemo_gym_aggregated,
            ours_aggregated=ours_aggregated,
            nemo_gym_counted=nemo_gym_counted,
            ours_counted=ours_counted,
            nemo_gym_resumed=nemo_gym_resumed,
            ours_resumed_by_nemo_gym=ours_resumed,
            resumable=resumable,
            resumable_before=before,
            resumed_exit=resumed_exit,
            resumed_by_nemo_gym_after=after,
        )


def test_both_collectors_ran(runs: Runs) -> None:
    assert runs.nemo_gym.error is None
    assert runs.ours_exit == 0
    assert runs.ours_summary["attempts"] == len(MIX)
    assert runs.ours_summary["omitted"] == 1, "the kill-shaped reply: saved nowhere, as NeMo Gym leaves it"


def test_the_same_rollouts_land_in_the_same_files(runs: Runs) -> None:
    ours, theirs = runs.ours, runs.nemo_gym
    assert set(_rows(ours / "rollouts.jsonl")) == set(_rows(theirs.rows_path))
    assert set(_rows(ours / "rollouts_failures.jsonl")) == set(_rows(theirs.failures_path))
    assert len(_lines(ours / "rollouts.jsonl")) == len(_lines(theirs.rows_path))
    assert len(_lines(ours / "rollouts_failures.jsonl")) == len(_lines(theirs.failures_path))
    killed = (ANSWERED.index(_task(8, outcome="kill_shaped")), 0)
    assert killed not in _rows(ours / "rollouts.jsonl") | _rows(ours / "rollouts_failures.jsonl")


def test_an_answered_rollout_is_stored_as_nemo_gym_stores_it(runs: Runs) -> None:
    """Every 2xx reply's row: NeMo Gym's keys and values, bar its relay's stamps, and ours beside them."""
    ours = _rows(runs.ours / "rollouts.jsonl") | _rows(runs.ours / "rollouts_failures.jsonl")
    theirs = _rows(runs.nemo_gym.rows_path) | _rows(runs.nemo_gym.failures_path)
    answered = [key for key in theirs if key[0] < len(ANSWERED)]
    assert len(answered) == len(ANSWERED) - 1  # all but the kill-shaped one
    for key in answered:
        expected = {name: value for name, value in theirs[key].items() if name not in RELAY_STAMPS}
        got = {name: value for name, value in ours[key].items() if name not in OURS}
        assert got == expected, key
        assert "result" not in ours[key], "the flat row is the result, as NeMo Gym stores it"


def test_a_failed_run_is_a_failure_row_as_our_collector_makes_them(runs: Runs) -> None:
    ours = _rows(runs.ours / "rollouts_failures.jsonl")
    theirs = _rows(runs.nemo_gym.failures_path)
    for number, task in enumerate(FAILED_RUN, start=len(ANSWERED)):
        row = ours[(number, 0)]
        # The class NeMo Gym's collector writes for the same failed `/run`; our kind in `failure`.
        assert row["_ng_failure_class"] == theirs[(number, 0)]["_ng_failure_class"], task["outcome"]
        assert row["_ng_failure_class"] in COUNTED
        assert row["rollout_failure"]["source"] == "environment"
        assert row["_gf_final"] is True
    assert ours[(9, 0)]["_ng_failure_http_status"] == 502
    assert ours[(10, 0)]["failure"]["failure_kind"] == "model_policy_response_timeout"
    assert "evt-world-10-0" in ours[(10, 0)]["_ng_failure_events"], "our report header, kept"
    assert ours[(11, 0)]["_ng_failure_http_status"] == 500
    assert ours[(12, 0)]["_ng_failure_http_status"] == 503


def test_no_attempt_was_refused_for_its_request(runs: Runs) -> None:
    """The gap this protocol closes: a NeMo Gym agent answers our episode request 422."""
    for path in (runs.ours / "rollouts_failures.jsonl", runs.resumable / "rollouts_failures.jsonl"):
        for line in _lines(path):
            assert json.loads(line).get("_ng_failure_http_status") != 422


def test_nemo_gym_aggregates_our_run_as_its_own(runs: Runs) -> None:
    ours, theirs = runs.ours_aggregated, runs.nemo_gym_aggregated
    assert ours.error is None
    assert theirs.error is None
    assert ours.agent_metrics == theirs.agent_metrics
    assert (ours.masked, ours.measured) == (theirs.masked, theirs.measured)


def test_nemo_gyms_zero_counting_counts_our_failed_runs_as_its_own(runs: Runs) -> None:
    """Issue 31: `count_failure_classes_as_zero=[agent_run_error]` skipped our rows, whose class held
    our kind: the two collectors' runs had different denominators."""
    ours, theirs = runs.ours_counted, runs.nemo_gym_counted
    assert ours.error is None
    assert theirs.error is None
    assert ours.agent_metrics == theirs.agent_metrics
    assert (ours.scored, ours.measured) == (theirs.scored, theirs.measured)
    assert ours.agent_metrics != runs.ours_aggregated.agent_metrics, "the failed runs count as zeros"


def test_nemo_gym_resumes_our_run_as_its_own(runs: Runs) -> None:
    ours, theirs = runs.ours_resumed_by_nemo_gym, runs.nemo_gym_resumed
    assert ours.error is None
    assert theirs.error is None
    assert ours.resume == theirs.resume
    assert ours.dispatched == theirs.dispatched == [(8, 0, 0)], "only the kill-shaped rollout"


def test_our_resume_of_a_nemo_gym_run_speaks_nemo_gym_unasked(runs: Runs) -> None:
    """No `--agent-protocol`: a run NeMo Gym wrote is collected in NeMo Gym's protocol; the open
    rollouts go at NeMo Gym's next attempt index, and NeMo Gym's own resume then finds nothing left."""
    assert runs.resumed_exit == 0
    rows = _lines(runs.resumable / "rollouts.jsonl") + _lines(runs.resumable / "rollouts_failures.jsonl")
    assert runs.resumable_before <= set(rows), "no row NeMo Gym wrote is lost"
    added = [json.loads(line) for line in rows if line not in runs.resumable_before]
    attempts = sorted((row["_ng_task_index"], row.get("_ng_attempt_index", 0)) for row in added)
    assert attempts == [(1, 1), (2, 1)]
    assert all("_ng_failure_class" not in row for row in added), "both succeeded at their second attempt"
    manifest = json.loads((runs.resumable / "rollouts.manifest.json").read_text())
    assert manifest["agent_protocol"] == "nemo-gym"
    after = runs.resumed_by_nemo_gym_after
    assert after.error is None
    assert after.resume is not None
    assert (after.resume["to_run"], after.dispatched) == (0, [])
