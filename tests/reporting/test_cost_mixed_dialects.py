"""The amplification of a rollout whose rows are in both dialects: rows gym-failures wrote (ours) and rows
NeMo Gym 0.7.0's own collector wrote, in one file or in two. Each attempt counts once, and a rollout's
model attempts are the sum over its attempts, whichever dialect each row is in; `summarize`'s SQL
says what Python's reader of the same rows (`rows.normalized`, `_cost_keys.row_cost`) says."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from gym_failures.reporting._cost_keys import MODEL_CALLS, row_cost
from gym_failures.reporting.summary import summarize
from gym_failures.row_keys import saved
from gym_failures.rows import is_rollout_row, normalized
from tests.cli.invoke import run_cli
from tests.saved_rows import context_limit, failure_row, success_row, write_jsonl

MAX_ATTEMPTS = 3


def _calls(row: dict[str, Any], calls: int, attempts: int, failed: int) -> dict[str, Any]:
    return {**row, MODEL_CALLS: {"calls": calls, "attempts": attempts, "failed_attempts": failed}}


def _nemo_failure(task: int, repeat: int, attempt_index: int | None = None) -> dict[str, Any]:
    """A failure row as NeMo Gym's own collector writes it (its agent's reply, stamped)."""
    row: dict[str, Any] = {
        "responses_create_params": {"input": "2 + 2?"},
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
        "_ng_failure_class": "agent_run_error",
        "_ng_failure_terminal": False,
        "_ng_failure_message": "policy model replied HTTP 503",
    }
    if attempt_index is not None:
        row["_ng_attempt_index"] = attempt_index
    return row


def _nemo_success(task: int, repeat: int, attempt_index: int | None = None) -> dict[str, Any]:
    """A completed row as NeMo Gym's own collector writes it: flat."""
    row: dict[str, Any] = {
        "responses_create_params": {"input": "2 + 2?"},
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
        "reward": 1.0,
        "response": {"output": []},
    }
    if attempt_index is not None:
        row["_ng_attempt_index"] = attempt_index
    return row


def _by_hand(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int, int]]:
    """Per rollout (as `rows.normalized` names it): its attempts that reported model calls, their logical
    calls and their model attempts; a copy that closes a rollout on resume is no attempt."""
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for raw in rows:
        row = normalized(raw, MAX_ATTEMPTS)
        cost = row_cost(raw)
        if not is_rollout_row(row) or row.get("closed_on_resume") is True or cost.model_attempts is None:
            continue
        assert cost.model_calls is not None
        figures = found[str(row["rollout_id"])]
        figures[0] += 1
        figures[1] += cost.model_calls
        figures[2] += cost.model_attempts
    return {name: (figures[0], figures[1], figures[2]) for name, figures in found.items()}


def _largest(paths: list[Path]) -> list[tuple[str, int, int, int]]:
    summary = summarize(paths, max_attempts=MAX_ATTEMPTS)
    assert summary.cost is not None
    amplification = summary.cost.amplification
    largest = [
        (item.rollout_id, item.attempts, item.model_calls, item.model_attempts)
        for item in amplification.largest
    ]
    assert amplification.rollouts == len(largest)
    assert amplification.attempts == sum(item[1] for item in largest)
    assert amplification.model_attempts == sum(item[3] for item in largest)
    return largest


def _ours_resumes_nemo_gym() -> list[dict[str, Any]]:
    """NeMo Gym's collector ran the first attempt (it failed); gym-failures resumed with the second."""
    return [
        _calls(_nemo_failure(0, 0), 1, 4, 3),
        _calls(saved(success_row("0:0", attempt=2)), 1, 2, 1),
    ]


def _nemo_gym_resumes_ours() -> list[dict[str, Any]]:
    """gym-failures collected the first attempt (it failed); NeMo Gym's collector resumed with the second."""
    return [
        _calls(saved(failure_row(context_limit(), "0:0", final=False)), 1, 5, 4),
        _calls(_nemo_success(0, 0, attempt_index=1), 1, 1, 0),
    ]


def _contract_beside_nemo_gym() -> list[dict[str, Any]]:
    """A row of ours in the contract's own form (`rollout_id` "0:0", no `_ng_*` index: the oldest form,
    or the contract written by another tool) beside NeMo Gym's row of the same rollout's next attempt."""
    return [
        _calls(failure_row(context_limit(), "0:0", final=False), 1, 5, 4),
        _calls(_nemo_success(0, 0, attempt_index=1), 1, 1, 0),
    ]


def _closed_on_resume() -> list[dict[str, Any]]:
    """Two attempts NeMo Gym ran, then gym-failures' copy closing the rollout on resume (no attempt:
    it repeats the last attempt's keys, its model calls too)."""
    first, second = _calls(_nemo_failure(1, 0), 1, 3, 2), _calls(_nemo_failure(1, 0, 1), 1, 2, 2)
    closing = saved(
        {
            **normalized(second, MAX_ATTEMPTS),
            "agent_ref": {"name": "agent"},
            "final": True,
            "final_reason": "attempt_budget_exhausted",
            "closed_on_resume": True,
        }
    )
    return [first, second, closing]


CASES = {
    "ours_resumes_nemo_gym": (_ours_resumes_nemo_gym, [("0:0", 2, 2, 6)]),
    "nemo_gym_resumes_ours": (_nemo_gym_resumes_ours, [("0:0", 2, 2, 6)]),
    "contract_beside_nemo_gym": (_contract_beside_nemo_gym, [("0:0", 2, 2, 6)]),
    "closed_on_resume": (_closed_on_resume, [("1:0", 2, 2, 5)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_rollout_in_both_dialects_is_one_rollout_in_one_file(tmp_path: Path, case: str) -> None:
    make, expected = CASES[case]
    rows = make()
    assert _largest([write_jsonl(tmp_path / "rows.jsonl", rows)]) == expected
    assert _by_hand(rows) == {name: (attempts, calls, model) for name, attempts, calls, model in expected}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_rollout_in_both_dialects_is_one_rollout_over_two_files(tmp_path: Path, case: str) -> None:
    make, expected = CASES[case]
    rows = make()
    paths = [write_jsonl(tmp_path / f"rows-{index}.jsonl", [row]) for index, row in enumerate(rows)]
    assert _largest(paths) == expected


def test_json_names_the_rollout_once(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", _contract_beside_nemo_gym())
    code, out, _ = run_cli("summarize", path, "--json")
    assert code == 0
    amplification = json.loads(out)["cost"]["amplification"]
    per_rollout = ("rollouts", "per_rollout_mean", "per_rollout_max")
    assert [amplification[name] for name in per_rollout] == [1, 6.0, 6]
    assert amplification["largest"] == [
        {"rollout_id": "0:0", "attempts": 2, "model_calls": 2, "model_attempts": 6}
    ]


def test_a_name_is_one_rollout_whatever_the_rows_indices_say(tmp_path: Path) -> None:
    """A rollout is its name: a row of ours named "2:1" whose `_ng_*` indices say otherwise (or are no
    integers) is of rollout "2:1", as NeMo Gym's row of task 2, repeat 1 is; a name that is no
    "<task>:<rollout>" written plainly ("02:1") is a rollout of its own, as Python names it."""
    named = saved(failure_row(context_limit(), "2:1", final=False))
    rows = [
        _calls({**named, "_ng_task_index": "2"}, 1, 2, 1),
        _calls({**named, "_ng_task_index": 7, "_ng_rollout_index": 0}, 1, 3, 2),
        _calls(_nemo_success(2, 1, attempt_index=2), 1, 1, 0),
        _calls({**named, "rollout_id": "02:1"}, 1, 4, 3),
    ]
    expected = [("2:1", 3, 3, 6), ("02:1", 1, 1, 4)]
    assert _largest([write_jsonl(tmp_path / "rows.jsonl", rows)]) == expected
    assert _by_hand(rows) == {name: (attempts, calls, model) for name, attempts, calls, model in expected}
