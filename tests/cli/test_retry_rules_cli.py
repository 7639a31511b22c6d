"""`gym-failures collect --retry-rule RULE --retry-rules FILE` (issue 30), against the real test agent:
the flags' rules come before the file's, the rows say which rule decided, `gate` and `summarize` read
those rows as any, and every bad rule, file or combination is one line and exit status 2, with
nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gym_failures.rows import read_rows
from tests.cli.invoke import run_cli
from tests.saved_rows import write_jsonl

RULES_TOML = """
[[rules]]
name = "tool_runs"
message = "^tool run"
max_attempts = 4

[[rules]]
name = "never_model"
kind = "model_server_error"
max_attempts = 1
"""


def _tasks(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "tasks.jsonl",
        [
            {"mode": "ok"},
            {"mode": "always_fail"},
            {"mode": "fail_as", "kind": "model_server_error"},
            {"mode": "fail_as", "kind": "agent_timeout"},
        ],
    )


def _last_rows(output: Path) -> dict[str, dict[str, object]]:
    """Each rollout's last failure row, read back (`final_reason`), its `_gf_retry_rule` as saved."""
    rows: dict[str, dict[str, object]] = {}
    for row in read_rows(output.with_name(f"{output.stem}_failures.jsonl")):
        rows[str(row["rollout_id"])] = row
    return rows


def test_flags_come_before_the_files_rules_and_the_rows_say_which_decided(
    tmp_path: Path, agent_url: str
) -> None:
    (tmp_path / "rules.toml").write_text(RULES_TOML)
    output = tmp_path / "run" / "rollouts.jsonl"
    code, stdout, stderr = run_cli(
        "collect",
        _tasks(tmp_path),
        "--agent-url",
        agent_url,
        "--output",
        output,
        "--breaker",
        "0",
        "--retry-rule",
        "name=tool_runs_2,max_attempts=2,message=tool run",
        "--retry-rules",
        tmp_path / "rules.toml",
        "--json",
    )
    assert code == 0, stderr
    figures = json.loads(stdout)
    # 1 success; the flag's rule (2 attempts), then the file's (1 attempt), no rule (3 attempts).
    assert (figures["succeeded"], figures["failed_final"], figures["attempts"]) == (1, 3, 1 + 2 + 1 + 3)
    last = _last_rows(output)
    assert {
        key: (row["attempt"], row["final_reason"], row["_gf_retry_rule"]) for key, row in last.items()
    } == {
        "1:0": (2, "retry_rule_budget_exhausted", {"rule": "tool_runs_2", "max_attempts": 2, "retry": False}),
        "2:0": (1, "retry_rule_budget_exhausted", {"rule": "never_model", "max_attempts": 1, "retry": False}),
        "3:0": (3, "attempt_budget_exhausted", {"rule": None, "max_attempts": 3, "retry": False}),
    }
    # The readers take rows with the key as any: one success scored, three rollouts failed, three
    # attempts retried.
    verdict = json.loads(run_cli("gate", tmp_path / "run", "--json")[1])
    assert verdict["coverage"]["scored"] == 1
    assert sum(verdict["coverage"]["failed"].values()) == 3
    assert verdict["coverage"]["retried_attempts"] == 3
    summary = json.loads(run_cli("summarize", tmp_path / "run", "--json")[1])
    assert (summary["failure_rows"], summary["final_failure_rows"]) == (6, 3)
    assert (summary["success_rows"], summary["other_rows"], summary["torn_tails"]) == (1, 0, [])


def test_the_console_script_takes_retry_rules(tmp_path: Path, agent_url: str) -> None:
    output = tmp_path / "run" / "rollouts.jsonl"
    completed = subprocess.run(
        [
            str(Path(sys.executable).parent / "gym-failures"),
            "collect",
            str(write_jsonl(tmp_path / "tasks.jsonl", [{"mode": "always_fail"}])),
            "--agent-url",
            agent_url,
            "--output",
            str(output),
            "--retry-rule",
            "kind=agent_run_error,max_attempts=1",
            "--json",
        ],
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert completed.returncode == 1, "nothing succeeded"
    (row,) = read_rows(output.with_name("rollouts_failures.jsonl"))
    assert (row["attempt"], row["final_reason"]) == (1, "retry_rule_budget_exhausted")


@pytest.mark.parametrize(
    ("arguments", "files", "message"),
    [
        (
            ["--retry-rule", "kind=nope,max_attempts=1"],
            {},
            "gym-failures collect: error: argument --retry-rule: kind: 'nope' is no failure kind",
        ),
        (
            ["--retry-rule", "max_attempts=0"],
            {},
            "argument --retry-rule: max_attempts: Input should be greater than or equal to 1",
        ),
        (["--retry-rule", "kind=agent_timeout"], {}, "a rule needs max_attempts or max_retries_per_run"),
        (["--retry-rule", "message=(,max_attempts=1"], {}, "message: no valid regular expression"),
        (
            ["--retry-rule", "name=a,max_attempts=1", "--retry-rule", "name=a,max_attempts=2"],
            {},
            "gym-failures collect: error: --retry-rule: two rules are named 'a'",
        ),
        (["--retry-rules", "missing.toml"], {}, "missing.toml: cannot be read (No such file or directory)"),
        (["--retry-rules", "rules.toml"], {"rules.toml": "[[rules]\n"}, "rules.toml: is no valid TOML"),
        (
            ["--retry-rules", "rules.json"],
            {"rules.json": '{"rules": [{"max_attempts": -1}]}'},
            "rule 1, max_attempts",
        ),
        (["--retry-rules", "rules.yaml"], {"rules.yaml": "rules: []"}, "name a .json or .toml file"),
        (
            ["--retry-rule", "name=a,max_attempts=1", "--retry-rules", "rules.json"],
            {"rules.json": '{"rules": [{"name": "a", "max_attempts": 2}]}'},
            "--retry-rule with --retry-rules",
        ),
    ],
)
def test_a_bad_rule_or_file_is_one_line_and_exit_2_with_nothing_written(
    tmp_path: Path, agent_url: str, arguments: list[str], files: dict[str, str], message: str
) -> None:
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    (tmp_path / "input").mkdir()
    tasks = write_jsonl(tmp_path / "input" / "tasks.jsonl", [{"mode": "ok"}])
    paths = [
        str(tmp_path / argument) if argument.startswith(("missing", "rules")) else argument
        for argument in arguments
    ]
    code, stdout, stderr = run_cli(
        "collect", tasks, "--agent-url", agent_url, "--output", tmp_path / "run" / "rollouts.jsonl", *paths
    )
    assert code == 2
    assert message in stderr
    assert len(stderr.splitlines()) == 1, stderr
    assert "Traceback" not in stderr
    assert stdout == ""
    assert not (tmp_path / "run").exists()
