"""The per-attempt `RolloutFailure` record: validation both ways, the version-1 migration, property tests."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gym_failures.failure_records import EpisodeFailure
from gym_failures.rollout_failure import (
    RolloutFailure,
    UnsupportedSchemaVersion,
    delivery_of,
    migrate_v1,
    read_rollout_failure,
    to_v1,
)
from tests.strategies import bounded_texts, failure_kinds, failure_stages

_FAILURES = st.builds(
    EpisodeFailure,
    failure_kind=st.one_of(st.none(), failure_kinds()),
    failure_reason=bounded_texts(2000),
    stage=st.one_of(st.none(), failure_stages()),
    terminal=st.booleans(),
)


@st.composite
def records(draw: st.DrawFn) -> RolloutFailure:
    source = draw(st.sampled_from(["environment", "collector"]))
    delivery = (
        "delivered"
        if source == "environment"
        else draw(st.sampled_from(["not_sent", "possibly_delivered", "delivered"]))
    )
    return RolloutFailure(
        episode_id={
            "rollout_id": draw(st.text(min_size=1, max_size=128)),
            "attempt": draw(st.integers(1, 10**6)),
            "repeat": draw(st.integers(0, 10**6)),
        },
        run_id=draw(st.text(min_size=1, max_size=128)),
        source=source,
        delivery=delivery,
        failure=draw(_FAILURES),
        http_status=draw(st.one_of(st.none(), st.integers(100, 599))),
        exception_type=draw(st.one_of(st.none(), st.text(max_size=2000))),
    )


def _valid(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema_version": 2,
        "episode_id": {"rollout_id": "0:0", "attempt": 1, "repeat": 0},
        "run_id": "run-1",
        "source": "collector",
        "delivery": "not_sent",
        "failure": {"failure_kind": "transport_unreachable", "failure_reason": "refused", "terminal": False},
    }
    data.update(changes)
    return data


@given(records())
def test_a_record_survives_json_both_ways(record: RolloutFailure) -> None:
    assert read_rollout_failure(record.model_dump(mode="json")) == record
    assert RolloutFailure.model_validate_json(record.model_dump_json()) == record


@given(records())
def test_a_record_migrates_to_version_1_and_back_without_loss(record: RolloutFailure) -> None:
    old = to_v1(record)
    assert old["schema_version"] == 1
    assert "delivery" not in old
    assert read_rollout_failure(old) == record
    assert RolloutFailure.model_validate(migrate_v1(old)) == record


@pytest.mark.parametrize(
    ("delivered", "delivery"), [(False, "not_sent"), (None, "possibly_delivered"), (True, "delivered")]
)
def test_version_1s_delivered_flag_becomes_the_delivery_state(delivered: bool | None, delivery: str) -> None:
    v1 = {key: value for key, value in _valid().items() if key not in ("episode_id", "delivery")}
    v1.update(schema_version=1, rollout_id="0:0", attempt=1, repeat=0, delivered=delivered)
    assert read_rollout_failure(v1).delivery == delivery


def test_a_version_1_record_without_its_delivered_flag_is_refused() -> None:
    v1 = {
        "schema_version": 1,
        "rollout_id": "0:0",
        "attempt": 1,
        "repeat": 0,
        "run_id": "r",
        "source": "collector",
    }
    with pytest.raises(ValueError, match="delivered"):
        read_rollout_failure(v1)


@pytest.mark.parametrize("version", [0, 3, "2", 2.0, None, True])
def test_an_unknown_schema_version_is_refused(version: object) -> None:
    with pytest.raises(UnsupportedSchemaVersion):
        read_rollout_failure(_valid(schema_version=version))


def test_a_record_that_is_no_object_is_refused() -> None:
    with pytest.raises(UnsupportedSchemaVersion):
        read_rollout_failure([1, 2])


@pytest.mark.parametrize(
    "changes",
    [
        {"reward": 0.0},
        {"episode_id": {"rollout_id": "0:0", "attempt": 1, "repeat": 0, "task": 1}},
        {"failure": {"failure_reason": "", "terminal": False, "extra": 1}},
    ],
)
def test_unknown_fields_are_refused_not_guessed(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        read_rollout_failure(_valid(**changes))


@pytest.mark.parametrize("delivery", ["not_sent", "possibly_delivered"])
def test_an_environments_failure_must_have_been_delivered(delivery: str) -> None:
    with pytest.raises(ValidationError, match="delivered"):
        read_rollout_failure(_valid(source="environment", delivery=delivery))
    assert read_rollout_failure(_valid(source="environment", delivery="delivered")).source == "environment"


@pytest.mark.parametrize(("status", "valid"), [(99, False), (100, True), (599, True), (600, False)])
def test_the_http_status_is_bounded(status: int, valid: bool) -> None:
    if valid:
        assert read_rollout_failure(_valid(http_status=status)).http_status == status
    else:
        with pytest.raises(ValidationError):
            read_rollout_failure(_valid(http_status=status))


@pytest.mark.parametrize(("size", "valid"), [(2000, True), (2001, False)])
def test_the_exception_type_is_bounded_at_2000_characters(size: int, valid: bool) -> None:
    if valid:
        assert read_rollout_failure(_valid(exception_type="E" * size)).exception_type == "E" * size
    else:
        with pytest.raises(ValidationError):
            read_rollout_failure(_valid(exception_type="E" * size))


def test_a_record_is_frozen() -> None:
    record = read_rollout_failure(_valid())
    with pytest.raises(ValidationError):
        record.run_id = "other"  # type: ignore[misc]


def test_the_http_clients_delivery_maps_one_to_one() -> None:
    assert [delivery_of(state) for state in ("not_sent", "unknown", "answered")] == [
        "not_sent",
        "possibly_delivered",
        "delivered",
    ]


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5) | st.none(), max_size=6))
def test_reading_any_object_raises_only_the_documented_errors(data: dict[str, Any]) -> None:
    with contextlib.suppress(ValueError):  # UnsupportedSchemaVersion and ValidationError are ValueErrors
        read_rollout_failure(data)
