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
from gym_failures.failures import ModelFailure, new_event_id
from gym_failures.gate import tainted_failure
from gym_failures.reporting.explain import MAX_TREE_DEPTH, EventNode, explain_row
from tests.saved_rows import failure_row, lost_reply, raised, success_row, write_jsonl


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


# --- tainted and recovered successes -------------------------------------------------------------


def tainted_row(rollout: str = "5:0") -> dict[str, Any]:
    """A success whose report names a failure of its own: the agent answered from a cut stream (the
    model's drop, itself caused by the worker's crash). Its reward is 0: a newcomer read it as scored."""
    row = success_row(rollout, verdict=False)
    failure = raised(
        ModelFailure(failure_kind="transport_peer_drop", failure_reason="the stream was cut mid-answer"),
        ModelFailure(failure_kind="model_server_error", failure_reason="the inference worker crashed"),
    )
    row.update(FailureReportRow.fields(failure.failure_report()))
    return row


def _explain(tmp_path: Path, row: dict[str, Any], *flags: str) -> str:
    path = write_jsonl(tmp_path / "rollouts.jsonl", [row])
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["explain", str(path), "--rollout", row["rollout_id"], *flags]) == 0
    return stdout.getvalue()


def test_explain_says_a_tainted_success_is_tainted_and_draws_its_failure_chain(tmp_path: Path) -> None:
    output = _explain(tmp_path, tainted_row())
    lines = output.splitlines()
    head = " ".join(output[: output.index("✖")].split())  # the first line, however the width wraps it
    assert head.endswith(
        "rollout 5:0 · attempt 1 · success · tainted: built on a call that ended in failure "
        "(transport_peer_drop) · reward 0 ├──"
    )
    # The row's own failure is its failure chain, its cause below it: no other observation.
    failure = next(index for index, line in enumerate(lines) if "✖ [model] transport_peer_drop" in line)
    cause = next(index for index, line in enumerate(lines) if "caused by [model] model_server_error" in line)
    assert failure < cause
    assert "other observations" not in output
    assert "the gate counts this result as tainted, not scored (unless gate --score-tainted)" in output


def test_explain_json_names_the_failure_a_tainted_success_was_built_on(tmp_path: Path) -> None:
    row = tainted_row()
    (explanation,) = json.loads(_explain(tmp_path, row, "--json"))
    assert (explanation["outcome"], explanation["reward"]) == ("success", 0.0)
    assert explanation["tainted"] == {
        "failure_kind": "transport_peer_drop",
        "failure_class": "evaluation",
        "failure_id": row[FailureReportRow.FAILURE_ID],
    }
    assert explanation["recovered"] is False
    assert explanation["tree"]["event"]["event_id"] == row[FailureReportRow.FAILURE_ID]
    assert explanation["tree"]["cause"]["event"]["failure_kind"] == "model_server_error"
    assert explanation["observations"] == []


def test_explain_says_what_a_success_recovered_from(tmp_path: Path) -> None:
    row = success_row("3:0", recovered=lost_reply())
    output = _explain(tmp_path, row)
    assert "tainted" not in output
    assert "recovered from" in output
    assert "other observations" not in output
    (explanation,) = json.loads(_explain(tmp_path, row, "--json"))
    assert (explanation["tainted"], explanation["recovered"], explanation["tree"]) == (None, True, None)
    assert len(explanation["observations"]) == 1


@pytest.mark.parametrize("masked", [False, True])
def test_explain_and_the_gate_agree_on_which_rows_are_tainted(masked: bool) -> None:
    unreadable = {**success_row(), FailureReportRow.EVENTS: "garbage", FailureReportRow.FAILURE_ID: "x"}
    rows = [tainted_row(), success_row(recovered=lost_reply()), success_row(), unreadable]
    for row in rows:
        row["mask_sample"] = masked
        assert explain_row(row).masked is masked
        tainted = explain_row(row).tainted
        found = None if tainted is None else (tainted.failure_kind, tainted.failure_class)
        assert found == tainted_failure(row)
    tainted = explain_row(unreadable).tainted
    assert tainted is not None
    assert tainted.model_dump() == {
        "failure_kind": "(unreadable)",
        "failure_class": "unknown",
        "failure_id": None,
    }
    # A failure row is never tainted: its report's failure is its own.
    assert explain_row(failure_row(lost_reply())).tainted is None
    assert explain_row(failure_row(lost_reply())).recovered is False


def test_a_tainted_success_with_an_unreadable_report_says_so(tmp_path: Path) -> None:
    row = {**success_row("6:0"), FailureReportRow.EVENTS: "garbage", FailureReportRow.FAILURE_ID: "x"}
    output = _explain(tmp_path, row)
    words = " ".join(output.split())
    assert "success · tainted: built on a call that ended in failure (unreadable) · reward 1" in words
    assert "[omitted] this report lost events on the way" in output


def test_a_failure_is_called_retried_only_when_a_later_attempt_of_its_rollout_came(tmp_path: Path) -> None:
    """Issue 31: NeMo Gym's first failed `/run` waits for its `--resume`, and was labelled "retried"."""
    from gym_failures.reporting.explain import rollout_rows
    from tests.saved_rows import oom_chain

    rows = [
        failure_row(oom_chain(), "0:0", attempt=1, final=False),
        success_row("0:0", attempt=2),
        failure_row(oom_chain(), "1:0", attempt=1, final=False),
    ]
    path = write_jsonl(tmp_path / "rollouts.jsonl", rows)
    first, second = rollout_rows([path], "0:0")
    assert (first.retried, second.retried) == (True, None)
    assert first.not_final_label == " · retried"
    (waiting,) = rollout_rows([path], "1:0")
    assert waiting.retried is False
    assert waiting.not_final_label == " · not final, not retried yet (a resume retries it)"
    assert explain_row(rows[2]).not_final_label == " · not final"
    # A resume's closing copy of an attempt is no later attempt of it.
    closed = write_jsonl(
        tmp_path / "closed.jsonl",
        [
            rows[2],
            {**rows[2], "final": True, "final_reason": "attempt_budget_exhausted", "closed_on_resume": True},
        ],
    )
    attempt, copy = rollout_rows([closed], "1:0")
    assert (attempt.retried, copy.closed_on_resume) == (False, True)
    # The demo's and the HTML report's tree: one row read alone, then its rollout's rows read.
    from gym_failures.reporting.explain import line_row, with_retried

    alone = line_row(path, 1)
    assert alone is not None
    assert alone.retried is None
    settled = with_retried(alone, [path])
    assert settled is not None
    assert settled.retried is True
    waiting_alone = line_row(path, 3)
    assert waiting_alone is not None
    settled = with_retried(waiting_alone, [path])
    assert settled is not None
    assert settled.retried is False
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["explain", str(path), "--rollout", "1:0"]) == 0
    assert "not retried yet" in out.getvalue()
    assert "· retried" not in out.getvalue()


def test_a_failure_a_retry_rule_closed_names_the_rule() -> None:
    from tests.saved_rows import oom_chain

    row = failure_row(oom_chain(), "0:0")
    row["final_reason"] = "retry_cap_reached"
    row["_gf_retry_rule"] = {"rule": "cap", "max_attempts": 3, "retry": False, "max_retries_per_run": 1}
    explanation = explain_row(row)
    assert (explanation.retry_rule, explanation.final_label) == (
        "cap",
        " · final (retry_cap_reached, rule cap)",
    )
    del row["_gf_retry_rule"]
    assert explain_row(row).final_label == " · final (retry_cap_reached)"
