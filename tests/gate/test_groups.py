"""Group verdicts: each prompt group's valid members against a minimum, on GRPO-shaped runs of several
group sizes with masks, failures, tainted results and missing members; from the command line and on
the runs NeMo Gym 0.7.0 itself wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_failures.cli import main
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import ModelFailure
from gym_failures.gate import (
    GateThresholds,
    GroupCoverage,
    check,
    group_cells,
    group_coverage,
    read_coverage,
    rollout_coverage,
)
from tests.conftest import ROOT
from tests.saved_rows import failure_row, model_503_chain, success_row, write_jsonl

NEMO_GYM_RUNS = ROOT / "examples" / "nemo_gym_runs"


def tainted(rollout: str) -> dict[str, Any]:
    row = success_row(rollout)
    cut = ModelFailure(failure_kind="transport_peer_drop", failure_reason="cut")
    row.update(FailureReportRow.fields(cut.failure_report()))
    return row


def grpo_run(tmp_path: Path) -> Path:
    """Four groups: 0 of four valid, 1 of four with a mask and a final failure, 2 with no valid member
    (a tainted result, a gate-derived one, a final failure, a retried attempt that never ended), 3 of
    eight with one member that left no row at all. The materialized inputs owe every member."""
    rows = [success_row(f"0:{r}") for r in range(4)]
    rows += [success_row("1:0"), success_row("1:1")]
    masked = {"_ng_task_index": 1, "_ng_rollout_index": 2, "reward": 0.0, "response": {}, "mask_sample": True}
    rows += [masked, failure_row(model_503_chain(), "1:3", final=True)]
    empty = success_row("2:1")
    empty["result"]["response"] = "  "  # an empty answer: gate-derived
    rows += [tainted("2:0"), empty]
    rows += [
        failure_row(model_503_chain(), "2:2", final=True),
        failure_row(model_503_chain(), "2:3", final=False),
    ]
    rows += [success_row(f"3:{r}") for r in range(7)]
    run = tmp_path / "run"
    run.mkdir()
    write_jsonl(run / "rollouts.jsonl", rows)
    owed = [(0, r) for r in range(4)] + [(1, r) for r in range(4)] + [(2, r) for r in range(4)]
    owed += [(3, r) for r in range(8)]
    inputs = [{"_ng_task_index": task, "_ng_rollout_index": r} for task, r in owed]
    write_jsonl(run / "rollouts_materialized_inputs.jsonl", inputs)
    return run


def test_a_grpo_shaped_run_is_counted_group_by_group(tmp_path: Path) -> None:
    coverage = read_coverage([grpo_run(tmp_path) / "rollouts.jsonl"], min_valid_per_group=3)
    groups = coverage.groups
    assert groups is not None
    assert (groups.groups, groups.complete, groups.short, groups.lost) == (4, 2, 2, 1)
    assert (groups.valid, groups.masked, groups.failed, groups.missing) == (13, 1, 4, 2)
    assert groups.wasted == 2  # group 1's two valid members
    assert groups.sizes == {"4": 3, "8": 1}
    assert groups.short_groups == ["1", "2"]
    assert groups.size_source == "materialized_inputs"


def test_the_minimum_at_its_bound(tmp_path: Path) -> None:
    run = grpo_run(tmp_path) / "rollouts.jsonl"
    at_two = read_coverage([run], min_valid_per_group=2).groups
    at_four = read_coverage([run], min_valid_per_group=4).groups
    assert at_two is not None
    assert at_four is not None
    assert (at_two.complete, at_two.short, at_two.wasted) == (3, 1, 0)  # group 1 has exactly 2
    assert (at_four.complete, at_four.short, at_four.wasted) == (2, 2, 2)  # group 0 has exactly 4


def test_the_gate_fails_past_the_short_groups_allowed_as_a_count_or_a_share(tmp_path: Path) -> None:
    coverage = read_coverage([grpo_run(tmp_path) / "rollouts.jsonl"], min_valid_per_group=3)

    def lenient(**limits: Any) -> GateThresholds:
        return GateThresholds(
            min_scored_share=0.0, max_evaluation_share=1.0, max_unknown_share=1.0, max_missing=10, **limits
        )

    assert check(coverage, lenient(max_short_groups=2)).passed
    failed = check(coverage, lenient(max_short_groups=1))
    assert failed.reasons == [
        "2 of 4 groups short of 3 valid members, 1 with none (maximum 1); 2 valid rollouts in them wasted"
    ]
    assert check(coverage, lenient(max_short_group_share=0.5)).passed
    assert not check(coverage, lenient(max_short_group_share=0.49)).passed


def test_a_tainted_member_is_not_valid_unless_tainted_results_are_scored() -> None:
    rows = [tainted("0:0"), success_row("0:1")]
    assert rollout_coverage(rows, min_valid_per_group=2).groups == GroupCoverage(
        min_valid=2, groups=1, short=1, valid=1, failed=1, wasted=1, sizes={"2": 1}, short_groups=["0"]
    )
    scored = rollout_coverage(rows, min_valid_per_group=2, score_tainted=True).groups
    assert scored is not None
    assert scored.complete == 1


def test_without_materialized_inputs_groups_are_the_rows_seen_and_the_verdict_says_so() -> None:
    coverage = rollout_coverage(
        [success_row("0:0"), success_row("0:1"), success_row("1:0")], min_valid_per_group=2
    )
    assert coverage.groups is not None
    assert coverage.groups.size_source == "rows_seen"
    assert coverage.groups.sizes == {"1": 1, "2": 1}
    assert any("groups were counted from the rows seen" in line for line in check(coverage).warnings)


def test_no_groups_are_counted_unless_asked() -> None:
    assert rollout_coverage([success_row()]).groups is None


def test_the_groups_table_as_printed() -> None:
    groups = GroupCoverage(
        min_valid=3, groups=2, complete=1, short=1, valid=4, failed=2, wasted=1, sizes={"3": 2}
    )
    assert group_cells(groups)[:3] == [
        ("groups", "2"),
        ("complete (at least 3 valid)", "1"),
        ("short (under 3 valid)", "1"),
    ]
    assert group_cells(groups)[-1] == ("group sizes (groups of members)", "2 of 3")


@given(
    st.dictionaries(
        st.from_regex(r"[0-9]{1,2}:[0-9]{1,2}", fullmatch=True),
        st.sampled_from(["scored", "masked", "failed", "gate", "tainted", "unscored"]),
        max_size=40,
    ),
    st.integers(min_value=1, max_value=5),
)
def test_any_run_adds_up(outcomes: dict[str, str], min_valid: int) -> None:
    groups = group_coverage(outcomes, min_valid)
    assert groups.complete + groups.short == groups.groups
    assert groups.lost <= groups.short
    assert groups.valid + groups.masked + groups.failed == len(outcomes)
    assert groups.wasted <= groups.valid
    assert sum(groups.sizes.values()) == groups.groups


def test_a_minimum_under_1_is_refused() -> None:
    with pytest.raises(ValueError, match="min_valid is at least 1"):
        GroupCoverage(min_valid=0)


# --- the command line --------------------------------------------------------------------------


def test_gate_counts_groups_from_the_command_line(tmp_path: Path, capsys: Any) -> None:
    run = grpo_run(tmp_path)
    lenient = [
        "--min-scored-share",
        "0",
        "--max-evaluation-share",
        "1",
        "--max-unknown-share",
        "1",
        "--max-missing",
        "10",
    ]
    assert main(["gate", str(run / "rollouts.jsonl"), *lenient, "--min-valid-per-group", "3", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["coverage"]["groups"]["short"] == 2
    assert document["thresholds"]["max_short_groups"] == 0
    assert (
        main(
            [
                "gate",
                str(run / "rollouts.jsonl"),
                *lenient,
                "--min-valid-per-group",
                "3",
                "--max-short-groups",
                "50%",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "short (under 3 valid)" in out
    assert "short groups (tasks): 1, 2" in out
    assert (
        main(
            [
                "gate",
                str(run / "rollouts.jsonl"),
                *lenient,
                "--min-valid-per-group",
                "3",
                "--max-short-groups",
                "0.25",
            ]
        )
        == 1
    )
    capsys.readouterr()


@pytest.mark.parametrize("value", ["-1", "1.5", "150%", "some", "nan"])
def test_a_bad_short_groups_limit_is_one_line_and_exit_2(value: str, capsys: Any, tmp_path: Path) -> None:
    rows = write_jsonl(tmp_path / "rows.jsonl", [success_row()])
    assert main(["gate", str(rows), "--min-valid-per-group", "1", "--max-short-groups", value]) == 2
    assert "--max-short-groups" in capsys.readouterr().err


# --- NeMo Gym 0.7.0's own rows ------------------------------------------------------------------


def test_nemo_gyms_own_runs_are_grouped_by_its_task_index() -> None:
    """`completed`: NeMo Gym's collector ran 2 tasks twice each (`num_repeats` 2); `mixed`: 11 tasks
    once each, some masked, some failed. A group is a task, its members NeMo Gym's repeats."""
    completed = read_coverage([NEMO_GYM_RUNS / "completed" / "rollouts.jsonl"], min_valid_per_group=2)
    assert completed.groups is not None
    assert (completed.groups.groups, completed.groups.complete, completed.groups.sizes) == (2, 2, {"2": 2})
    assert completed.groups.size_source == "materialized_inputs"
    mixed = read_coverage(
        [NEMO_GYM_RUNS / "mixed" / "rollouts.jsonl", NEMO_GYM_RUNS / "mixed" / "rollouts_failures.jsonl"],
        min_valid_per_group=1,
    )
    assert mixed.groups is not None
    assert mixed.groups.groups == mixed.expected == 11
    assert mixed.groups.complete == mixed.scored
    assert mixed.groups.masked == mixed.masked


def test_a_short_groups_limit_without_a_minimum_is_one_line_and_exit_2(tmp_path: Path, capsys: Any) -> None:
    rows = write_jsonl(tmp_path / "rows.jsonl", [success_row()])
    assert main(["gate", str(rows), "--max-short-groups", "0"]) == 2
    assert "--max-short-groups needs --min-valid-per-group" in capsys.readouterr().err


def test_a_minimum_above_every_group_is_warned_about() -> None:
    """`collect` refuses such a minimum; the gate counts every group short, and says why."""
    from gym_failures import gate

    rows = [success_row(f"{task}:{repeat}") for task in range(2) for repeat in range(2)]
    coverage = gate.rollout_coverage(rows, min_valid_per_group=3)
    verdict = gate.check(coverage, gate.GateThresholds())
    assert verdict.passed is False
    assert "--min-valid-per-group 3 is more than any group has (the largest has 2): every group is short" in (
        verdict.warnings
    )
    fitting = gate.check(gate.rollout_coverage(rows, min_valid_per_group=2), gate.GateThresholds())
    assert fitting.warnings == [w for w in fitting.warnings if "more than any group" not in w]
