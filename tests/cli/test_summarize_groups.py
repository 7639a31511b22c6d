"""`summarize --html FILE --min-valid-per-group K`: the report's verdict counts the prompt groups, as
`gate --min-valid-per-group K` does, so a run's groups reach the HTML report of any run, not only
the demo's; the option alone (no report to count them in) is a usage error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cli.invoke import run_cli


def _row(task: int, rollout: int, reward: float | None) -> dict[str, Any]:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": reward, "response": {}}


def _run(tmp_path: Path) -> Path:
    """Two tasks of three repeats: task 0 whole, task 1 with one member failed (final)."""
    tmp_path.mkdir(exist_ok=True)
    rows = [_row(0, r, 1.0) for r in range(3)] + [_row(1, r, 0.0) for r in range(2)]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    failure = {"_ng_task_index": 1, "_ng_rollout_index": 2, "_ng_failure_class": "agent_run_error"}
    failure["_ng_failure_terminal"] = True
    (tmp_path / "rollouts_failures.jsonl").write_text(json.dumps(failure) + "\n")
    inputs = [{"_ng_task_index": t, "_ng_rollout_index": r} for t in (0, 1) for r in range(3)]
    lines = "".join(json.dumps(item) + "\n" for item in inputs)
    (tmp_path / "rollouts_materialized_inputs.jsonl").write_text(lines)
    return tmp_path


def test_the_html_report_counts_the_groups_when_asked(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    report = tmp_path / "report.html"
    code, _, stderr = run_cli("summarize", run, "--html", report, "--min-valid-per-group", "3")
    assert code == 0, stderr
    page = report.read_text()
    assert "<h3>Groups</h3>" in page
    assert "Short groups (tasks): 1" in page
    assert "FAILED" in page  # one short group, and the default allows none, as `gate` reads it
    code, _, stderr = run_cli("summarize", run, "--html", report)
    assert code == 0, stderr
    assert "<h3>Groups</h3>" not in report.read_text()


def test_the_group_minimum_without_a_report_is_a_usage_error(tmp_path: Path) -> None:
    code, stdout, stderr = run_cli("summarize", _run(tmp_path), "--min-valid-per-group", "2")
    assert code == 2
    assert stdout == ""
    assert stderr == (
        "gym-failures summarize: error: --min-valid-per-group counts the groups of the HTML report: "
        "give --html FILE\n"
    )
    assert run_cli("summarize", tmp_path, "--html", tmp_path / "r.html", "--min-valid-per-group", "0")[0] == 2
