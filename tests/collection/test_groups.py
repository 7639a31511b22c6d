"""Prompt groups while a run collects (issue 30): the live view's group counts, `--min-valid-per-group`
on `collect`, and a resume that re-runs only the members short groups need (`--fill-short-groups`).

The end-to-end runs collect from the real test agent (`tests.collection.agent_app`): a
`fail_rollouts` task fails the first attempt of the members its `fail` names, so a first run with
`--max-attempts 1` leaves chosen members of chosen groups failed, and a resume with a larger budget
reopens them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gym_failures.cli._live import counts_text, live_collection
from gym_failures.collection import CollectionConfig, CollectionSummary, collect, read_rows
from gym_failures.collection._groups import (
    GroupedProgress,
    GroupsRefused,
    GroupTally,
    fill_short_groups,
    group_sizes,
)
from gym_failures.collection._resume import PendingRollout
from gym_failures.materialized import MaterializedRollout
from gym_failures.telemetry import CollectionProgress, RolloutOutcome
from tests.cli.invoke import run_cli

# --- The tally ---------------------------------------------------------------------------------


def _tally(min_valid: int | None = 2) -> GroupTally:
    """Three groups of 3: task 0 with 2 valid already (complete at K 2), task 1 with 0 valid and all
    3 owed, task 2 with 0 valid and 1 owed (short at K 2 from the start)."""
    owed = [(1, 0), (1, 1), (1, 2), (2, 2)]
    return GroupTally(min_valid, {0: 3, 1: 3, 2: 3}, {0: 2}, owed)


def test_a_group_is_complete_short_or_pending_against_k() -> None:
    tally = _tally()
    assert (tally.complete, tally.short, tally.pending) == (1, 1, 1)
    tally.settle("1:0", valid=False)
    assert (tally.complete, tally.short, tally.pending) == (1, 1, 1), "1 valid of the 2 left can still come"
    tally.settle("1:1", valid=True)
    assert (tally.complete, tally.short, tally.pending) == (1, 1, 1)
    tally.settle("1:2", valid=True)
    assert (tally.complete, tally.short, tally.pending) == (2, 1, 0)
    tally.settle("2:2", valid=True)
    assert (tally.complete, tally.short, tally.pending) == (2, 1, 0), "1 valid of 2 needed: still short"


def test_a_group_goes_short_as_soon_as_k_is_out_of_reach() -> None:
    tally = _tally()
    tally.settle("1:0", valid=False)
    tally.settle("1:1", valid=False)
    assert (tally.complete, tally.short, tally.pending) == (1, 2, 0)


def test_without_k_a_group_needs_every_member() -> None:
    tally = _tally(None)
    assert (tally.complete, tally.short, tally.pending) == (0, 2, 1)
    for key in ("1:0", "1:1", "1:2"):
        tally.settle(key, valid=True)
    assert (tally.complete, tally.short, tally.pending) == (1, 2, 0)
    assert tally.text() == "groups (all valid): 1 complete, 2 short, 0 pending"


def test_a_row_of_a_rollout_the_run_does_not_owe_changes_nothing() -> None:
    tally = _tally()
    for key in ("0:0", "9:9", None, 7):
        tally.settle(key, valid=True)
    tally.settle("1:0", valid=True)
    tally.settle("1:0", valid=True)  # a second row of the same rollout
    assert (tally.complete, tally.short, tally.pending) == (1, 1, 1)


def test_the_live_counts_show_the_groups_after_the_rollouts() -> None:
    progress = GroupedProgress(expected=9, groups=_tally())
    progress.add(RolloutOutcome("scored", True))
    progress.settle({"rollout_id": "1:0"}, RolloutOutcome("scored", True))
    progress.settle({"rollout_id": "1:1"}, RolloutOutcome("masked", True))
    progress.settle({"rollout_id": "1:2"}, RolloutOutcome("failed", False, "model"))  # retried: owed still
    assert counts_text(progress) == (
        "1 scored · failed: none · 0 retried · groups (min 2 valid): 1 complete, 1 short, 1 pending"
    )


def test_groups_of_one_are_not_shown() -> None:
    progress = GroupedProgress(expected=2, groups=GroupTally(1, {0: 1, 1: 1}, {}, [(0, 0), (1, 0)]))
    assert "groups" not in counts_text(progress)
    assert "groups" not in counts_text(CollectionProgress())


def test_the_plain_line_at_the_end_holds_the_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with live_collection() as update:
        update(GroupedProgress(expected=9, groups=_tally()))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "collecting: 0/9 done · 0 scored · failed: none · 0 retried · groups (min 2 valid): "
    )


# --- Sizes, and what is refused ----------------------------------------------------------------


def _config(tmp_path: Path, **options: Any) -> CollectionConfig:
    (tmp_path / "tasks.jsonl").write_text('{"mode": "ok"}\n')
    return CollectionConfig(
        input_path=tmp_path / "tasks.jsonl",
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url="http://127.0.0.1:9",
        **options,
    )


def _inventory(sizes: dict[int, int]) -> list[MaterializedRollout]:
    return [
        MaterializedRollout(task, rollout, {"mode": "ok"}, "agent")
        for task, size in sizes.items()
        for rollout in range(size)
    ]


def test_group_sizes_are_the_inventorys_and_none_when_nothing_asks(tmp_path: Path) -> None:
    assert group_sizes(_config(tmp_path), _inventory({0: 1, 1: 1})) is None
    assert group_sizes(_config(tmp_path), _inventory({0: 2, 1: 3})) == {0: 2, 1: 3}
    assert group_sizes(_config(tmp_path, min_valid_per_group=1), _inventory({0: 1})) == {0: 1}


def test_k_above_every_group_is_refused_and_k_above_some_is_not(tmp_path: Path) -> None:
    with pytest.raises(GroupsRefused, match="min_valid_per_group 4 is more than any group of the run has"):
        group_sizes(_config(tmp_path, min_valid_per_group=4), _inventory({0: 2, 1: 3}))
    # Mixed sizes (a NeMo Gym run's inputs): a group under K is short from the start, not refused.
    assert group_sizes(_config(tmp_path, min_valid_per_group=3), _inventory({0: 2, 1: 3})) == {0: 2, 1: 3}


def test_k_below_one_is_no_config(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="min_valid_per_group"):
        _config(tmp_path, min_valid_per_group=0)


async def test_fill_without_a_run_to_resume_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    config = _config(tmp_path, fill_short_groups=True)
    with pytest.raises(GroupsRefused, match="holds no run to resume"):
        await collect(config)
    assert not (tmp_path / "out").exists()


# --- Which members a fill re-runs --------------------------------------------------------------


def _pending(task: int, rollout: int, reopened: bool = False) -> PendingRollout:
    return PendingRollout(task, rollout, {}, 2, reopened=reopened)


def test_a_fill_takes_what_each_short_group_needs_lowest_index_first(tmp_path: Path) -> None:
    # Groups of 4 at K 3: task 0 has 1 valid (needs 2 of its 3 open), task 1 has 3 (complete), task
    # 2 has 0 and 2 open (cannot reach 3), task 3 has 2 valid and 1 open (needs it).
    rollouts = [
        _pending(0, 3, reopened=True),
        _pending(0, 1),
        _pending(0, 2, reopened=True),
        _pending(1, 0),
        _pending(2, 0),
        _pending(2, 1),
        _pending(3, 2, reopened=True),
    ]
    summary = CollectionSummary()
    config = _config(tmp_path, min_valid_per_group=3, fill_short_groups=True)
    sizes = {0: 4, 1: 4, 2: 4, 3: 4}
    chosen = fill_short_groups(config, sizes, {0: 1, 1: 3, 3: 2}, rollouts, [{"closing": 1}], summary)
    assert [(rollout.task_index, rollout.rollout_index) for rollout in chosen] == [(0, 1), (0, 2), (3, 2)]
    assert (summary.left_open, summary.unfillable_groups, summary.reopened) == (4 + 1, 1, 2)


# --- End to end, against the real agent --------------------------------------------------------

TASKS = [
    {"id": 0, "mode": "fail_rollouts", "fail": [0, 1, 2]},  # 1 valid: needs 1 at K 2
    {"id": 1, "mode": "ok"},  # complete
    {"id": 2, "mode": "fail_rollouts", "fail": [0, 1, 2, 3]},  # none valid: needs 2
    {"id": 3, "mode": "fail_rollouts", "fail": [1, 2]},  # 2 valid: complete at K 2
    {"id": 4, "mode": "masked"},  # every member final, none valid: cannot be filled
    {"id": 5, "mode": "terminal"},  # terminal failures are not reopened: cannot be filled
]


def _collect(tmp_path: Path, agent_url: str, *options: str) -> tuple[int, dict[str, Any], str]:
    tasks = tmp_path / "tasks.jsonl"
    if not tasks.exists():
        tasks.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    code, stdout, stderr = run_cli(
        "collect", tasks, "--agent-url", agent_url, "--output", f"{tmp_path / 'run'}/", "--num-repeats", "4",
        "--json", *options,
    )  # fmt: skip
    return code, (json.loads(stdout) if stdout else {}), stderr


def _attempts(tmp_path: Path) -> Counter[tuple[str, int]]:
    rows = tmp_path / "run" / "rollouts.jsonl"
    return Counter(
        (row["rollout_id"], row["attempt"])
        for path in (rows, rows.with_name("rollouts_failures.jsonl"))
        for row in read_rows(path)
    )


def _groups(tmp_path: Path) -> dict[str, Any]:
    code, stdout, _ = run_cli("gate", tmp_path / "run", "--min-valid-per-group", "2", "--json")
    assert code in (0, 1)
    groups: dict[str, Any] = json.loads(stdout)["coverage"]["groups"]
    return groups


def _live_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.startswith("collecting: ")][-1]


def test_a_fill_resume_reruns_exactly_the_members_short_groups_need(tmp_path: Path, agent_url: str) -> None:
    code, first, stderr = _collect(tmp_path, agent_url, "--max-attempts", "1", "--min-valid-per-group", "2")
    assert code == 0, stderr
    assert "groups (min 2 valid): 2 complete, 4 short, 0 pending" in _live_line(stderr)
    assert first["failed_final"] == 13
    before = _attempts(tmp_path)

    options = ("--max-attempts", "2", "--min-valid-per-group", "2", "--fill-short-groups")
    code, filled, stderr = _collect(tmp_path, agent_url, *options)
    assert code == 0, stderr
    rerun = _attempts(tmp_path) - before
    assert sorted(rerun) == [("0:0", 2), ("2:0", 2), ("2:1", 2)]
    assert (filled["attempts"], filled["reopened"], filled["left_open"], filled["unfillable_groups"]) == (
        3,
        3,
        6,  # 0:1, 0:2, 2:2, 2:3, 3:1 and 3:2: no group needs them
        2,  # tasks 4 (masked) and 5 (terminal)
    )
    line = _live_line(stderr)
    assert line.startswith("collecting: 18/18 done · 3 scored"), "the rollouts left open are not waited for"
    assert "groups (min 2 valid): 4 complete, 2 short, 0 pending" in line
    groups = _groups(tmp_path)
    assert (groups["complete"], groups["short"], groups["short_groups"], groups["valid"]) == (
        4,
        2,
        ["4", "5"],
        10,
    )

    # Nothing is short that a fill can help: a second fill sends nothing.
    code, again, _ = _collect(tmp_path, agent_url, *options)
    assert (code, again["attempts"], again["left_open"]) == (0, 0, 6)

    # The members left open are as they were: a resume without the option re-runs every one of them.
    before = _attempts(tmp_path)
    code, _, _ = _collect(tmp_path, agent_url, "--max-attempts", "2")
    assert code == 0
    rerun = _attempts(tmp_path) - before
    assert sorted(rerun) == [
        (f"{task}:{rollout}", 2) for task, rollout in ((0, 1), (0, 2), (2, 2), (2, 3), (3, 1), (3, 2))
    ]
    assert _groups(tmp_path)["valid"] == 16


def test_a_fill_without_k_fills_groups_to_every_member(tmp_path: Path, agent_url: str) -> None:
    code, _, stderr = _collect(tmp_path, agent_url, "--max-attempts", "1")
    assert code == 0, stderr
    assert "groups (all valid): 1 complete, 5 short, 0 pending" in _live_line(stderr)
    before = _attempts(tmp_path)
    code, filled, stderr = _collect(tmp_path, agent_url, "--max-attempts", "2", "--fill-short-groups")
    assert code == 0, stderr
    rerun = _attempts(tmp_path) - before
    assert sorted(key for key, _ in rerun) == ["0:0", "0:1", "0:2", "2:0", "2:1", "2:2", "2:3", "3:1", "3:2"]
    assert (filled["left_open"], filled["unfillable_groups"]) == (0, 2)
    assert "groups (all valid): 4 complete, 2 short, 0 pending" in _live_line(stderr)


def test_a_run_of_groups_of_one_shows_no_groups(tmp_path: Path, agent_url: str) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"mode": "ok"}\n')
    code, _, stderr = run_cli("collect", tasks, "--agent-url", agent_url, "--output", tmp_path / "out.jsonl")
    assert code == 0
    assert "groups" not in _live_line(stderr)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (
            ("--min-valid-per-group", "0"),
            "argument --min-valid-per-group: 0 is below the minimum 1",
        ),
        (
            ("--min-valid-per-group", "5"),
            "--min-valid-per-group 5 is more than any group of the run has: its groups have 4 members",
        ),
        (
            ("--fill-short-groups",),
            "--fill-short-groups re-runs the members an earlier run's short groups need, and ",
        ),
    ],
)
def test_group_options_that_cannot_apply_exit_2_before_anything_is_written(
    tmp_path: Path, agent_url: str, options: tuple[str, ...], error: str
) -> None:
    code, _, stderr = _collect(tmp_path, agent_url, *options)
    assert code == 2
    assert stderr.startswith(f"gym-failures collect: error: {error}")
    assert not (tmp_path / "run").exists()


def test_k_above_a_resumed_runs_groups_is_refused_and_its_rows_kept(tmp_path: Path, agent_url: str) -> None:
    """A resumed run's groups are its materialized inputs' (a NeMo Gym run's, whatever --num-repeats
    says); a K none of them reaches is refused before a row is written."""
    code, _, _ = _collect(tmp_path, agent_url, "--max-attempts", "1")
    assert code == 0
    before = _attempts(tmp_path)
    code, _, stderr = _collect(tmp_path, agent_url, "--max-attempts", "2", "--min-valid-per-group", "5")
    assert code == 2
    assert "--min-valid-per-group 5 is more than any group of the run has" in stderr
    assert _attempts(tmp_path) == before
