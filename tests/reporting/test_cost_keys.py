"""The strict reading of an attempt's cost keys (`_gf_duration_s`, `_gf_usage`, `_gf_model_calls`):
never raises, keeps to its bounds, reads a well-formed row back exactly, and reads a bad shape as
absent (never 0); as the collector's own reader reads them back."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gym_failures.reporting._cost_keys import (
    DURATION_S,
    MAX_CALL_ATTEMPT,
    MAX_CALLS,
    MAX_DURATION_S,
    MAX_TOKENS,
    MODEL_CALLS,
    NO_COST,
    USAGE,
    RowCost,
    micros,
    row_cost,
)
from tests.strategies import json_values

# Values near every bound, and of every JSON type a bad writer can put there.
_NUMBERS: st.SearchStrategy[Any] = st.one_of(
    st.integers(-3, 12),
    st.sampled_from([MAX_CALLS, MAX_CALLS + 1, MAX_TOKENS, MAX_TOKENS + 1, 2**63, 2**64, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([True, False, None, "3", [], {}, 3.0, -0.0]),
)
_USAGE = st.one_of(
    json_values(),
    st.dictionaries(st.sampled_from(["input_tokens", "output_tokens", "total_tokens"]), _NUMBERS, max_size=3),
)
_CALLS = st.one_of(
    json_values(),
    st.fixed_dictionaries(
        {},
        optional={
            name: _NUMBERS
            for name in ("calls", "attempts", "failed_attempts", "input_tokens", "output_tokens", "other")
        },
    ),
)
_DURATION = st.one_of(_NUMBERS, json_values(), st.floats(0, MAX_DURATION_S))


@given(duration=_DURATION, usage=_USAGE, calls=_CALLS)
@example(duration=10**400, usage={}, calls={"calls": 10**400, "attempts": 1, "failed_attempts": 0})
def test_reading_any_value_never_raises_and_keeps_to_the_bounds(
    duration: Any, usage: Any, calls: Any
) -> None:
    cost = row_cost({DURATION_S: duration, USAGE: usage, MODEL_CALLS: calls})
    if cost.seconds is not None:
        assert type(cost.seconds) is float
        assert 0 <= cost.seconds <= MAX_DURATION_S
        assert micros(cost.seconds) == math.floor(cost.seconds * 1e6 + 0.5)
    for tokens in (cost.input_tokens, cost.output_tokens):
        assert tokens is None or (type(tokens) is int and 0 <= tokens <= MAX_TOKENS)
    counts = (cost.model_calls, cost.model_attempts, cost.failed_model_attempts)
    assert counts == (None, None, None) or all(type(count) is int for count in counts)
    if cost.model_calls is not None:
        assert cost.model_attempts is not None
        assert cost.failed_model_attempts is not None
        assert 1 <= cost.model_calls <= MAX_CALLS
        assert cost.model_calls <= cost.model_attempts <= cost.model_calls * MAX_CALL_ATTEMPT
        assert 0 <= cost.failed_model_attempts <= cost.model_attempts


@given(
    seconds=st.floats(0, MAX_DURATION_S) | st.integers(0, MAX_DURATION_S),
    inputs=st.integers(0, MAX_TOKENS),
    outputs=st.integers(0, MAX_TOKENS),
    calls=st.integers(1, MAX_CALLS),
    extra=st.integers(0, 1000),
    failed=st.integers(0, 1000),
)
def test_a_well_formed_row_reads_back_exactly(
    seconds: float, inputs: int, outputs: int, calls: int, extra: int, failed: int
) -> None:
    attempts = calls + extra
    row = {
        DURATION_S: seconds,
        USAGE: {"input_tokens": inputs, "output_tokens": outputs},
        MODEL_CALLS: {
            "calls": calls,
            "attempts": attempts,
            "failed_attempts": min(failed, attempts),
            "input_tokens": inputs,
            "other": "a later writer's key, passed over",
        },
    }
    assert row_cost(row) == RowCost(float(seconds), inputs, outputs, calls, attempts, min(failed, attempts))


def test_a_row_without_the_keys_reports_nothing() -> None:
    """A row from before issue 30, or one NeMo Gym's own collector wrote."""
    assert (
        row_cost({"_ng_task_index": 0, "reward": 1.0, "response": {"usage": {"input_tokens": 5}}}) is NO_COST
    )


@pytest.mark.parametrize(
    "duration",
    [-0.001, True, False, "1.5", None, [1.5], {"s": 1}, math.nan, math.inf, MAX_DURATION_S + 1, 10**400],
)
def test_a_bad_duration_is_absent(duration: object) -> None:
    assert row_cost({DURATION_S: duration}).seconds is None


@pytest.mark.parametrize(
    "usage",
    [
        {},
        {"input_tokens": -1},
        {"input_tokens": True},
        {"input_tokens": 5.0},
        {"input_tokens": "5"},
        {"input_tokens": None},
        {"input_tokens": MAX_TOKENS + 1},
        {"input_tokens": 5, "output_tokens": -1},  # one bad figure: the whole usage is doubted
        {"input_tokens": 5, "total_tokens": 6},  # a key the writer never writes
        [5, 6],
        "5",
    ],
)
def test_a_bad_usage_is_absent(usage: object) -> None:
    cost = row_cost({USAGE: usage})
    assert (cost.input_tokens, cost.output_tokens) == (None, None)


def test_either_token_figure_may_be_missing() -> None:
    assert row_cost({USAGE: {"output_tokens": 7}}) == RowCost(output_tokens=7)


_GOOD_CALLS = {"calls": 2, "attempts": 5, "failed_attempts": 3}


@pytest.mark.parametrize(
    "changes",
    [
        {"calls": 0, "attempts": 0, "failed_attempts": 0},  # an attempt with no call reports none
        {"calls": True},
        {"attempts": 5.0},
        {"failed_attempts": "3"},
        {"attempts": 1},  # fewer attempts than calls
        {"failed_attempts": 6},  # more failed attempts than attempts
        {"failed_attempts": -1},
        {"calls": MAX_CALLS + 1, "attempts": MAX_CALLS + 1},
        {"attempts": 2 * MAX_CALL_ATTEMPT + 1},
        {"input_tokens": -5},
        {"output_tokens": None},
        {"calls": None},
    ],
)
def test_bad_model_calls_are_absent(changes: dict[str, object]) -> None:
    cost = row_cost({MODEL_CALLS: {**_GOOD_CALLS, **changes}})
    assert (cost.model_calls, cost.model_attempts, cost.failed_model_attempts) == (None, None, None)


def test_model_calls_missing_a_count_are_absent() -> None:
    for name in _GOOD_CALLS:
        calls = {key: value for key, value in _GOOD_CALLS.items() if key != name}
        assert row_cost({MODEL_CALLS: calls}).model_attempts is None


def test_model_calls_tokens_are_no_usage() -> None:
    """The agent's sums are the row's `_gf_usage` already: read there only, never twice."""
    cost = row_cost({MODEL_CALLS: {**_GOOD_CALLS, "input_tokens": 9}})
    assert (cost.model_attempts, cost.input_tokens) == (5, None)


@given(
    duration=_NUMBERS,
    usage=st.dictionaries(st.sampled_from(["input_tokens", "output_tokens", "x"]), _NUMBERS, max_size=3)
    | json_values(),
    calls=st.fixed_dictionaries(
        {},
        optional={name: _NUMBERS for name in ("calls", "attempts", "failed_attempts", "input_tokens")},
    ),
)
@example(duration=10**400, usage={}, calls={})
@example(duration=1.0, usage={}, calls={"calls": 2000, "attempts": 1_500_000_000, "failed_attempts": 0})
def test_the_summary_reads_the_keys_as_the_collectors_own_reader_does(
    duration: Any, usage: Any, calls: Any
) -> None:
    from gym_failures._attempt_cost import read_attempt_cost

    row = {DURATION_S: duration, USAGE: usage, MODEL_CALLS: calls}
    theirs, ours = read_attempt_cost(row), row_cost(row)
    assert ours.seconds == theirs.duration_s or (ours.seconds is None and theirs.duration_s is None)
    usage_read = theirs.usage or {}
    assert (ours.input_tokens, ours.output_tokens) == (
        usage_read.get("input_tokens"),
        usage_read.get("output_tokens"),
    )
    counted = theirs.model_calls
    expected = (
        (None, None, None) if counted is None else (counted.calls, counted.attempts, counted.failed_attempts)
    )
    assert (ours.model_calls, ours.model_attempts, ours.failed_model_attempts) == expected
