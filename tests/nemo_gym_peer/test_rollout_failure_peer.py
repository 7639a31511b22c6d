"""`RolloutFailure` both ways through NeMo Gym 0.7.0's own model (`peer/rollout_failure_records.py`).

Ours -> theirs: every record gym-failures writes passes NeMo Gym's `RolloutFailure.model_validate`
unchanged, and every record gym-failures wrote before passes once our reader has migrated it (NeMo
Gym refuses it as it was). Theirs -> ours: every record NeMo Gym's model writes reads with
`read_rollout_failure` as the same facts, our rollout ids and 1-based attempts included.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gym_failures.failure_records import EpisodeFailure
from gym_failures.rollout_failure import EpisodeId, RolloutFailure, read_rollout_failure
from gym_failures.rows import rollout_id
from tests.nemo_gym_peer.peer_process import run_peer

_SHAPES = [
    (
        "environment",
        "delivered",
        200,
        None,
        EpisodeFailure(
            failure_kind="agent_run_error", failure_reason="tool failed", stage="agent", terminal=True
        ),
    ),
    ("environment", "delivered", 502, None, EpisodeFailure(failure_reason="bad gateway", terminal=False)),
    (
        "collector",
        "not_sent",
        None,
        "aiohttp.ClientConnectorError",
        EpisodeFailure(failure_kind="transport_unreachable", failure_reason="refused", terminal=False),
    ),
    (
        "collector",
        "possibly_delivered",
        None,
        "E" * 2000,
        EpisodeFailure(failure_kind="transport_timeout", failure_reason="r" * 2000, terminal=False),
    ),
]


def _ours() -> list[RolloutFailure]:
    """Records as the collector writes them (`Collector._record`): every shape, first and later attempts."""
    return [
        RolloutFailure(
            episode_id=EpisodeId.of(rollout_id(task, repeat), attempt),
            run_id="b1946ac9-2c4d-4b8e-9d6e-0c3f8a7e1f22",
            source=source,
            delivery=delivery,
            failure=failure,
            http_status=status,
            exception_type=exception_type,
        )
        for source, delivery, status, exception_type, failure in _SHAPES
        for task, repeat, attempt in [(0, 0, 1), (17, 3, 2), (123456, 99, 10)]
    ]


def _old(record: RolloutFailure) -> dict[str, Any]:
    """`record` as gym-failures wrote it before this change ("schema version 2")."""
    data = record.model_dump(mode="json", exclude_none=True)
    episode = record.episode_id
    data |= {
        "schema_version": 2,
        "episode_id": {"rollout_id": episode.gym_rollout_id, "attempt": episode.gym_attempt, "repeat": 0},
    }
    return data


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rollout_failure")
    ours = [record.model_dump(mode="json", exclude_none=True) for record in _ours()]
    old = [_old(record) for record in _ours()]
    migrated = [read_rollout_failure(record).model_dump(mode="json", exclude_none=True) for record in old]
    (work / "input.json").write_text(json.dumps({"validate": ours + old + migrated}))
    result: dict[str, Any] = run_peer("rollout_failure_records", str(work / "input.json"), cwd=work)
    count = len(ours)
    return {
        "ours": list(zip(ours, result["validated"][:count], strict=True)),
        "old": result["validated"][count : 2 * count],
        "migrated": list(zip(migrated, result["validated"][2 * count :], strict=True)),
        "theirs": result["theirs"],
    }


def test_every_record_we_write_passes_nemo_gyms_model_as_it_is(peer: dict[str, Any]) -> None:
    for ours, theirs in peer["ours"]:
        assert theirs["ok"], theirs.get("error")
        assert {key: value for key, value in theirs["dump"].items() if value is not None} == ours


def test_nemo_gym_refuses_our_old_records_and_takes_them_migrated(peer: dict[str, Any]) -> None:
    assert [result["ok"] for result in peer["old"]] == [False] * len(peer["old"])
    for migrated, theirs in peer["migrated"]:
        assert theirs["ok"], theirs.get("error")
        assert {key: value for key, value in theirs["dump"].items() if value is not None} == migrated


def test_every_record_nemo_gym_writes_reads_as_the_same_facts(peer: dict[str, Any]) -> None:
    ours = {"3-1": "3:1", "task_a.7": "task_a.7", "0-0": "0:0", "12-4": "12:4"}
    assert [theirs["episode_id"]["rollout_id"] for theirs in peer["theirs"]] == list(ours)
    for theirs in peer["theirs"]:
        record = read_rollout_failure(theirs)
        assert record.model_dump(mode="json") == theirs
        episode = theirs["episode_id"]
        assert record.episode_id.gym_attempt == episode["attempt"] + 1
        assert record.episode_id.gym_rollout_id == ours[episode["rollout_id"]]
