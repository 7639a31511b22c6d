"""Rows saved before issue 19 (contract keys at the top level) and after it (`_ng_*` / `_gf_*` keys)
read the same, through `rows.normalized`, the summary's SQL and the gate: migrated on read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gym_failures.gate import read_coverage
from gym_failures.nemo_gym import written_by_gym_failures
from gym_failures.reporting.summary import summarize
from gym_failures.row_keys import SAVED_AS, read_saved_keys, saved
from gym_failures.rows import normalized
from tests.saved_rows import (
    context_limit,
    failure_row,
    lost_reply,
    model_503_chain,
    oom_chain,
    quota_chain,
    success_row,
    write_jsonl,
)

_CONTRACT = (
    "task_index",
    "rollout_index",
    "rollout_id",
    "attempt",
    "final",
    "final_reason",
    "closed_on_resume",
)


def _old_rows() -> list[dict[str, Any]]:
    """A run's rows in the form gym-failures saved them before issue 19."""
    rows = [
        success_row("0:0"),
        success_row("1:0", attempt=2, recovered=model_503_chain()),
        success_row("2:0", verdict=None),
        failure_row(model_503_chain(), "1:0", attempt=1, final=False),
        failure_row(oom_chain(), "3:0", attempt=1, final=False),
        failure_row(oom_chain(), "3:0", attempt=2, final=False),
        failure_row(oom_chain(), "3:0", attempt=3, final=True),
        failure_row(context_limit(), "4:0", terminal=True),
        failure_row(quota_chain(), "5:0", attempt=2, final=False),
        failure_row(lost_reply(), "6:0", attempt=1, final=False),
    ]
    rows[1]["task_id"] = 7  # an input's `id` may be a number
    closed = {**failure_row(lost_reply(), "6:0", attempt=1, final=True), "closed_on_resume": True}
    return [*rows, closed]


def _contract(row: dict[str, Any]) -> dict[str, Any]:
    read = normalized(row)
    return {key: read.get(key) for key in (*_CONTRACT, "task_id", "failure", "result", "reward")}


def test_an_old_row_and_its_saved_form_read_the_same() -> None:
    for old in _old_rows():
        new = saved(normalized(old))
        assert not {"task_index", "rollout_index", "attempt", *SAVED_AS} & set(new), (
            "nothing at the top level"
        )
        assert _contract(new) == _contract(old)


@pytest.fixture
def two_forms(tmp_path: Path) -> tuple[list[Path], list[Path]]:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    rows = _old_rows()
    successes = [row for row in rows if "failure" not in row]
    failures = [row for row in rows if "failure" in row]
    old_files = [write_jsonl(old / "r.jsonl", successes), write_jsonl(old / "r_failures.jsonl", failures)]
    new_files = [
        write_jsonl(new / "r.jsonl", [saved(normalized(row)) for row in successes]),
        write_jsonl(new / "r_failures.jsonl", [saved(normalized(row)) for row in failures]),
    ]
    return old_files, new_files


def test_the_summary_counts_both_forms_alike(two_forms: tuple[list[Path], list[Path]]) -> None:
    old, new = (summarize(files, max_attempts=3).model_dump(exclude={"files"}) for files in two_forms)
    assert old == new
    assert old["final_failure_rows"] == 3


def test_the_gate_covers_both_forms_alike(two_forms: tuple[list[Path], list[Path]]) -> None:
    old, new = (read_coverage(files, expected=7, max_attempts=3).as_dict() for files in two_forms)
    assert old == new


_VALUE = st.none() | st.booleans() | st.integers(-2, 5) | st.text(max_size=3)
_ROW = st.fixed_dictionaries(
    {},
    optional={
        "task_index": _VALUE,
        "rollout_index": _VALUE,
        "attempt": _VALUE,
        "final": _VALUE,
        "final_reason": _VALUE,
        "closed_on_resume": _VALUE,
        "task_id": _VALUE,
        "failure": st.just({"failure_kind": "agent_run_error", "failure_reason": "", "terminal": False}),
        "_ng_task_index": _VALUE,
        "_ng_attempt_index": _VALUE,
        "_gf_final": _VALUE,
        "_gf_task_id": _VALUE,
    },
)


@given(_ROW)
def test_any_row_read_saved_and_read_again_keeps_its_contract(row: dict[str, Any]) -> None:
    """Saving what a reader made of a row, and reading that, gives the reader's contract keys back
    (never raising, whatever the values); reading its `_gf_` keys only fills in (JSON null counts as
    absent), never removes or changes a value."""
    read = normalized(row)
    # A row gym-failures saves names its rollout (`rollout_id` and both indices): without them, a row
    # saved with NeMo Gym's index and none of our marks reads as NeMo Gym's (`written_by_gym_failures`).
    assume(written_by_gym_failures(saved(read)))
    again = normalized(saved(read))
    for key in ("final", "final_reason", "closed_on_resume", "task_id", "failure"):
        assert again.get(key) == read.get(key), key
    for key in ("task_index", "rollout_index"):
        if type(read.get(key)) is int:
            assert again.get(key) == read[key], key
    # A first attempt is saved as no `_ng_attempt_index`, which reads as attempt 1 on a rollout's row
    # (one with its task index), as NeMo Gym leaves the index out.
    if type(read.get("attempt")) is int and read["attempt"] >= 1 and type(read.get("task_index")) is int:
        assert again.get("attempt") == read["attempt"]
    copy = dict(row)
    read_saved_keys(copy)
    kept = {key: value for key, value in row.items() if value is not None}  # a null is filled in
    assert {key: copy[key] for key in kept} == kept
