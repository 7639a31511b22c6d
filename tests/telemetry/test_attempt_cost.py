"""What each attempt cost, recorded beside `gym.rollout.completed_total`: its duration and model
attempts as histograms, its tokens as a counter by side; nothing for a row that reports none."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gym_failures.reporting._cost_keys import DURATION_S, MODEL_CALLS, NO_COST, USAGE, RowCost
from gym_failures.row_keys import saved
from gym_failures.telemetry import (
    ATTEMPT_DURATION,
    ATTEMPT_MODEL_ATTEMPTS,
    ATTEMPT_TOKENS,
    ROLLOUTS_COMPLETED,
    RolloutOutcome,
    record_rollout,
    rollout_outcome,
)
from gym_failures.telemetry import _record as record_module
from tests.saved_rows import failure_row, model_503_chain, success_row
from tests.telemetry.conftest import Telemetry

_FAILED = {
    "nemo.gym.rollout.outcome": "failed",
    "nemo.gym.rollout.dispatch.name": "agent",
    "nemo.gym.failure_class": "model",
    "nemo.gym.failure_kind": "model_server_error",
    "nemo.gym.rollout.rerun": False,
}


def _failed(cost: RowCost) -> RolloutOutcome:
    return RolloutOutcome(
        "failed",
        final=False,
        failure_class="model",
        failure_kind="model_server_error",
        failure_type="ModelFailure",
        cost=cost,
    )


def test_an_attempts_duration_model_attempts_and_tokens_are_recorded(telemetry: Telemetry) -> None:
    record_rollout(
        _failed(RowCost(2.5, 120, 7, model_calls=1, model_attempts=9, failed_model_attempts=9)), "agent"
    )
    record_rollout(
        _failed(RowCost(0.5, 30, None, model_calls=1, model_attempts=3, failed_model_attempts=3)), "agent"
    )
    record_rollout(RolloutOutcome("scored", True, cost=RowCost(seconds=1.0)), "agent")
    points = telemetry.points()
    # The failure type stays on the counter only: a histogram is a series per bucket.
    counters = {point.attributes["nemo.gym.rollout.outcome"]: point for point in points[ROLLOUTS_COMPLETED]}
    assert counters["failed"].attributes == {**_FAILED, "nemo.gym.failure_type": "ModelFailure"}
    durations = {point.attributes["nemo.gym.rollout.outcome"]: point for point in points[ATTEMPT_DURATION]}
    assert durations["failed"].attributes == _FAILED
    assert (durations["failed"].value, durations["failed"].total) == (2, 3.0)
    assert (durations["scored"].value, durations["scored"].total) == (1, 1.0)
    (model_attempts,) = points[ATTEMPT_MODEL_ATTEMPTS]
    assert (model_attempts.attributes, model_attempts.value, model_attempts.total) == (_FAILED, 2, 12.0)
    tokens = {point.attributes["gen_ai.token.type"]: point for point in points[ATTEMPT_TOKENS]}
    assert {side: point.value for side, point in tokens.items()} == {"input": 150, "output": 7}
    assert tokens["input"].attributes == {**_FAILED, "gen_ai.token.type": "input"}


def test_an_attempt_that_reports_no_cost_records_none(telemetry: Telemetry) -> None:
    """A row NeMo Gym's own collector wrote, or one from before issue 30."""
    record_rollout(_failed(NO_COST), "agent")
    points = telemetry.points()
    assert [point.value for point in points[ROLLOUTS_COMPLETED]] == [1]
    assert not {ATTEMPT_DURATION, ATTEMPT_MODEL_ATTEMPTS, ATTEMPT_TOKENS} & set(points)


def _costed(row: dict[str, Any]) -> dict[str, Any]:
    return {
        **saved(row),
        DURATION_S: 1.25,
        USAGE: {"input_tokens": 40, "output_tokens": 2},
        MODEL_CALLS: {"calls": 2, "attempts": 4, "failed_attempts": 2},
    }


@pytest.mark.parametrize(
    "row",
    [success_row("0:0"), failure_row(model_503_chain(), "0:0", final=False)],
    ids=["success", "failure"],
)
def test_a_rows_outcome_carries_its_cost(row: dict[str, Any]) -> None:
    assert rollout_outcome(_costed(row)).cost == RowCost(1.25, 40, 2, 2, 4, 2)
    assert rollout_outcome(saved(row)).cost is NO_COST


@pytest.mark.parametrize(
    ("row", "rerun"),
    [
        (success_row("0:0", attempt=1), False),
        (success_row("0:0", attempt=2), True),
        (failure_row(model_503_chain(), "0:0", attempt=3, final=False), True),
        ({"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "response": {}}, False),
        ({"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_attempt_index": 1, "reward": 1.0}, True),
        ({"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_attempt_index": "1", "reward": 1.0}, False),
    ],
)
def test_a_rows_outcome_says_whether_it_is_a_rerun(row: dict[str, Any], rerun: bool) -> None:
    assert rollout_outcome(saved(row)).rerun is rerun


def test_reruns_cost_is_recorded_apart(telemetry: Telemetry) -> None:
    """What retrying cost, queryable: the same failure on a first attempt and on a re-run are two
    series (`nemo.gym.rollout.rerun`)."""
    cost = RowCost(2.0, 10, 1, model_calls=1, model_attempts=1, failed_model_attempts=1)
    record_rollout(_failed(cost), "agent")
    record_rollout(replace(_failed(cost), rerun=True), "agent")
    record_rollout(replace(_failed(cost), rerun=True), "agent")
    durations = telemetry.points()[ATTEMPT_DURATION]
    by_rerun = {point.attributes["nemo.gym.rollout.rerun"]: point.total for point in durations}
    assert by_rerun == {False: 2.0, True: 4.0}


def test_a_bad_cost_key_is_left_out_not_recorded_as_zero() -> None:
    row = {**_costed(success_row("0:0")), DURATION_S: "1.25", USAGE: {"input_tokens": -1}}
    assert rollout_outcome(row).cost == RowCost(model_calls=2, model_attempts=4, failed_model_attempts=2)


class _Broken:
    def add(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("broken exporter")

    record = add


def test_recording_a_cost_never_raises_into_the_collector(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = record_module._load()
    assert loaded is not None
    broken = record_module._AttemptCost(_Broken(), _Broken(), _Broken())  # type: ignore[arg-type]
    monkeypatch.setattr(loaded, "attempt_cost", broken)
    record_rollout(_failed(RowCost(2.5, 120, 7)), "agent")
    assert [point.value for point in telemetry.points()[ROLLOUTS_COMPLETED]] == [1]
