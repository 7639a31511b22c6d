"""Each run counted by its own evidence: its materialized inputs if it has them, else its manifest,
else the rollouts it shows, added up (a run with materialized inputs beside one with only a
manifest); and a run counted against its materialized inputs read whole, whichever of its row files
was named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gym_failures.gate import read_coverage
from gym_failures.reporting.summary import summarize
from gym_failures.rows import row_files, run_expectations
from tests.cli.invoke import run_cli


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _success(task: int) -> dict[str, Any]:
    return {"_ng_task_index": task, "_ng_rollout_index": 0, "reward": 1.0, "response": {}}


def _failure(task: int) -> dict[str, Any]:
    failure = {"_ng_task_index": task, "_ng_rollout_index": 0, "_ng_failure_class": "skipped"}
    return {**failure, "_ng_failure_terminal": True}


def _run(directory: Path, *, tasks: int, inventory: bool) -> Path:
    """A run of `tasks` rollouts, every one with an outcome (the last a final failure): with NeMo
    Gym's materialized inputs, or only a gym-failures manifest."""
    directory.mkdir()
    _write(directory / "rollouts.jsonl", [_success(task) for task in range(tasks - 1)])
    _write(directory / "rollouts_failures.jsonl", [_failure(tasks - 1)])
    if inventory:
        inputs = [{"_ng_task_index": task, "_ng_rollout_index": 0} for task in range(tasks)]
        _write(directory / "rollouts_materialized_inputs.jsonl", inputs)
    else:
        manifest = {"version": 2, "input_sha256": "0" * 64, "num_repeats": 1, "expected_rollouts": tasks}
        (directory / "rollouts.manifest.json").write_text(json.dumps(manifest))
    return directory


def test_a_run_with_materialized_inputs_and_one_with_a_manifest_add_up(tmp_path: Path) -> None:
    new = _run(tmp_path / "new", tasks=4, inventory=True)
    old = _run(tmp_path / "old", tasks=3, inventory=False)
    coverage = read_coverage([*row_files(new), *row_files(old)])
    assert (coverage.expected, coverage.seen, coverage.unexpected, coverage.missing) == (7, 7, 0, 0)
    assert coverage.expected_source == "manifest", "a count: only one run names its rollouts"
    assert coverage.manifests == [
        str(new / "rollouts_materialized_inputs.jsonl"),
        str(old / "rollouts.manifest.json"),
    ]
    assert coverage.failed == {"model": 0, "evaluation": 2, "unknown": 0}
    assert coverage.scored == 5
    summary = summarize([new, old])
    assert (summary.expected_rollouts, summary.missing_rollouts) == (7, 0)
    assert summary.manifests == [str(old / "rollouts.manifest.json")]


def test_the_runs_missing_rollouts_are_counted_each_against_its_own(tmp_path: Path) -> None:
    new = _run(tmp_path / "new", tasks=4, inventory=True)
    old = _run(tmp_path / "old", tasks=3, inventory=False)
    _write(new / "rollouts.jsonl", [_success(0)])  # 1:0 and 2:0 left no row
    _write(old / "rollouts.jsonl", [])  # 0:0 and 1:0 are missing, by count
    coverage = read_coverage([*row_files(old), *row_files(new)])
    assert (coverage.expected, coverage.missing, coverage.left_no_row) == (7, 4, 2)
    assert coverage.missing_rollouts == ["1:0", "2:0"], "named only where the materialized inputs name them"
    assert summarize([new, old]).missing_rollouts == 2, "the manifest run's rows never fill the other's"


def test_runs_of_one_kind_keep_their_source(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", tasks=2, inventory=False)
    b = _run(tmp_path / "b", tasks=3, inventory=False)
    coverage = read_coverage([*row_files(a), *row_files(b)])
    assert (coverage.expected, coverage.expected_source) == (5, "manifest")
    coverage = read_coverage(row_files(_run(tmp_path / "c", tasks=2, inventory=True)))
    assert (coverage.expected, coverage.expected_source) == (2, "materialized_inputs")


def test_a_runs_failures_named_alone_are_read_with_its_successes(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", tasks=4, inventory=True)
    failures = run / "rollouts_failures.jsonl"
    assert run_expectations([failures]).inventoried == [failures, run / "rollouts.jsonl"]
    coverage = read_coverage([failures])
    assert (coverage.expected, coverage.scored, coverage.missing, coverage.left_no_row) == (4, 3, 0, 0)
    assert summarize([failures]).missing_rollouts == 0
    code, _, stderr = run_cli("gate", failures, "--min-scored-share", "0", "--max-evaluation-share", "1")
    assert code == 0, stderr
    assert f"reading {run / 'rollouts.jsonl'} too: the successes of {failures}'s run" in stderr


def test_a_file_of_no_run_is_a_run_of_its_own(tmp_path: Path) -> None:
    """Its rollout ids are its own: counted by the rollouts it shows (the sum then cannot count a
    rollout that left no row: `rows_seen`), never settling the run's."""
    run = _run(tmp_path / "run", tasks=2, inventory=True)
    stray = _write(tmp_path / "stray.jsonl", [_success(7), _success(1)])
    coverage = read_coverage([*row_files(run), stray])
    assert (coverage.expected, coverage.unexpected, coverage.expected_source) == (4, 0, "rows_seen")
    assert (coverage.scored, coverage.failed["evaluation"]) == (3, 1), "the run's failure of 1:0 stays"
