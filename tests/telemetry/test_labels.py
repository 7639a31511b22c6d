"""Bounded labels, a row's outcome and the running counts of a collection."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_failures.failure_kinds import FAILURE_KINDS, is_namespaced
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import AgentFailure, ModelFailure
from gym_failures.telemetry import (
    MAX_FAILURE_TYPES,
    CollectionProgress,
    RolloutOutcome,
    failure_kind_label,
    failure_type_label,
    rollout_outcome,
)
from gym_failures.telemetry._labels import OTHER, UNREGISTERED, BoundedValues


def test_a_registered_kind_is_its_own_label() -> None:
    assert failure_kind_label("model_server_error") == "model_server_error"


@pytest.mark.parametrize("kind", ["unregistered:old_label", "old_label", "Not A Kind", "", "a:b:c"])
def test_a_kind_this_version_does_not_know_is_unregistered(kind: str) -> None:
    assert failure_kind_label(kind) == UNREGISTERED


def test_a_namespaced_kind_is_kept() -> None:
    assert failure_kind_label("weather:api_down") == "weather:api_down"


def test_bounded_values_keep_exactly_the_cap_then_other() -> None:
    values = BoundedValues(3)
    assert [values.label(f"k{n}") for n in range(3)] == ["k0", "k1", "k2"]
    assert values.label("k3") == OTHER
    assert values.label("k0") == "k0"  # a kept value stays kept


def test_failure_type_labels_refuse_what_is_no_class_name() -> None:
    assert failure_type_label("aiohttp.client_exceptions.ServerDisconnectedError") == (
        "aiohttp.client_exceptions.ServerDisconnectedError"
    )
    assert failure_type_label("Bearer sk-abc def") == OTHER
    assert failure_type_label("ghp_16C7e42F292c6912E7710c838347Ae178B4a") == OTHER  # a token, not a type
    assert failure_type_label("A" * 129) == OTHER
    assert MAX_FAILURE_TYPES >= 16


@given(st.text(max_size=300))
def test_a_kind_label_is_always_bounded(kind: str) -> None:
    """Whatever a peer sends, the label is a registered kind, a namespaced kind, or one of two words."""
    label = failure_kind_label(kind)
    assert label in FAILURE_KINDS or label in {UNREGISTERED, OTHER} or is_namespaced(label)
    assert label in {UNREGISTERED, OTHER} or label == kind


@given(st.text(max_size=300))
def test_a_type_label_is_the_name_or_other(type_name: str) -> None:
    label = failure_type_label(type_name)
    assert label in {type_name, OTHER}
    assert len(label) <= 128


def _failure_row(final: bool, **failure_fields: object) -> dict[str, object]:
    try:
        raise AgentFailure(
            failure_kind="agent_run_error", failure_reason="x", stage="agent"
        ) from ModelFailure(failure_kind="model_policy_response_timeout", failure_reason="slow")
    except AgentFailure as failure:
        report = failure.failure_report()
    row: dict[str, object] = {"rollout_id": "0:0", "attempt": 1, "final": final}
    row["failure"] = {
        "failure_kind": "agent_run_error",
        "failure_reason": "x",
        "stage": "agent",
        **failure_fields,
    }
    row.update(FailureReportRow.fields(report))
    return row


def test_a_success_row_is_scored() -> None:
    assert rollout_outcome({"rollout_id": "0:0", "result": {"reward": 1.0}}) == RolloutOutcome("scored", True)


def test_a_failure_row_carries_class_kind_and_the_failure_class_of_its_boundary() -> None:
    outcome = rollout_outcome(_failure_row(final=True))
    assert outcome == RolloutOutcome("failed", True, "evaluation", "agent_run_error", "AgentFailure")


def test_a_failure_rows_own_kind_decides_its_class() -> None:
    outcome = rollout_outcome(_failure_row(final=False, failure_kind="model_policy_response_timeout"))
    assert (outcome.final, outcome.failure_class, outcome.failure_kind) == (
        False,
        "model",
        "model_policy_response_timeout",
    )


def test_progress_counts_rollouts_by_final_outcome_and_class() -> None:
    progress = CollectionProgress(expected=5, already_done=1)
    progress.add(RolloutOutcome("scored", True))
    progress.add(RolloutOutcome("failed", False, "evaluation"))
    progress.add(RolloutOutcome("failed", True, "model"))
    progress.add(RolloutOutcome("failed", True, "model"), dispatched=False)
    assert (progress.done, progress.succeeded, progress.failed, progress.retried, progress.attempts) == (
        4,
        1,
        {"model": 2},
        1,
        3,
    )


def test_progress_rate_and_eta() -> None:
    progress = CollectionProgress(expected=4, started=time.monotonic() - 2.0)
    assert progress.eta_s is None  # no rate yet
    progress.add(RolloutOutcome("scored", True))
    progress.add(RolloutOutcome("scored", True))
    assert progress.rate == pytest.approx(1.0, rel=0.2)
    assert progress.eta_s == pytest.approx(2.0, rel=0.2)
    progress.add(RolloutOutcome("scored", True))
    progress.add(RolloutOutcome("scored", True))
    assert progress.eta_s == 0.0


# --- "scored" as the gate counts it -----------------------------------------------------------


def test_a_success_row_is_counted_as_the_gate_counts_it() -> None:
    masked = {"rollout_id": "0:0", "result": {"reward": 0.0}, "mask_sample": True}
    assert rollout_outcome(masked) == RolloutOutcome("masked", True)
    degraded = {"rollout_id": "0:0", "result": {"reward": 1.0}, "failure_kind": "judge_failed"}
    assert rollout_outcome(degraded) == RolloutOutcome("scored", True, degraded=True)
    no_reward = {"rollout_id": "0:0", "result": {"reward": None}}
    assert rollout_outcome(no_reward) == RolloutOutcome(
        "gate_derived", True, failure_class="evaluation", failure_kind="grading_without_verdict"
    )
    verdict = {"rollout_id": "0:0", "result": {"reward": None, "verification": {"verdict": False}}}
    assert rollout_outcome(verdict) == RolloutOutcome("scored", True)


def test_the_progress_counts_agree_with_the_gates_coverage() -> None:
    from gym_failures.gate import rollout_coverage

    rows: list[dict[str, Any]] = [
        {"rollout_id": "0:0", "result": {"reward": 1.0}},
        {"rollout_id": "1:0", "result": {"reward": 1.0}, "failure_kind": "judge_failed"},
        {"rollout_id": "2:0", "result": {"reward": 0.0}, "mask_sample": True},
        {"rollout_id": "3:0", "result": {}},
        {"rollout_id": "4:0", "result": {"reward": 0.0, "response": {"status": "completed", "output": []}}},
    ]
    progress = CollectionProgress(expected=len(rows))
    for row in rows:
        progress.add(rollout_outcome(row))
    coverage = rollout_coverage(rows)
    assert (
        (progress.scored, progress.degraded, progress.masked)
        == (
            coverage.scored,
            coverage.degraded,
            coverage.masked,
        )
        == (2, 1, 1)
    )
    assert (
        progress.gate_derived
        == {k: v for k, v in coverage.gate_derived.items() if v}
        == {
            "evaluation": 1,
            "model": 1,
        }
    )
    assert progress.succeeded == len(rows)
