"""The per-attempt `RolloutFailure` record, NeMo Gym's: validation, our ids in its terms, the migration of
the records gym-failures wrote before, property tests for the reader. The round trip through NeMo
Gym's own model is tests/nemo_gym_peer/test_rollout_failure_peer.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gym_failures.failure_records import EpisodeFailure
from gym_failures.rollout_failure import (
    EpisodeId,
    InvalidRolloutFailure,
    RolloutFailure,
    UnsupportedSchemaVersion,
    delivery_of,
    nemo_gym_rollout_id,
    read_rollout_failure,
)
from tests.strategies import bounded_texts, failure_kinds, failure_stages

_FAILURES = st.builds(
    EpisodeFailure,
    failure_kind=st.one_of(st.none(), failure_kinds()),
    failure_reason=bounded_texts(2000),
    stage=st.one_of(st.none(), failure_stages()),
    terminal=st.booleans(),
)
_OUR_ROLLOUT_IDS = st.builds(
    lambda task, rollout: f"{task}:{rollout}", st.integers(0, 10**6), st.integers(0, 99)
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
        episode_id=EpisodeId.of(draw(_OUR_ROLLOUT_IDS), draw(st.integers(1, 10**6))),
        run_id=draw(st.text(min_size=1, max_size=128)),
        source=source,
        delivery=delivery,
        failure=draw(_FAILURES),
        http_status=draw(st.one_of(st.none(), st.integers(100, 599))),
        exception_type=draw(st.one_of(st.none(), st.text(max_size=2000))),
    )


def _valid(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema_version": 1,
        "episode_id": {"rollout_id": "0-0", "attempt": 0},
        "run_id": "run-1",
        "source": "collector",
        "delivery": "not_sent",
        "failure": {"failure_kind": "transport_unreachable", "failure_reason": "refused", "terminal": False},
    }
    data.update(changes)
    return data


def _our_v2(record: RolloutFailure, repeat: int = 0) -> dict[str, Any]:
    """`record` as gym-failures wrote it before: version 2, our rollout id, a 1-based attempt, `repeat`."""
    data = record.model_dump(mode="json", exclude_none=True)
    data["schema_version"] = 2
    data["episode_id"] = {
        "rollout_id": record.episode_id.gym_rollout_id,
        "attempt": record.episode_id.gym_attempt,
        "repeat": repeat,
    }
    return data


def _our_flat_v1(record: RolloutFailure) -> dict[str, Any]:
    """`record` as gym-failures' first version wrote it: flat episode fields and a tri-state flag."""
    data = record.model_dump(mode="json", exclude_none=True)
    episode = data.pop("episode_id")
    delivered = {"not_sent": False, "possibly_delivered": None, "delivered": True}[data.pop("delivery")]
    return {
        **data,
        "rollout_id": EpisodeId.model_validate(episode).gym_rollout_id,
        "attempt": episode["attempt"] + 1,
        "repeat": 0,
        "delivered": delivered,
    }


@given(records())
def test_a_record_survives_json_both_ways(record: RolloutFailure) -> None:
    assert read_rollout_failure(record.model_dump(mode="json")) == record
    assert RolloutFailure.model_validate_json(record.model_dump_json()) == record


@given(records(), st.integers(0, 99))
def test_records_gym_failures_wrote_before_migrate_without_loss(record: RolloutFailure, repeat: int) -> None:
    assert read_rollout_failure(_our_v2(record, repeat)) == record
    assert read_rollout_failure(_our_flat_v1(record)) == record


@given(_OUR_ROLLOUT_IDS, st.integers(1, 10**6))
def test_our_ids_map_to_nemo_gyms_and_back(rollout_id: str, attempt: int) -> None:
    episode = EpisodeId.of(rollout_id, attempt)
    assert episode.rollout_id == rollout_id.replace(":", "-")
    assert episode.attempt == attempt - 1
    assert (episode.gym_rollout_id, episode.gym_attempt) == (rollout_id, attempt)


def test_the_mapping_is_nemo_gyms_own_derivation_and_keeps_its_ids() -> None:
    assert nemo_gym_rollout_id("12:3") == "12-3"  # NeMo Gym's f"{task}-{rollout}"
    assert nemo_gym_rollout_id("task_a.7") == "task_a.7"
    assert EpisodeId(rollout_id="task_a.7").gym_rollout_id == "task_a.7"


@pytest.mark.parametrize("rollout_id", ["", "a b", ":0", "-0", "0-a3", "x:y"])
def test_an_id_nemo_gym_refuses_is_refused(rollout_id: str) -> None:
    with pytest.raises(InvalidRolloutFailure):
        nemo_gym_rollout_id(rollout_id)


@pytest.mark.parametrize("attempt", [0, -1, True, 1.0])
def test_our_attempt_counts_from_one(attempt: object) -> None:
    with pytest.raises(InvalidRolloutFailure):
        EpisodeId.of("0:0", attempt)  # type: ignore[arg-type]


def test_a_record_without_a_version_is_version_1_as_nemo_gym_reads_it() -> None:
    data = _valid()
    del data["schema_version"]
    assert read_rollout_failure(data) == read_rollout_failure(_valid())


@pytest.mark.parametrize(
    ("delivered", "delivery"), [(False, "not_sent"), (None, "possibly_delivered"), (True, "delivered")]
)
def test_the_flat_versions_delivered_flag_becomes_the_delivery_state(
    delivered: bool | None, delivery: str
) -> None:
    v1 = {key: value for key, value in _valid().items() if key not in ("episode_id", "delivery")}
    v1.update(rollout_id="0:0", attempt=1, repeat=0, delivered=delivered)
    assert read_rollout_failure(v1).delivery == delivery


def test_a_flat_record_without_its_delivered_flag_is_refused() -> None:
    v1 = {
        "schema_version": 1,
        "rollout_id": "0:0",
        "attempt": 1,
        "repeat": 0,
        "run_id": "r",
        "source": "collector",
    }
    with pytest.raises(InvalidRolloutFailure, match="delivered"):
        read_rollout_failure(v1)


@pytest.mark.parametrize("version", [0, 3, "1", 1.0, None, True])
def test_an_unknown_schema_version_is_refused(version: object) -> None:
    with pytest.raises(UnsupportedSchemaVersion):
        read_rollout_failure(_valid(schema_version=version))


def test_a_record_that_is_no_object_is_refused() -> None:
    with pytest.raises(InvalidRolloutFailure):
        read_rollout_failure([1, 2])


@pytest.mark.parametrize(
    "changes",
    [
        {"reward": 0.0},
        {"episode_id": {"rollout_id": "0-0", "attempt": 0, "repeat": 0}},
        {"episode_id": {"rollout_id": "0-0", "attempt": -1}},
        {"episode_id": {"rollout_id": "0-a2", "attempt": 0}},
        {"episode_id": {"rollout_id": "0:0", "attempt": 0}},
        {"failure": {"failure_reason": "", "terminal": False, "extra": 1}},
    ],
)
def test_fields_nemo_gym_refuses_are_refused_not_guessed(changes: dict[str, Any]) -> None:
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


@pytest.mark.parametrize(("length", "valid"), [(2000, True), (2001, False)])
def test_the_exception_type_is_bounded(length: int, valid: bool) -> None:
    if valid:
        assert read_rollout_failure(_valid(exception_type="E" * length)).exception_type == "E" * length
    else:
        with pytest.raises(ValidationError):
            read_rollout_failure(_valid(exception_type="E" * length))


def test_delivery_follows_the_http_details() -> None:
    assert [delivery_of(d) for d in ("not_sent", "unknown", "answered")] == [
        "not_sent",
        "possibly_delivered",
        "delivered",
    ]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)
_KEYS = st.sampled_from(
    [
        "schema_version",
        "episode_id",
        "rollout_id",
        "attempt",
        "repeat",
        "delivered",
        "delivery",
        "failure",
        "run_id",
    ]
)


@st.composite
def _near_records(draw: st.DrawFn) -> Any:
    """A valid record of any version with a few of its fields replaced by arbitrary JSON."""
    record = draw(records())
    data = draw(st.sampled_from([record.model_dump(mode="json"), _our_v2(record), _our_flat_v1(record)]))
    for key in draw(st.lists(_KEYS, max_size=3)):
        if draw(st.booleans()):
            data[key] = draw(_JSON)
        else:
            data.pop(key, None)
    return data


@given(st.one_of(_JSON, _near_records()))
def test_the_reader_gives_a_record_or_a_clear_value_error_never_a_crash(data: Any) -> None:
    try:
        record = read_rollout_failure(data)
    except ValueError as error:  # UnsupportedSchemaVersion, InvalidRolloutFailure, ValidationError
        message = str(error)
        assert message  # any ValueError, with a reason: what the property is about
    else:
        assert isinstance(record, RolloutFailure)
        # What it read is NeMo Gym's record, which reads back as itself.
        assert read_rollout_failure(json.loads(record.model_dump_json())) == record
