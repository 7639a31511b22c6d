"""Tests for cause trees of saved rows: bounds on depth and on numbers a row holds."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from gym_failures.cli import main
from gym_failures.cli._tree import MAX_SHOWN_DEPTH
from gym_failures.failure_records import FailureEvent
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import new_event_id
from gym_failures.reporting.explain import MAX_TREE_DEPTH, EventNode, explain_row
from tests.saved_rows import failure_row, lost_reply, success_row, write_jsonl


def deep_row(depth: int) -> dict[str, Any]:
    """A failure row whose saved report is one chain `depth` events deep (a collection can save one:
    an agent's body report has no depth bound)."""
    ids = [new_event_id() for _ in range(depth)]
    events = {
        event_id: FailureEvent(
            event_id=event_id,
            boundary="model",
            failure_kind="model_server_error",
            failure_reason=f"hop {index}",
            cause_id=ids[index + 1] if index + 1 < depth else None,
        ).model_dump(mode="json")
        for index, event_id in enumerate(ids)
    }
    row = failure_row(lost_reply())
    row[FailureReportRow.EVENTS] = events
    row[FailureReportRow.FAILURE_ID] = ids[0]
    return row


def chain_depth(node: EventNode | None) -> int:
    depth = 0
    while node is not None:
        depth += 1
        node = node.cause
    return depth


@pytest.mark.parametrize("depth", [MAX_TREE_DEPTH - 1, MAX_TREE_DEPTH, MAX_TREE_DEPTH + 1, 1000])
def test_a_deep_chain_is_shown_to_the_bound_and_the_rest_counted(depth: int) -> None:
    explanation = explain_row(deep_row(depth))

    shown = chain_depth(explanation.tree)
    assert shown == min(depth, MAX_TREE_DEPTH)
    last = explanation.tree
    while last is not None and last.cause is not None:
        last = last.cause
    assert last is not None
    assert last.causes_cut == depth - shown
    assert explanation.observations == []


@pytest.mark.parametrize("flag", [[], ["--json"]])
def test_explain_prints_a_1000_deep_chain(tmp_path: Path, flag: list[str]) -> None:
    path = write_jsonl(tmp_path / "rollouts_failures.jsonl", [deep_row(1000)])

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["explain", str(path), "--line", "1", *flag])

    assert code == 0
    if flag:
        json.loads(stdout.getvalue())
    else:
        assert f"caused by {1000 - MAX_SHOWN_DEPTH} more events" in stdout.getvalue()


@pytest.mark.parametrize("reward", [10**400, -(10**400)])
def test_a_reward_past_a_floats_range_is_no_reward(reward: int) -> None:
    row = success_row("0:0")
    row["reward"] = reward
    assert explain_row(row).reward is None
