"""A NeMo Gym run directory read as NeMo Gym reads it: its row files only, its materialized inputs as
the inventory of rollouts owed (the gate's and the summary's denominator), masked and degraded results
apart, and the failure its kept reply body names. The real NeMo Gym's side of each of these is in
tests/nemo_gym_peer/test_reading_nemo_gym_runs.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gym_failures import nemo_gym
from gym_failures.gate import GateThresholds, check, read_coverage
from gym_failures.gate._coverage import MAX_LISTED_MISSING
from gym_failures.reporting.summary import summarize
from gym_failures.rows import row_files, run_failures_file
from tests.cli.invoke import run_cli


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _inputs(tasks: int, repeats: int = 1) -> list[dict[str, Any]]:
    return [
        {"_ng_task_index": task, "_ng_rollout_index": rollout, "agent_ref": {"name": "agent"}, "prompt": "p"}
        for task in range(tasks)
        for rollout in range(repeats)
    ]


def _success(task: int, rollout: int = 0, **extra: Any) -> dict[str, Any]:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": 1.0, "response": {}, **extra}


def _run(tmp_path: Path, *, tasks: int = 4) -> Path:
    """A NeMo Gym run directory: two successes (one degraded), a masked one, a final failure, and one
    rollout that left no row; its reports beside the rows."""
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "rollouts_materialized_inputs.jsonl", _inputs(tasks))
    _write(
        run / "rollouts.jsonl",
        [
            _success(0),
            _success(1, failure_kind="judge_failed", failure_reason="judge retried once", mask_sample=False),
            _success(2, failure_kind="session_lost", mask_sample=True, reward=0.0),
        ],
    )
    failure = {"_ng_task_index": 3, "_ng_rollout_index": 0, "_ng_failure_class": "skipped"}
    _write(run / "rollouts_failures.jsonl", [{**failure, "_ng_failure_terminal": True}])
    verdicts = [
        {"_ng_task_index": i, "_ng_rollout_index": 0, "rollout_id": None, "verdict": "healthy"}
        for i in range(3)
    ]
    _write(run / "rollout_verdicts.jsonl", verdicts)
    (run / "quality_summary.json").write_text("{}")
    (run / "rollouts_aggregate_metrics.json").write_text("[]")
    return run


def test_a_nemo_gym_run_directorys_row_files_are_its_rows_and_failures(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert row_files(run) == [run / "rollouts.jsonl", run / "rollouts_failures.jsonl"]
    for name in (
        "rollouts_materialized_inputs.jsonl",
        "rollout_verdicts.jsonl",
        "quality_summary.json",
        "rollouts_aggregate_metrics.json",
    ):
        assert nemo_gym.is_report_file(run / name)
    assert not nemo_gym.is_report_file(run / "rollouts.jsonl")


def test_a_nemo_gym_runs_rows_named_alone_bring_its_failures(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert run_failures_file(run / "rollouts.jsonl") == run / "rollouts_failures.jsonl"
    assert run_failures_file(run / "rollouts_failures.jsonl") is None
    (run / "rollouts_materialized_inputs.jsonl").unlink()
    assert run_failures_file(run / "rollouts.jsonl") is None, "without inventory or manifest: rows of no run"


def test_the_gate_counts_against_the_materialized_inputs(tmp_path: Path) -> None:
    run = _run(tmp_path, tasks=5)
    coverage = read_coverage(row_files(run))
    assert coverage.expected_source == "materialized_inputs"
    assert coverage.manifests == [str(run / "rollouts_materialized_inputs.jsonl")]
    assert (coverage.expected, coverage.seen) == (5, 4)
    assert (coverage.scored, coverage.degraded, coverage.masked) == (2, 1, 1)
    assert coverage.degraded_by_kind == {"judge_failed": 1}
    assert coverage.failed == {"model": 0, "evaluation": 1, "unknown": 0}, "skipped is evaluation-side"
    assert (coverage.missing, coverage.left_no_row, coverage.missing_rollouts) == (1, 1, ["4:0"])
    verdict = check(coverage, GateThresholds(min_scored_share=0.0, max_evaluation_share=1.0))
    assert verdict.reasons == ["1 rollout missing (maximum 0); it left no row at all"]


def test_a_run_whose_workers_were_killed_fails_the_gate(tmp_path: Path) -> None:
    """Every row there is a clean success; the rollouts the killed workers held left none."""
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "rollouts_materialized_inputs.jsonl", _inputs(10))
    _write(run / "rollouts.jsonl", [_success(task) for task in range(8)])
    verdict = check(read_coverage(row_files(run)))
    assert not verdict.passed
    assert verdict.coverage.missing_rollouts == ["8:0", "9:0"]


def test_a_retried_rollout_without_an_outcome_is_missing_but_left_a_row(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "rollouts_materialized_inputs.jsonl", _inputs(2))
    _write(run / "rollouts.jsonl", [_success(0)])
    _write(
        run / "rollouts_failures.jsonl",
        [{"_ng_task_index": 1, "_ng_rollout_index": 0, "_ng_failure_class": "x"}],
    )
    coverage = read_coverage(row_files(run), max_attempts=3)
    assert (coverage.missing, coverage.left_no_row, coverage.missing_rollouts) == (1, 0, ["1:0"])


def test_an_outcome_the_inventory_does_not_owe_is_unexpected(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "rollouts_materialized_inputs.jsonl", _inputs(1))
    _write(run / "rollouts.jsonl", [_success(0), _success(7)])
    coverage = read_coverage(row_files(run))
    assert (coverage.expected, coverage.unexpected, coverage.missing) == (1, 1, 0)


def test_missing_rollouts_are_named_up_to_the_bound(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "rollouts_materialized_inputs.jsonl", _inputs(MAX_LISTED_MISSING + 1))
    _write(run / "rollouts.jsonl", [])
    coverage = read_coverage([run / "rollouts.jsonl"])
    assert coverage.missing == MAX_LISTED_MISSING + 1
    assert len(coverage.missing_rollouts) == MAX_LISTED_MISSING
    assert coverage.missing_rollouts[:2] == ["0:0", "1:0"]
    _write(run / "rollouts_materialized_inputs.jsonl", _inputs(MAX_LISTED_MISSING))
    assert len(read_coverage([run / "rollouts.jsonl"]).missing_rollouts) == MAX_LISTED_MISSING


def test_a_given_expected_count_wins_over_the_inventory(tmp_path: Path) -> None:
    run = _run(tmp_path)
    coverage = read_coverage(row_files(run), expected=4)
    assert (coverage.expected_source, coverage.missing, coverage.missing_rollouts) == ("given", 0, [])


def test_inventory_lines_that_name_no_rollout_are_counted_and_warned(tmp_path: Path) -> None:
    path = tmp_path / "rollouts_materialized_inputs.jsonl"
    path.write_bytes(
        b'{"_ng_task_index": 0, "_ng_rollout_index": 0}\n\nnot json\n[1]\n{"_ng_task_index": "1"}\n'
    )
    inventory = nemo_gym.read_inventory([path])
    assert (inventory.keys, inventory.lines, inventory.invalid_lines) == ({(0, 0)}, 4, 3)
    _write(tmp_path / "rollouts.jsonl", [_success(0)])
    verdict = check(read_coverage([tmp_path / "rollouts.jsonl"]))
    assert verdict.passed
    assert any(
        "3 lines of the materialized inputs name no rollout" in warning for warning in verdict.warnings
    )


@given(st.lists(st.binary(max_size=40), max_size=6))
def test_any_inventory_reads_without_raising(lines: list[bytes]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "x_materialized_inputs.jsonl"
        path.write_bytes(b"\n".join(lines))
        inventory = nemo_gym.read_inventory([path])
        assert len(inventory.keys) + inventory.invalid_lines <= inventory.lines


def test_summarize_reads_the_inventory_and_counts_masked_and_degraded_apart(tmp_path: Path) -> None:
    run = _run(tmp_path, tasks=5)
    summary = summarize([run])
    assert summary.files == [str(run / "rollouts.jsonl"), str(run / "rollouts_failures.jsonl")]
    assert (summary.rows, summary.other_rows) == (4, 0)
    assert (summary.success_rows, summary.masked_success_rows, summary.degraded_success_rows) == (3, 1, 1)
    assert (summary.expected_rollouts, summary.missing_rollouts) == (5, 1)
    assert summary.materialized_inputs == [str(run / "rollouts_materialized_inputs.jsonl")]
    assert [(kind.value, kind.failure_class) for kind in summary.by_kind] == [
        ("stirrup:skipped", "evaluation")
    ]


def test_summarize_without_an_inventory_says_nothing_of_missing_rollouts(tmp_path: Path) -> None:
    summary = summarize([_write(tmp_path / "rows.jsonl", [_success(0)])])
    assert (summary.expected_rollouts, summary.missing_rollouts, summary.materialized_inputs) == (
        None,
        None,
        [],
    )


def _body_run(tmp_path: Path) -> Path:
    """A NeMo Gym run whose agent is a gym-failures server: the collector kept only its reply's body."""
    from gym_failures.asgi import error_body
    from gym_failures.failure_records import FailureEvent

    event = FailureEvent(
        boundary="agent", failure_kind="model_server_error", failure_reason="upstream 503", event_id="ev1-abc"
    )
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "rollouts_materialized_inputs.jsonl", _inputs(2))
    _write(run / "rollouts.jsonl", [_success(0)])
    row = {
        "_ng_task_index": 1,
        "_ng_rollout_index": 0,
        "_ng_failure_class": "agent_run_error",
        "_ng_failure_type": "ClientResponseError",
        "_ng_failure_message": "500, message='Internal Server Error', url='http://127.0.0.1:1/run'",
        "_ng_failure_http_status": 500,
        "_ng_failure_response_body": error_body(event, status=500).decode(),
    }
    _write(run / "rollouts_failures.jsonl", [row])
    return run


def test_summarize_counts_failures_by_the_kind_their_kept_body_names(tmp_path: Path) -> None:
    summary = summarize([_body_run(tmp_path)])
    assert [(group.value, group.count) for group in summary.by_kind] == [("agent_run_error", 1)]
    assert [(group.value, group.count) for group in summary.by_reported_kind] == [("model_server_error", 1)]


def test_explain_shows_the_failure_the_kept_body_names(tmp_path: Path) -> None:
    run = _body_run(tmp_path)
    code, out, _ = run_cli("explain", run, "--rollout", "1:0", "--json")
    assert code == 0
    (explained,) = json.loads(out)
    assert explained["failure"]["failure_kind"] == "agent_run_error"
    assert explained["reported_failure"] == {
        "failure_kind": "model_server_error",
        "failure_reason": "upstream 503",
        "event_id": "ev1-abc",
        "boundary": "agent",
        "truncated": False,
    }
    code, out, _ = run_cli("explain", run, "--rollout", "1:0")
    assert "the reply's body names: model_server_error" in out
    assert "event id=ev1-abc" in out


def test_explain_says_a_rollout_the_inventory_owes_left_no_row(tmp_path: Path) -> None:
    """Rollout 4:0 is in the materialized inputs and left no row (as `gate` counts it): `explain`
    says so, in one line, and exits 1 as for any rollout it finds no row of; a rollout the inventory
    does not owe is in none of the files."""
    run = _run(tmp_path, tasks=5)
    inputs = run / "rollouts_materialized_inputs.jsonl"
    for json_output in ([], ["--json"]):
        code, out, err = run_cli("explain", run, "--rollout", "4:0", *json_output)
        assert code == 1
        assert err.splitlines() == [
            f"gym-failures explain: rollout '4:0' is owed by the materialized inputs ({inputs}) and left "
            "no row at all (killed or drained): a resume dispatches it"
        ]
        assert out == ("[]\n" if json_output else "")
    code, _, err = run_cli("explain", run, "--rollout", "5:0")
    assert code == 1
    assert err.startswith("gym-failures explain: no row of rollout '5:0' in ")
    inputs.unlink()
    code, _, err = run_cli("explain", run, "--rollout", "4:0")
    assert code == 1
    assert err.startswith("gym-failures explain: no row of rollout '4:0' in "), "no inventory: no debt"


def test_explain_names_a_killed_rollout_of_a_run_nemo_gym_made() -> None:
    """The shipped run NeMo Gym 0.7.0 made: rollout 7:0 was killed, so it left no row."""
    run = Path(__file__).resolve().parents[1] / "examples" / "nemo_gym_runs" / "mixed"
    code, _, err = run_cli("explain", run, "--rollout", "7:0")
    assert code == 1
    assert "rollout '7:0' is owed by the materialized inputs" in err
    assert "left no row at all" in err


def test_the_html_report_shows_the_kept_bodys_failure_and_the_missing(tmp_path: Path) -> None:
    run = _body_run(tmp_path)
    (run / "rollouts_materialized_inputs.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in _inputs(3))
    )
    report = tmp_path / "report.html"
    code, _, _ = run_cli("summarize", run, "--html", report)
    assert code == 0
    page = report.read_text()
    assert "model_server_error" in page
    assert "Missing rollouts: 1:0, 2:0" in page, "1:0 failed once and may be retried; 2:0 left no row"
    assert "of which degraded" in page


def test_gate_text_and_json_show_masked_degraded_and_missing(tmp_path: Path) -> None:
    run = _run(tmp_path, tasks=5)
    code, out, _ = run_cli("gate", run)
    assert code == 1
    for text in ("of which degraded", "masked", "of which left no row", "missing rollouts: 4:0"):
        assert text in out
    code, out, _ = run_cli("gate", run, "--json")
    coverage = json.loads(out)["coverage"]
    assert (coverage["degraded"], coverage["masked"], coverage["missing_rollouts"]) == (1, 1, ["4:0"])
    assert coverage["expected_source"] == "materialized_inputs"


def test_summarize_text_shows_masked_degraded_and_missing(tmp_path: Path) -> None:
    code, out, err = run_cli("summarize", _run(tmp_path, tasks=5))
    assert code == 0
    assert "1 masked, 1 degraded" in out
    assert "5 rollouts in the materialized inputs" in out
    assert "1 left no row at all" in out
    assert "not rollout rows" not in err, "the verdicts and inputs are not read as other rows"
