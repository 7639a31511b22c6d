"""The `gym-failures` command line, in process (`main(argv)` with stdout and stderr captured) and as a real
console script."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import AgentFailure, ModelFailure
from gym_failures.rows import read_rows
from tests.cli.invoke import run_cli
from tests.saved_rows import (
    context_limit,
    failure_row,
    legacy_failure_row,
    model_503_chain,
    oom_chain,
    quota_chain,
    responses_object,
    success_row,
    write_jsonl,
)

ROOT = Path(__file__).resolve().parents[2]
TORN = b'{"rollout_id": "9:0", "attem'


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _invoke(*args: str | Path) -> Result:
    return Result(*run_cli(*args))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A small run: 3 scored, 1 truncated, a 503 chain retried then final, an OOM, a context limit,
    a quota failure and a legacy judge failure; an invalid line and a torn last line."""
    successes = [success_row(f"{index}:0") for index in range(3)]
    successes.append(
        success_row(
            "3:0", response=responses_object(status="incomplete", incomplete_reason="max_output_tokens")
        )
    )
    failures = [
        failure_row(model_503_chain(), "4:0", attempt=1, final=False),
        failure_row(model_503_chain(), "4:0", attempt=2, final=True),
        failure_row(oom_chain(), "5:0"),
        failure_row(context_limit(), "6:0"),
        failure_row(quota_chain(), "7:0"),
        legacy_failure_row("judge_failed", terminal=True, task=8),
    ]
    write_jsonl(tmp_path / "out.jsonl", successes, tail=b"not json\n")
    write_jsonl(tmp_path / "out_failures.jsonl", failures, tail=TORN)
    return tmp_path


# --- summarize ---------------------------------------------------------------------------------


def test_summarize_json_counts_failures_by_class_and_kind(run_dir: Path) -> None:
    result = _invoke("summarize", run_dir, "--json")
    summary = json.loads(result.stdout)
    assert (summary["success_rows"], summary["failure_rows"], summary["final_failure_rows"]) == (4, 6, 5)
    assert {group["value"]: group["count"] for group in summary["by_class"]} == {"evaluation": 5, "model": 1}
    assert {kind["value"]: (kind["failure_class"], kind["count"]) for kind in summary["by_kind"]} == {
        "agent_request_failed": ("evaluation", 2),
        "judge_failed": ("evaluation", 2),
        "environment_episode_failed": ("evaluation", 1),
        "model_context_limit": ("model", 1),
    }


def test_summarize_json_gives_shares_of_failure_rows(run_dir: Path) -> None:
    summary = json.loads(_invoke("summarize", run_dir, "--json").stdout)
    shares = {group["value"]: group["share"] for group in summary["by_class"]}
    assert shares == {"evaluation": pytest.approx(5 / 6, abs=1e-6), "model": pytest.approx(1 / 6, abs=1e-6)}


def test_summarize_json_lists_quota_reset_times(run_dir: Path) -> None:
    summary = json.loads(_invoke("summarize", run_dir, "--json").stdout)
    assert summary["quota_resets"] == [{"resets_at": "2026-07-01 00:00 UTC", "events": 1}]


def test_summarize_prints_tables_with_kinds_classes_counts_and_shares(run_dir: Path) -> None:
    result = _invoke("summarize", run_dir)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    kind_line = next(line for line in lines if "model_context_limit" in line)
    assert [cell.strip() for cell in kind_line.split("│")[1:6]] == [
        "model_context_limit",
        "model",
        "1",
        "1",
        "16.7%",
    ]
    assert "Failures by boundary" in result.stdout
    assert "Most common reasons" in result.stdout
    assert "2026-07-01 00:00 UTC" in result.stdout


def test_summarize_reports_the_torn_last_line_and_counts_the_invalid_one(run_dir: Path) -> None:
    result = _invoke("summarize", run_dir)
    assert f"out_failures.jsonl: torn last line ({len(TORN)} bytes) skipped" in result.stdout
    assert "1 other line\n" in result.stdout


def test_summarize_writes_a_self_contained_html_report(run_dir: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    _invoke("summarize", run_dir / "out.jsonl", run_dir / "out_failures.jsonl", "--html", report)
    page = report.read_text()
    assert page.count("<svg") == 4  # by class, kind and root cause, and over attempts
    assert "judge_failed" in page


def test_summarize_refuses_a_path_that_does_not_exist(tmp_path: Path) -> None:
    result = _invoke("summarize", tmp_path / "absent.jsonl")
    assert result.exit_code == 2
    assert (
        result.stderr
        == f"gym-failures summarize: error: {tmp_path / 'absent.jsonl'}: no such file or directory\n"
    )


def test_summarize_on_a_file_of_nothing_but_bad_lines_says_so_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'\x00\xff garbage\n{"failure": [1, \n]]]\n' + TORN)
    result = _invoke("summarize", path, "--json")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"gym-failures summarize: error: no rollout rows in {path} (3 other lines)\n"


def test_the_console_script_prints_the_summary_as_json(run_dir: Path) -> None:
    completed = subprocess.run(
        [str(Path(sys.executable).parent / "gym-failures"), "summarize", str(run_dir), "--json"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    summary = json.loads(completed.stdout)
    assert summary["failure_rows"] == 6
    assert summary["torn_tails"][0]["bytes"] == len(TORN)


# --- explain -----------------------------------------------------------------------------------


def test_explain_shows_the_cause_tree_with_ids_and_boundaries(tmp_path: Path) -> None:
    failure = model_503_chain()
    path = write_jsonl(tmp_path / "f.jsonl", [failure_row(failure, "4:0", attempt=2)])
    events = failure.failure_report().events
    output = _invoke("explain", path, "--line", "1").stdout
    lines = output.splitlines()
    assert "rollout 4:0 · attempt 2 · failure · final (attempt_budget_exhausted)" in lines[0]
    root = next(index for index, line in enumerate(lines) if "✖ [agent] agent_request_failed" in line)
    cause = next(index for index, line in enumerate(lines) if "caused by [model] model_server_error" in line)
    deepest = next(index for index, line in enumerate(lines) if "caused by [model] transport_timeout" in line)
    assert root < cause < deepest
    assert "http=503" in lines[cause]
    for event_id in events:
        assert f"id={event_id}" in output


def test_explain_takes_a_rows_label_as_printed(run_dir: Path) -> None:
    label = next(
        line.split()[0]
        for line in _invoke("explain", run_dir, "--rollout", "4:0").stdout.splitlines()
        if ":" in line
    )
    assert label.endswith("out_failures.jsonl:1")
    by_label = _invoke("explain", label)
    assert by_label.exit_code == 0
    assert by_label.stdout == _invoke("explain", label.rpartition(":")[0], "--line", "1").stdout
    assert "rollout 4:0 · attempt 1" in by_label.stdout


def test_explain_line_of_a_directory_names_the_files_to_ask(run_dir: Path) -> None:
    result = _invoke("explain", run_dir, "--line", "3")
    assert result.exit_code == 2
    assert "--line numbers the lines of one file, not of a directory: try " in result.stderr
    assert f"{run_dir / 'out_failures.jsonl'}:3" in result.stderr


def test_explain_without_a_row_says_how_to_name_one(run_dir: Path) -> None:
    result = _invoke("explain", run_dir)
    assert result.exit_code == 2
    assert "name a row: --line N (or FILE:N, as the labels print it) or --rollout ID" in result.stderr


def test_explain_lists_events_outside_the_failure_chain_as_observations(tmp_path: Path) -> None:
    row = failure_row(context_limit(), "0:0")
    row = FailureReportRow.merged_into(row, oom_chain().failure_report())
    output = _invoke("explain", write_jsonl(tmp_path / "f.jsonl", [row]), "--line", "1").stdout
    observations = output.index("other observations")
    assert output.index("✖ [agent] model_context_limit") < observations
    assert output.index("[environment] environment_episode_failed") > observations


def test_explain_marks_an_omitted_report(tmp_path: Path) -> None:
    failure = model_503_chain()
    report = failure.failure_report().model_copy(update={"omitted": True})
    row = {**failure_row(failure), **FailureReportRow.fields(report)}
    output = _invoke("explain", write_jsonl(tmp_path / "f.jsonl", [row]), "--line", "1").stdout
    assert "[omitted] this report lost events on the way" in output
    assert "[omitted] causes may have been lost on the way" in output


def test_explain_marks_an_invalid_saved_report_as_omitted(tmp_path: Path) -> None:
    row = {**failure_row(oom_chain()), FailureReportRow.EVENTS: "garbage"}
    result = _invoke("explain", write_jsonl(tmp_path / "f.jsonl", [row]), "--line", "1", "--json")
    (explanation,) = json.loads(result.stdout)
    assert (explanation["omitted"], explanation["tree"]) == (True, None)


def test_explain_shows_an_unregistered_kind_as_saved(tmp_path: Path) -> None:
    row = failure_row(AgentFailure(failure_kind="agent_run_error"))
    event = row[FailureReportRow.EVENTS][row[FailureReportRow.FAILURE_ID]]
    event["failure_kind"] = "kind_from_a_newer_peer"
    output = _invoke("explain", write_jsonl(tmp_path / "f.jsonl", [row]), "--line", "1").stdout
    assert "✖ [agent] unregistered:kind_from_a_newer_peer" in output


def test_explain_json_nests_each_cause_under_its_effect(tmp_path: Path) -> None:
    failure = model_503_chain()
    path = write_jsonl(tmp_path / "f.jsonl", [failure_row(failure)])
    (explanation,) = json.loads(_invoke("explain", path, "--line", "1", "--json").stdout)
    tree = explanation["tree"]
    chain = []
    while tree is not None:
        chain.append((tree["event"]["boundary"], tree["event"]["failure_kind"]))
        tree = tree["cause"]
    assert chain == [
        ("agent", "agent_request_failed"),
        ("model", "model_server_error"),
        ("model", "transport_timeout"),
    ]
    assert explanation["failure_id"] == failure.event_id


def test_explain_by_rollout_shows_every_attempt_in_order(run_dir: Path) -> None:
    explanations = json.loads(_invoke("explain", run_dir, "--rollout", "4:0", "--json").stdout)
    assert [(item["attempt"], item["final"]) for item in explanations] == [(1, False), (2, True)]


def test_explain_by_rollout_finds_a_legacy_row(run_dir: Path) -> None:
    output = _invoke("explain", run_dir, "--rollout", "8:0").stdout
    assert "episode failure: judge_failed" in output
    assert "no failure event saved for this row" in output


def test_explain_row_numbers_count_invalid_lines(run_dir: Path) -> None:
    output = _invoke("explain", run_dir / "out.jsonl", "--line", "5").stdout
    assert "out.jsonl:5" in output
    assert "invalid line: not JSON" in output


def test_explain_says_a_torn_last_line_is_no_row(run_dir: Path) -> None:
    result = _invoke("explain", run_dir / "out_failures.jsonl", "--line", "7")
    assert result.exit_code == 0
    assert "torn line: the last line is unterminated" in result.stdout


def test_explain_past_the_last_line_exits_1(run_dir: Path) -> None:
    result = _invoke("explain", run_dir / "out.jsonl", "--line", "51")
    assert result.exit_code == 1
    assert "has no line 51" in result.stderr


def test_explain_an_unknown_rollout_exits_1(run_dir: Path) -> None:
    assert _invoke("explain", run_dir, "--rollout", "99:0").exit_code == 1


@pytest.mark.parametrize("options", [[], ["--line", "1", "--rollout", "0:0"]], ids=["neither", "both"])
def test_explain_needs_exactly_one_of_line_or_rollout(run_dir: Path, options: list[str]) -> None:
    result = _invoke("explain", run_dir / "out.jsonl", *options)
    assert result.exit_code == 2
    assert "--line" in result.stderr
    assert "--rollout" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_explain_by_row_needs_one_file(run_dir: Path) -> None:
    assert _invoke("explain", run_dir, "--line", "1").exit_code == 2


# --- gate --------------------------------------------------------------------------------------


def test_gate_prints_coverage_and_the_scored_line_and_fails_a_dirty_run(run_dir: Path) -> None:
    result = _invoke("gate", run_dir)
    assert result.exit_code == 1
    assert "3 of 9 scored" in result.stdout
    assert "FAILED" in result.stdout
    assert "evaluation-side share 44.44% is above the maximum 2.00%" in result.stdout


def test_gate_json_gives_the_coverage_by_class(run_dir: Path) -> None:
    verdict = json.loads(_invoke("gate", run_dir, "--json").stdout)
    coverage = verdict["coverage"]
    assert verdict["passed"] is False
    assert coverage["failed"] == {"model": 1, "evaluation": 4, "unknown": 0}
    assert coverage["gate_derived"] == {"model": 1, "evaluation": 0, "unknown": 0}
    assert (coverage["scored"], coverage["expected"], coverage["missing"]) == (3, 9, 0)
    assert (coverage["retried_attempts"], coverage["invalid_lines"], coverage["torn_tails"]) == (1, 1, 1)
    assert coverage["line"] == "3 of 9 scored"


def test_gate_passes_a_clean_run_with_exit_0(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "out.jsonl", [success_row(f"{index}:0") for index in range(20)])
    result = _invoke("gate", tmp_path)
    assert result.exit_code == 0
    assert "20 of 20 scored" in result.stdout
    assert "PASSED" in result.stdout


def test_gate_counts_expected_rollouts_without_rows_as_missing(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "out.jsonl", [success_row(f"{index}:0") for index in range(20)])
    result = _invoke("gate", tmp_path, "--expected", "22", "--min-scored-share", "0.9")
    assert result.exit_code == 1
    assert "2 rollouts missing (maximum 0)" in result.stdout


def test_gate_thresholds_from_options_decide_the_verdict(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [success_row(f"{index}:0") for index in range(9)]
    rows.append(failure_row(oom_chain(), "9:0"))
    write_jsonl(tmp_path / "out.jsonl", rows)
    assert _invoke("gate", tmp_path).exit_code == 1
    loose = ["--min-scored-share", "0.9", "--max-evaluation-share", "0.1"]
    assert _invoke("gate", tmp_path, *loose).exit_code == 0


def test_gate_refuses_a_share_above_one_with_exit_2(run_dir: Path) -> None:
    result = _invoke("gate", run_dir, "--max-evaluation-share", "1.5")
    assert result.exit_code == 2


def test_gate_on_a_file_of_bad_lines_says_nothing_was_read_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"garbage\n[]\n" + TORN)
    result = _invoke("gate", path, "--json")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "no rollout rows in" in result.stderr
    assert "no manifest says how many were expected" in result.stderr


# --- collect -----------------------------------------------------------------------------------


def test_collect_saves_rows_and_prints_the_summary(tmp_path: Path, agent_url: str) -> None:
    tasks = write_jsonl(
        tmp_path / "tasks.jsonl", [{"id": "a", "mode": "ok"}, {"id": "b", "mode": "terminal"}]
    )
    output = tmp_path / "run" / "rollouts.jsonl"
    result = _invoke(
        "collect", tasks, "--agent-url", agent_url, "--output", output, "--num-repeats", "2", "--json"
    )
    figures = json.loads(result.stdout)
    assert (figures["expected"], figures["succeeded"], figures["failed_final"]) == (4, 2, 2)
    assert len(output.read_text().splitlines()) == 2
    assert len((tmp_path / "run" / "rollouts_failures.jsonl").read_text().splitlines()) == 2


def test_collect_exits_2_with_the_reason_when_a_resume_is_refused(tmp_path: Path, agent_url: str) -> None:
    output = tmp_path / "run" / "rollouts.jsonl"
    first = write_jsonl(tmp_path / "first.jsonl", [{"mode": "ok"}])
    _invoke("collect", first, "--agent-url", agent_url, "--output", output)
    other = write_jsonl(tmp_path / "other.jsonl", [{"mode": "terminal"}])
    result = _invoke("collect", other, "--agent-url", agent_url, "--output", output)
    assert result.exit_code == 2
    assert "collected from a different input or --num-repeats" in result.stderr


def test_collect_output_then_gate_sees_every_rollout(tmp_path: Path, agent_url: str) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"mode": "ok"}, {"mode": "always_fail"}])
    output = tmp_path / "run" / "rollouts.jsonl"
    _invoke("collect", tasks, "--agent-url", agent_url, "--output", output, "--max-attempts", "2")
    verdict = json.loads(_invoke("gate", tmp_path / "run", "--json").stdout)
    # The agent's results carry a finite reward and no verification: the reward is the measurement.
    assert (verdict["coverage"]["scored"], verdict["coverage"]["gate_derived_by_kind"]) == (1, {})
    assert (verdict["coverage"]["failed"]["evaluation"], verdict["coverage"]["retried_attempts"]) == (1, 1)


def test_a_429_failure_event_is_evaluation_side_in_summarize_and_gate(tmp_path: Path) -> None:
    failure = ModelFailure(failure_kind="model_request_error", stage="agent", http_status=429)
    path = write_jsonl(tmp_path / "f.jsonl", [failure_row(failure)])
    summary = json.loads(_invoke("summarize", path, "--json").stdout)
    verdict = json.loads(_invoke("gate", path, "--json").stdout)
    assert summary["by_class"][0]["value"] == "evaluation"
    assert verdict["coverage"]["failed"]["evaluation"] == 1


# --- Text from the rows is data ------------------------------------------------------------------


MARKUP_ROWS: list[dict[str, Any]] = [
    {
        "rollout_id": "0:0",
        "attempt": 1,
        "failure": {
            "failure_kind": "judge_failed",
            "failure_reason": "judge said [/bold] oops",
            "stage": "verification",
            "terminal": False,
        },
        "final": True,
        "final_reason": "attempt_budget_exhausted",
    },
    {
        "rollout_id": "1:0",
        "attempt": 1,
        "failure": {
            "failure_kind": "verifier_error",
            "failure_reason": "[link=https://evil.example]click[/link] [red]FAKE PASSED",
            "stage": "verification",
            "terminal": True,
        },
        "final": True,
        "final_reason": "terminal",
    },
    {
        "rollout_id": "2:0",
        "attempt": 1,
        "failure": {"failure_kind": "x:[/k]", "terminal": True},
        "final": True,
    },
]


def test_summarize_prints_markup_in_a_reason_as_text(tmp_path: Path) -> None:
    result = _invoke("summarize", write_jsonl(tmp_path / "f.jsonl", MARKUP_ROWS))
    assert result.exit_code == 0
    assert "judge said [/bold] oops" in result.stdout
    assert "[link=https://evil.example]click[/link] [red]FAKE PASSED" in result.stdout
    assert "x:[/k]" in result.stdout


def test_gate_prints_markup_in_a_kind_as_text(tmp_path: Path) -> None:
    result = _invoke("gate", write_jsonl(tmp_path / "f.jsonl", MARKUP_ROWS))
    assert result.exit_code == 1
    assert "x:[/k]" in result.stdout


def test_explain_prints_markup_in_a_reason_as_text(tmp_path: Path) -> None:
    output = _invoke("explain", write_jsonl(tmp_path / "f.jsonl", MARKUP_ROWS), "--line", "2").stdout
    assert "[link=https://evil.example]click[/link] [red]FAKE PASSED" in output


def _escape_row() -> dict[str, Any]:
    failure = ModelFailure(failure_kind="model_server_error", stage="agent", http_status=503)
    row = failure_row(failure, "0:0")
    reason = "ok\x1b[2J\x1b]0;pwned\x07 title\x9b31m\x7f"
    row["failure"]["failure_reason"] = reason
    row["failure"]["failure_kind"] = "model_\x1b[8mserver_error"
    row[FailureReportRow.EVENTS][failure.event_id]["failure_reason"] = reason
    row[FailureReportRow.EVENTS][failure.event_id]["boundary"] = "model"
    row["final_reason"] = "\x1b[31mterminal"
    return row


@pytest.mark.parametrize(
    "command",
    [["summarize"], ["gate"], ["explain", "--line", "1"], ["explain", "--rollout", "0:0"]],
    ids=lambda command: " ".join(command),
)
def test_terminal_control_characters_from_a_row_never_reach_the_terminal(
    tmp_path: Path, command: list[str]
) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", [_escape_row()])
    result = _invoke(command[0], path, *command[1:])
    assert result.exit_code in (0, 1)
    for control in ("\x1b", "\x07", "\x9b", "\x7f"):
        assert control not in result.stdout
    assert "model_[8mserver_error" in result.stdout
    if command[0] != "gate":
        assert "ok[2J]0;pwned title31m" in result.stdout


def test_json_output_escapes_c1_characters_and_keeps_the_value(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", [_escape_row()])
    result = _invoke("explain", path, "--line", "1", "--json")
    assert "\x9b" not in result.stdout
    assert "\\u009b" in result.stdout
    (explanation,) = json.loads(result.stdout)
    assert explanation["failure"]["failure_reason"] == "ok\x1b[2J\x1b]0;pwned\x07 title\x9b31m\x7f"


# --- explain skips rows that are no rollout rows -------------------------------------------------


def test_explain_by_rollout_skips_a_row_with_neither_result_nor_failure(tmp_path: Path) -> None:
    injected = {"rollout_id": "0:0", "attempt": 1, "server": "model", "fault": "server_error"}
    write_jsonl(tmp_path / "injected_faults.jsonl", [injected])
    write_jsonl(tmp_path / "out_failures.jsonl", [failure_row(oom_chain(), "0:0")])
    explanations = json.loads(_invoke("explain", tmp_path, "--rollout", "0:0", "--json").stdout)
    assert [item["outcome"] for item in explanations] == ["failure"]


def test_explain_by_row_says_a_row_with_neither_result_nor_failure_is_no_rollout_row(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", [{"rollout_id": "0:0", "fault": "server_error"}])
    result = _invoke("explain", path, "--line", "1")
    assert "other line: not a rollout row" in result.stdout
    assert "success" not in result.stdout


# --- gate: the expected count --------------------------------------------------------------------


def _two_of_three(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "run.jsonl", [success_row("0:0"), success_row("1:0")])
    manifest = {"version": 2, "input_sha256": "0" * 64, "num_repeats": 1, "expected_rollouts": 3}
    (tmp_path / "run.manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def test_gate_takes_the_expected_count_from_the_manifest_beside_the_rows(tmp_path: Path) -> None:
    result = _invoke("gate", _two_of_three(tmp_path))
    assert result.exit_code == 1
    assert "2 of 3 scored" in result.stdout
    assert "1 rollout missing (maximum 0)" in result.stdout
    assert "run.manifest.json" in result.stdout
    assert result.stderr == ""


def test_gate_expected_option_overrides_the_manifest(tmp_path: Path) -> None:
    verdict = json.loads(_invoke("gate", _two_of_three(tmp_path), "--expected", "2", "--json").stdout)
    assert verdict["passed"] is True
    assert verdict["coverage"]["expected_source"] == "given"


def test_gate_without_a_manifest_warns_that_expected_came_from_the_rows(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "out.jsonl", [success_row("0:0")])
    result = _invoke("gate", tmp_path, "--json")
    verdict = json.loads(result.stdout)
    assert verdict["coverage"]["expected_source"] == "rows_seen"
    (warning,) = verdict["warnings"]
    assert "expected was taken from the 1 distinct rollouts seen" in warning
    assert "warning: expected was taken from the 1 distinct rollouts seen" in " ".join(result.stderr.split())


def test_gate_sees_a_rollout_collect_never_saved_as_missing(tmp_path: Path, agent_url: str) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"mode": "ok"}, {"mode": "ok"}, {"mode": "ok"}])
    output = tmp_path / "run" / "rollouts.jsonl"
    _invoke("collect", tasks, "--agent-url", agent_url, "--output", output)
    lines = output.read_bytes().splitlines(keepends=True)
    output.write_bytes(b"".join(lines[:2]))  # a rollout whose row was lost
    coverage = json.loads(_invoke("gate", tmp_path / "run", "--json").stdout)["coverage"]
    # The collector's materialized inputs owe the rollouts (they win over its manifest, which agrees).
    assert (coverage["expected"], coverage["missing"], coverage["expected_source"]) == (
        3,
        1,
        "materialized_inputs",
    )


# --- demo: an external policy endpoint -----------------------------------------------------------


class _ResponsesEndpoint(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible Responses endpoint standing in for an external provider: it answers every
    request with a final message from the model the request names."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        text = "The answer is 3."
        reply = {
            "id": "resp_external",
            "object": "response",
            "model": request.get("model"),
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": "msg_external",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def external_endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ResponsesEndpoint)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_demo_sends_the_policy_to_an_external_endpoint(
    tmp_path: Path, external_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYM_DEMO_MODEL_API_KEY", "sk-demo-0123456789abcdefghij")
    monkeypatch.setenv("GYM_DEMO_MODEL_NAME", "external-model")  # the option's environment variable
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"model": {}}))
    out = tmp_path / "runs"
    result = _invoke(
        "demo",
        "--out",
        out,
        "--rollouts",
        "3",
        "--fault-plan",
        plan,
        "--model-base-url",
        external_endpoint,
        "--stream",
        "never",
        "--policy-timeout",
        "7",
    )
    assert result.exit_code == 0, result.stderr
    (run_dir,) = out.iterdir()
    demo = json.loads((run_dir / "demo.json").read_text())
    assert demo["policy"] == {"base_url": external_endpoint, "model": "external-model"}
    assert demo["fault_plan"]["limits"]["policy_timeout_s"] == 7.0
    assert json.loads((run_dir / "demo_config.json").read_text())["stream"] == "never"
    rows = list(read_rows(run_dir / "rollouts.jsonl"))
    assert {row["result"]["response"]["model"] for row in rows} == {"external-model"}


def test_demo_refuses_an_external_model_without_its_endpoint(tmp_path: Path) -> None:
    result = _invoke("demo", "--out", tmp_path, "--model-name", "external-model")
    assert result.exit_code == 2
    assert "needs both --model-base-url and --model-name" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_collect_with_a_bad_agent_url_is_a_usage_error_without_the_password(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": 1}\n')
    result = _invoke(
        "collect",
        tasks,
        "--agent-url",
        "http://user:S3cretPassw0rd@host:99999/",
        "--output",
        tmp_path / "out.jsonl",
    )
    assert result.exit_code == 2
    assert "S3cretPassw0rd" not in result.output
    assert result.stderr.startswith(
        "gym-failures collect: error: argument --agent-url: the port 99999 is out of range (0-65535)"
    )
    assert len(result.stderr.splitlines()) == 1
    assert "pydantic" not in result.stderr


def test_explain_shows_a_row_holding_a_lone_surrogate_as_an_invalid_line(tmp_path: Path) -> None:
    """JSON may escape a lone surrogate; such a line is no row (as `summarize` and `gate` read it),
    and `explain` says so in text and in JSON instead of failing to print it."""
    failures = tmp_path / "rows_failures.jsonl"
    failure = '{"failure_kind": "judge_failed", "failure_reason": "bad \\ud800 byte", "terminal": true}'
    failures.write_text('{"rollout_id": "0:0", "attempt": 1, "final": true, "failure": ' + failure + "}\n")
    text = _invoke("explain", failures, "--line", "1")
    assert text.exit_code == 0
    assert "invalid line: holds a lone surrogate escape" in text.output
    as_json = _invoke("explain", failures, "--line", "1", "--json")
    assert as_json.exit_code == 0
    assert json.loads(as_json.output)[0]["outcome"] == "invalid"


def test_summarize_leaves_out_a_grouping_whose_every_value_is_none(tmp_path: Path) -> None:
    """Failures without an HTTP status: one line says so instead of a table of "(none)"."""
    failure = AgentFailure(failure_kind="agent_limit", stage="agent")
    result = _invoke("summarize", write_jsonl(tmp_path / "f.jsonl", [failure_row(failure, "0:0")]))
    assert result.exit_code == 0
    assert "Failures by HTTP status: no failure row names its HTTP status." in result.stdout
    assert "Failures by stage" in result.stdout
    assert "No failure row gives a reason." in result.stdout
    assert "(none)" not in result.stdout


def test_summarize_with_no_failure_rows_draws_no_failure_table(tmp_path: Path) -> None:
    result = _invoke("summarize", write_jsonl(tmp_path / "f.jsonl", [success_row("0:0")]))
    assert result.exit_code == 0
    assert "No failure rows: nothing to group." in result.stdout
    assert "Failures by" not in result.stdout


def test_gate_says_what_it_skipped_its_nonzero_parts_only_and_in_agreement(tmp_path: Path) -> None:
    first = tmp_path / "a.jsonl"
    second = tmp_path / "b.jsonl"
    for path in (first, second):
        write_jsonl(path, [success_row("0:0" if path is first else "1:0")])
        with path.open("ab") as handle:
            handle.write(TORN)
    result = _invoke("gate", first, second, "--expected", "3")
    assert "warning: the torn last lines of 2 files skipped\n" in result.stderr
    assert "the torn last lines of 2 files skipped" in result.stdout
    assert "1 rollout missing (maximum 0)" in result.stdout
    alone = _invoke("gate", first, "--expected", "1")
    assert "warning: a torn last line skipped\n" in alone.stderr


def test_collect_output_with_a_trailing_slash_is_a_new_run_directory(tmp_path: Path, agent_url: str) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"mode": "ok"}])
    result = _invoke("collect", tasks, "--agent-url", agent_url, "--output", f"{tmp_path / 'newdir'}/")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "newdir" / "rollouts.jsonl").is_file()
    assert not (tmp_path / "newdir.jsonl").exists()
    assert _invoke("gate", tmp_path / "newdir").exit_code == 0


def test_an_episode_failure_in_a_200_is_no_http_status_failure(tmp_path: Path, agent_url: str) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"mode": "terminal"}, {"mode": "raise"}])
    output = tmp_path / "run" / "rollouts.jsonl"
    _invoke("collect", tasks, "--agent-url", agent_url, "--output", output, "--max-attempts", "1")
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "rollouts_failures.jsonl").read_text().splitlines()
    ]
    episode = next(row for row in rows if row["rollout_id"] == "0:0")
    raised = next(row for row in rows if row["rollout_id"] == "1:0")
    # NeMo Gym's `_ng_failure_http_status` is a failed /run reply's status: a 200 is no failed reply.
    assert "_ng_failure_http_status" not in episode
    assert raised["_ng_failure_http_status"] == 500
    summary = json.loads(_invoke("summarize", tmp_path / "run", "--json").stdout)
    statuses = {group["value"] for group in summary["by_http_status"]}
    assert 200 not in statuses
    assert None in statuses  # the episode failure names no status


def test_explain_and_the_html_read_a_plain_503s_kind_by_its_status(tmp_path: Path) -> None:
    from gym_failures.failures import AgentFailure, ModelFailure
    from tests.saved_rows import raised

    # What `raise_boundary_failure` saves for a model server's 503 without a report: the default kind.
    plain = ModelFailure(failure_kind="model_request_error", failure_reason="answered 503", http_status=503)
    failure = raised(AgentFailure(failure_kind="agent_run_error", failure_reason="no answer"), plain)
    path = write_jsonl(tmp_path / "rollouts_failures.jsonl", [failure_row(failure, "0:0")])
    shown = _invoke("explain", f"{path}:1").stdout
    (line,) = [line for line in shown.splitlines() if "model_request_error" in line]
    assert "http=503" in line
    assert "(read as model_server_error)" in line
    page = tmp_path / "report.html"
    _invoke("summarize", path, "--html", page)
    assert "(read as model_server_error)" in page.read_text()


def test_demo_collects_prompt_groups_and_the_gate_counts_them(tmp_path: Path) -> None:
    """`demo --num-repeats R`: each task R times (NeMo Gym's `num_repeats`), and the demo's gate
    counts the groups that keep at least half their members valid (docs/trainers.md)."""
    out = tmp_path / "runs"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({}))  # no fault: every member valid
    result = _invoke("demo", "--out", out, "--rollouts", "3", "--num-repeats", "4", "--fault-plan", plan)
    assert result.exit_code == 0, result.stderr
    assert "complete (at least 2 valid)" in result.stdout
    (run_dir,) = out.iterdir()
    assert json.loads((run_dir / "rollouts.manifest.json").read_text())["num_repeats"] == 4
    assert "<h3>Groups</h3>" in (run_dir / "report.html").read_text()
    gate = _invoke("gate", run_dir, "--min-valid-per-group", "4", "--json")
    groups = json.loads(gate.stdout)["coverage"]["groups"]
    assert (groups["groups"], groups["complete"], groups["sizes"]) == (3, 3, {"4": 3})


def test_a_run_of_tainted_successes_only_is_grouped_and_explained_as_tainted(tmp_path: Path) -> None:
    """A new user's run: every failure a cut stream an agent answered from, no failure row. summarize
    said "nothing to group" and explain showed each as a plain success scored 0."""
    cut = ModelFailure(failure_kind="transport_peer_drop", failure_reason="the stream ended before its end")
    rows = [
        {**success_row(f"{task}:0", verdict=False), **FailureReportRow.fields(cut.failure_report())}
        for task in range(17)
    ]
    run = tmp_path / "run"
    run.mkdir()
    write_jsonl(run / "rollouts.jsonl", rows)
    summary = _invoke("summarize", run)
    assert summary.exit_code == 0
    assert "nothing to group" not in summary.stdout
    assert "No failure rows, but 17 tainted success rows" in summary.stdout
    kinds = next(line for line in summary.stdout.splitlines() if "│ transport_peer_drop │ evaluation" in line)
    assert kinds.split("│")[-2].strip() == "17"  # the kinds table's tainted column
    page = tmp_path / "report.html"
    assert _invoke("summarize", run, "--html", page).exit_code == 0
    assert "tainted</th>" in page.read_text()
    shown = " ".join(_invoke("explain", run, "--rollout", "5:0").stdout.split())
    assert (
        "rollout 5:0 · attempt 1 · success · tainted: built on a call that ended in failure "
        "(transport_peer_drop) · reward 0" in shown
    )
    (explanation,) = json.loads(_invoke("explain", run, "--rollout", "5:0", "--json").stdout)
    assert explanation["tainted"]["failure_kind"] == "transport_peer_drop"
    assert explanation["tree"]["event"]["event_id"] == explanation["tainted"]["failure_id"]
