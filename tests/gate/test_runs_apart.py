"""Runs given together are counted apart (`gym_failures.gate._runs`): two runs of one task file share
their rollout ids, and read as one, a success in one run settled the other's failure of the same
rollout (`gate M1 M2` passed with M2's every rollout failed). And a rollout whose rows are all
attempts not yet final is a member of its group, missing, whether or not the run names its members.
Driven through the command line and `read_coverage`; a careless reading (one run) is shown failing
where it must."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gym_failures.gate import read_coverage
from gym_failures.rows import row_files
from tests.cli.invoke import run_cli


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _success(task: int, rollout: int) -> dict[str, Any]:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": 1.0, "response": {}}


def _failure(task: int, rollout: int, *, terminal: bool) -> dict[str, Any]:
    failure = {"_ng_task_index": task, "_ng_rollout_index": rollout, "_ng_failure_class": "agent_run_error"}
    return {**failure, "_ng_failure_terminal": terminal}


def _run(directory: Path, successes: list[tuple[int, int]], failures: list[tuple[int, int]]) -> Path:
    """A NeMo Gym run of task 0, two repeats, with its materialized inputs."""
    _write(directory / "rollouts.jsonl", [_success(*key) for key in successes])
    _write(directory / "rollouts_failures.jsonl", [_failure(*key, terminal=True) for key in failures])
    inputs = [{"_ng_task_index": 0, "_ng_rollout_index": rollout} for rollout in (0, 1)]
    _write(directory / "rollouts_materialized_inputs.jsonl", inputs)
    return directory


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    good = _run(tmp_path / "m1", successes=[(0, 0), (0, 1)], failures=[])
    bad = _run(tmp_path / "m2", successes=[], failures=[(0, 0), (0, 1)])
    return good, bad


def test_two_runs_of_one_task_file_are_counted_apart(two_runs: tuple[Path, Path]) -> None:
    good, bad = two_runs
    coverage = read_coverage([*row_files(good), *row_files(bad)], min_valid_per_group=1)
    assert (coverage.expected, coverage.scored, coverage.missing) == (4, 2, 0)
    assert sum(coverage.failed.values()) == 2
    assert coverage.expected_source == "materialized_inputs"
    assert coverage.groups is not None
    assert (coverage.groups.groups, coverage.groups.complete, coverage.groups.lost) == (2, 1, 1)


def test_a_good_run_beside_a_bad_one_never_passes_the_gate(two_runs: tuple[Path, Path]) -> None:
    good, bad = two_runs
    options = ("--min-valid-per-group", "1", "--max-short-groups", "0")
    assert run_cli("gate", good, *options)[0] == 0
    assert run_cli("gate", bad, *options)[0] == 1
    for runs in ((good, bad), (bad, good)):
        code, out, _ = run_cli("gate", *runs, *options)
        assert code == 1, out
        assert "FAILED" in out


def test_a_caller_expected_count_is_the_sums(two_runs: tuple[Path, Path]) -> None:
    good, bad = two_runs
    coverage = read_coverage([*row_files(good), *row_files(bad)], expected=5)
    assert (coverage.expected, coverage.missing, coverage.unexpected, coverage.expected_source) == (
        5,
        1,
        0,
        "given",
    )
    coverage = read_coverage([*row_files(good), *row_files(bad)], expected=3)
    assert (coverage.missing, coverage.unexpected) == (0, 1)


def test_runs_with_no_inventory_or_manifest_are_apart_too(tmp_path: Path) -> None:
    good = _write(tmp_path / "a" / "rollouts.jsonl", [_success(0, 0)])
    bad = _write(tmp_path / "b" / "rollouts_failures.jsonl", [_failure(0, 0, terminal=True)])
    coverage = read_coverage([good, bad])
    assert (coverage.expected, coverage.scored, sum(coverage.failed.values())) == (2, 1, 1)
    assert coverage.expected_source == "rows_seen"


def test_a_rollout_with_only_attempts_not_final_is_a_missing_member(tmp_path: Path) -> None:
    """No materialized inputs: the groups are what the rows show, and every rollout with a row is a
    member (task 1 has rows, none final: a lost group, not no group)."""
    _write(tmp_path / "rollouts.jsonl", [_success(0, 0), _success(0, 1)])
    pending = [_failure(0, 2, terminal=False), _failure(1, 0, terminal=False), _failure(1, 1, terminal=False)]
    _write(tmp_path / "rollouts_failures.jsonl", pending)
    coverage = read_coverage(row_files(tmp_path), min_valid_per_group=2)
    assert coverage.missing == 3
    groups = coverage.groups
    assert groups is not None
    assert (groups.groups, groups.complete, groups.short, groups.lost, groups.missing) == (2, 1, 1, 1, 3)
    assert groups.sizes == {"2": 1, "3": 1}
    code, out, _ = run_cli("gate", tmp_path, "--min-valid-per-group", "2", "--max-short-groups", "0")
    assert code == 1, out


def test_a_given_count_still_names_each_groups_members_from_the_inventory(tmp_path: Path) -> None:
    """`--expected` beside materialized inputs: the count is the caller's, the groups the inventory's
    (a run the breaker ended with most rollouts untried has every group, not none)."""
    rows = _write(tmp_path / "rollouts.jsonl", [_success(0, 0)])
    inputs = [{"_ng_task_index": task, "_ng_rollout_index": r} for task in range(5) for r in (0, 1)]
    _write(tmp_path / "rollouts_materialized_inputs.jsonl", inputs)
    coverage = read_coverage([rows], expected=10, min_valid_per_group=1)
    assert (coverage.expected, coverage.missing, coverage.expected_source) == (10, 9, "given")
    groups = coverage.groups
    assert groups is not None
    assert (groups.groups, groups.complete, groups.lost, groups.missing) == (5, 1, 4, 9)
    assert groups.size_source == "materialized_inputs"


def test_summarize_counts_each_runs_inputs_against_its_own_rows(tmp_path: Path) -> None:
    """`summarize`'s owed and "left no row" counts, run by run: one run's rows never fill a rollout
    the other run's inputs owe (the same ids)."""
    from gym_failures.reporting.summary import summarize

    whole = _run(tmp_path / "whole", successes=[(0, 0), (0, 1)], failures=[])
    half = _run(tmp_path / "half", successes=[(0, 0)], failures=[])  # 0:1 left no row
    summary = summarize([whole, half])
    assert (summary.expected_rollouts, summary.missing_rollouts) == (4, 1)
    assert summary.materialized_inputs == sorted(
        [str(whole / "rollouts_materialized_inputs.jsonl"), str(half / "rollouts_materialized_inputs.jsonl")]
    )


def test_a_given_count_over_several_runs_names_no_rollout_and_none_left_no_row(tmp_path: Path) -> None:
    """`--expected N` is the total's count: as with one run, no rollout is named missing and none is
    counted as leaving no row (a second review found `missing 0` beside "of which left no row 1")."""
    half = _run(tmp_path / "a", successes=[(0, 0)], failures=[])
    whole = _run(tmp_path / "b", successes=[(0, 0), (0, 1)], failures=[])
    coverage = read_coverage([*row_files(half), *row_files(whole)], expected=3)
    assert (coverage.expected, coverage.missing, coverage.left_no_row, coverage.missing_rollouts) == (
        3,
        0,
        0,
        [],
    )


def test_runs_counted_by_the_rows_they_show_beside_inventoried_ones_are_warned_of(tmp_path: Path) -> None:
    """A run with materialized inputs and one with neither inputs nor a manifest: the warning names
    the runs counted by the rollouts they show, not the whole total."""
    from gym_failures.gate import check

    inventoried = _run(tmp_path / "a", successes=[(0, 0)], failures=[])
    bare = _write(tmp_path / "b" / "rollouts.jsonl", [_success(0, 0)])
    verdict = check(read_coverage([*row_files(inventoried), bare]))
    assert verdict.coverage.expected_source == "rows_seen"
    assert any(
        warning.startswith("some runs have neither materialized inputs") for warning in verdict.warnings
    )
    assert not any("distinct rollouts seen" in warning for warning in verdict.warnings)
