"""Judged by what happened: a success built on a call that ended in failure is tainted, never scored by
default; a text answer is judged by its content (empty, whitespace, truncated) like the object forms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gym_failures.cli import main
from gym_failures.failure_kinds import EMPTY_ANSWER, TRUNCATED_ANSWER, FailureClass
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import ModelFailure
from gym_failures.gate import (
    TRUNCATION_REASONS,
    check,
    coverage_cells,
    coverage_remarks,
    derive_gate_kind,
    rollout_coverage,
    tainted_failure,
)
from gym_failures.gate import _coverage as gate_coverage
from tests.saved_rows import success_row, write_jsonl


def cut() -> ModelFailure:
    return ModelFailure(failure_kind="transport_peer_drop", failure_reason="the stream ended before its end")


def tainted_row(rollout: str = "0:0", failure: ModelFailure | None = None) -> dict[str, Any]:
    """A success row whose report names the call's failure as its own: the agent answered with it."""
    row = success_row(rollout)
    row.update(FailureReportRow.fields((failure or cut()).failure_report()))
    return row


def recovered_row(rollout: str = "0:0") -> dict[str, Any]:
    """A success row that recovered: its report holds the failure, and no failure of its own."""
    return success_row(rollout, recovered=cut())


def test_the_row_key_is_the_transports() -> None:
    assert gate_coverage._FAILURE_ID_KEY == FailureReportRow.FAILURE_ID


def test_a_success_built_on_a_failed_call_is_tainted_and_a_recovered_one_is_scored() -> None:
    """The careless agent's row and the careful agent's row: the same failure seen, one handled."""
    coverage = rollout_coverage([tainted_row("0:0"), recovered_row("1:0")])
    assert (coverage.scored, coverage.tainted) == (1, 1)
    assert coverage.tainted_by_kind == {"transport_peer_drop": 1}
    assert coverage.outcomes == 2
    # A dropped connection is the evaluation's side: it counts against the evaluation share.
    assert coverage.by_class(FailureClass.EVALUATION) == 1
    assert ("tainted (built on a failed call)", "1", "50.0%") in coverage_cells(coverage)
    assert any(line.startswith("tainted (a success built on") for line in coverage_remarks(coverage))


def test_a_run_of_tainted_answers_fails_the_gate_a_run_of_recovered_ones_passes() -> None:
    careless = check(rollout_coverage([tainted_row(f"{task}:0") for task in range(10)]))
    careful = check(rollout_coverage([recovered_row(f"{task}:0") for task in range(10)]))
    assert not careless.passed
    assert careless.coverage.scored == 0
    assert careful.passed
    assert careful.coverage.scored == 10


def test_scoring_tainted_results_is_asked_for_and_still_counted_apart() -> None:
    coverage = rollout_coverage([tainted_row("0:0"), recovered_row("1:0")], score_tainted=True)
    assert (coverage.scored, coverage.tainted, coverage.tainted_scored) == (2, 1, True)
    assert coverage.outcomes == 2
    assert coverage.by_class(FailureClass.EVALUATION) == 0
    assert ("  of which tainted (built on a failed call)", "1", "50.0%") not in coverage_cells(coverage)
    assert ("of which tainted (built on a failed call)", "1", "50.0%") in coverage_cells(coverage)


def test_a_masked_result_stays_masked() -> None:
    # A NeMo Gym completed row (flat) that NeMo Gym masked: a result never trained on either way.
    row: dict[str, Any] = {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 0.0, "response": {}}
    row.update({"mask_sample": True, **FailureReportRow.fields(cut().failure_report())})
    coverage = rollout_coverage([row])
    assert (coverage.masked, coverage.tainted) == (1, 0)


def test_the_tainted_failure_is_classified_by_its_own_evidence() -> None:
    refused = ModelFailure(failure_kind="provider_quota_exhausted", failure_reason="429", http_status=429)
    assert tainted_failure(tainted_row(failure=refused)) == ("provider_quota_exhausted", "evaluation")
    assert tainted_failure(recovered_row()) is None
    assert tainted_failure(success_row()) is None


@given(st.one_of(st.none(), st.integers(), st.text(max_size=20), st.lists(st.integers(), max_size=3)))
def test_an_unreadable_saved_report_that_names_a_failure_is_tainted_never_a_crash(events: object) -> None:
    row = success_row()
    row.update({"_ng_failure_events": events, "_ng_failure_id": "x", "_ng_failure_events_omitted": False})
    assert tainted_failure(row) == ("(unreadable)", "unknown")
    assert rollout_coverage([row]).tainted == 1


def test_gate_command_says_tainted_and_score_tainted_scores_them(tmp_path: Path, capsys: Any) -> None:
    rows = write_jsonl(tmp_path / "rollouts.jsonl", [tainted_row(f"{task}:0") for task in range(4)])
    assert main(["gate", str(rows), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["coverage"]["tainted"] == 4
    assert document["coverage"]["scored"] == 0
    assert main(["gate", str(rows), "--json", "--score-tainted"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["coverage"]["scored"], document["coverage"]["tainted"]) == (4, 4)
    assert main(["gate", str(rows)]) == 1
    assert "tainted (built on a failed call)" in capsys.readouterr().out


# --- text answers ----------------------------------------------------------------------------------


def text_row(text: object, **result: Any) -> dict[str, Any]:
    row = success_row()
    row["result"] = {"reward": 0.0, "response": text, **result}
    return row


@given(st.text(alphabet=" \t\n\r\u00a0\u2003", max_size=8))
def test_empty_or_whitespace_text_is_an_empty_answer(text: str) -> None:
    assert derive_gate_kind(text_row(text)) == EMPTY_ANSWER


def test_text_with_a_token_limit_finish_reason_is_truncated_and_any_other_is_not() -> None:
    for reason in sorted(TRUNCATION_REASONS):
        assert derive_gate_kind(text_row("The answer is", finish_reason=reason)) == TRUNCATED_ANSWER
        assert derive_gate_kind(text_row("The answer is", stop_reason=reason)) == TRUNCATED_ANSWER
    others: list[object] = ["stop", "end_turn", None, 3, ["length"]]
    for other in others:
        assert derive_gate_kind(text_row("The answer is 42.", finish_reason=other)) is None
    # Cause before symptom: a truncated empty answer is truncated.
    assert derive_gate_kind(text_row("", finish_reason="length")) == TRUNCATED_ANSWER


def test_an_anthropic_message_is_judged_like_the_others() -> None:
    def message(text: str, stop: str) -> dict[str, Any]:
        return {
            "type": "message",
            "role": "assistant",
            "stop_reason": stop,
            "content": [{"type": "text", "text": text}],
        }

    assert derive_gate_kind(text_row(message("42", "end_turn"))) is None
    assert derive_gate_kind(text_row(message("4", "max_tokens"))) == TRUNCATED_ANSWER
    assert derive_gate_kind(text_row(message("  ", "end_turn"))) == EMPTY_ANSWER


@given(st.text(max_size=30), st.one_of(st.none(), st.text(max_size=12), st.integers(), st.booleans()))
def test_any_text_answer_is_read_never_a_crash(text: str, reason: object) -> None:
    kind = derive_gate_kind(text_row(text, finish_reason=reason))
    if not text.strip() and reason not in TRUNCATION_REASONS:
        assert kind == EMPTY_ANSWER
    elif isinstance(reason, str) and reason in TRUNCATION_REASONS:
        assert kind == TRUNCATED_ANSWER
    else:
        assert kind is None


# --- the same count in the live line, collect's figures and the metrics' outcome ---------------------


def test_the_collectors_outcome_and_live_line_count_tainted_apart() -> None:
    from gym_failures.cli._live import counts_text
    from gym_failures.telemetry import CollectionProgress, RolloutOutcome, rollout_outcome

    outcome = rollout_outcome(tainted_row())
    assert outcome == RolloutOutcome(
        "tainted", True, failure_class="evaluation", failure_kind="transport_peer_drop"
    )
    assert rollout_outcome(recovered_row()) == RolloutOutcome("scored", True)
    progress = CollectionProgress(expected=2)
    progress.add(outcome)
    progress.add(rollout_outcome(recovered_row("1:0")))
    assert (progress.succeeded, progress.scored) == (2, 1)
    assert progress.tainted_by_kind == {"transport_peer_drop": 1}
    assert counts_text(progress).startswith("1 scored · tainted: evaluation 1 · failed: none")


# --- root causes in the gate ------------------------------------------------------------------------


def test_a_wrapped_failures_root_cause_is_counted_beside_its_kind(tmp_path: Path, capsys: Any) -> None:
    """The README's pattern: `raise AgentFailure("agent_run_error") from model_failure`. The outcome's
    kind is the agent's; its root cause, the model's 429, is what the gate shows beside it."""
    from gym_failures.failures import AgentFailure
    from gym_failures.gate import failures_by_root
    from tests.saved_rows import failure_row

    def wrapped() -> AgentFailure:
        quota = ModelFailure(failure_kind="provider_quota_exhausted", failure_reason="429", http_status=429)
        try:
            try:
                raise quota
            except ModelFailure as model_failure:
                raise AgentFailure(
                    failure_kind="agent_run_error", failure_reason="no answer"
                ) from model_failure
        except AgentFailure as failure:
            return failure

    rows = [failure_row(wrapped(), f"{task}:0", final=True) for task in range(3)]
    coverage = rollout_coverage(rows)
    assert coverage.failed_by_kind == {"agent_run_error": 3}
    assert coverage.failed_by_root_kind == {"provider_quota_exhausted": 3}
    assert failures_by_root(coverage) == [("provider_quota_exhausted", 3)]
    # A failure that is its own root adds no table.
    plain = rollout_coverage(
        [failure_row(ModelFailure(failure_kind="model_server_error", failure_reason="x"), final=True)]
    )
    assert failures_by_root(plain) == []
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    assert main(["gate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "Final failures by root cause" in out
    assert "provider_quota_exhausted" in out


@given(st.one_of(st.integers(), st.lists(st.text(max_size=3), max_size=2), st.booleans(), st.floats()))
def test_a_failure_id_that_is_not_an_id_is_tainted_as_summarize_reads_it(value: object) -> None:
    row = tainted_row()
    row["_ng_failure_id"] = value
    assert tainted_failure(row) == ("(unreadable)", "unknown")
    row["_ng_failure_id"] = None
    assert tainted_failure(row) is None
