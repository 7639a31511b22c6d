"""The per-attempt failure record: NeMo Gym 0.7.0's `RolloutFailure`, exactly (schema version 1).

One record describes one failed attempt of one rollout, as the collector saw it. Its fields are NeMo
Gym's (nemo_gym/rollout_outcomes.py:14, nemo_gym/episode_types.py:24), with its bounds, and no other:

- `schema_version`: 1 (a record without one is version 1, as NeMo Gym reads it);
- `episode_id`: `rollout_id` (letters, digits, `.`, `_`, `-`, starting with a letter or digit, never
  ending in NeMo Gym's reserved attempt suffix `-a<N>`) and `attempt` (0-based: 0 is the first);
- `run_id`: the collection run (kept in its manifest, so a resumed run keeps it);
- `source`: `environment` when the environment answered with the failure (an episode failure, or an
  HTTP error reply), `collector` when the collector itself failed the attempt (no reply, a reply it
  could not read, its own fault);
- `delivery`: whether the request can have reached the environment, from what the collector saw
  (`gym_failures.failures.HttpDetails.delivery`): refused before sending is `not_sent`; timed out or
  reset after sending is `possibly_delivered`; any reply is `delivered`. A failure the environment
  reported was delivered, so `source=environment` requires `delivery=delivered`;
- `failure`: the attempt's `EpisodeFailure`; `http_status` (100-599) of the reply, when there was
  one; `exception_type` (at most 2000 characters) of the error that failed the attempt.

The record is frozen and refuses unknown fields, as NeMo Gym's does. No reward is ever inferred from
a failure: the record has no reward.

Our rollouts and attempts in NeMo Gym's terms (`EpisodeId.of`, and back `EpisodeId.gym_rollout_id`,
`EpisodeId.gym_attempt`): gym-failures' rollout id `"<task>:<rollout>"` is NeMo Gym's
`"<task>-<rollout>"`, the id NeMo Gym itself derives from a row's task and rollout indices
(nemo_gym/rollout_correlation.py:41, nemo_gym/rollout_collection.py:307), so both sides name a rollout
alike; any other id NeMo Gym accepts is kept as it is, and one it refuses is refused here too. Our
1-based attempt is NeMo Gym's 0-based `attempt` plus one.

Decisions:
- We add nothing to the record: what else we know of an attempt (its 1-based attempt, its rollout's
  index, our rollout id) is in its row. A field of our own would go beside the record under its own
  row key and version, never into it: NeMo Gym forbids extra fields.
- `read_rollout_failure` reads NeMo Gym's record and the two gym-failures wrote before, migrated on
  read: "schema version 2" (nested `episode_id` with our rollout id, a 1-based `attempt` and
  `repeat`) and the earlier flat "version 1" (`rollout_id`, `attempt`, `repeat` at the top level and
  a tri-state `delivered`: `false`, `null` for "may have been", `true`), which is told from NeMo
  Gym's version 1 by its top-level `rollout_id` and no `episode_id`. `repeat` is dropped: it is the
  row's rollout index. Any other version, or a record none of them reads, is refused with a
  `ValueError` (`UnsupportedSchemaVersion`, `InvalidRolloutFailure`, or pydantic's
  `ValidationError`) naming what is wrong: a reader never guesses at a record it does not know.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gym_failures.failure_records import EpisodeFailure

__all__ = [
    "SCHEMA_VERSION",
    "Delivery",
    "EpisodeId",
    "InvalidRolloutFailure",
    "RolloutFailure",
    "UnsupportedSchemaVersion",
    "delivery_of",
    "nemo_gym_rollout_id",
    "read_rollout_failure",
]

SCHEMA_VERSION: Literal[1] = 1

Delivery = Literal["not_sent", "possibly_delivered", "delivered"]

_DELIVERY_BY_HTTP: Mapping[str, Delivery] = {
    "not_sent": "not_sent",
    "unknown": "possibly_delivered",
    "answered": "delivered",
}
_ROLLOUT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ATTEMPT_SUFFIX = re.compile(r"-a[1-9][0-9]*$")
_OURS = re.compile(r"^([0-9]+):([0-9]+)$")
_THEIRS = re.compile(r"^([0-9]+)-([0-9]+)$")


def delivery_of(http_delivery: str) -> Delivery:
    """The record's delivery state for an `HttpDetails.delivery` (`not_sent`, `unknown`, `answered`)."""
    return _DELIVERY_BY_HTTP[http_delivery]


class UnsupportedSchemaVersion(ValueError):
    """A record of a schema version this reader does not know."""


class InvalidRolloutFailure(ValueError):
    """A record of a known version whose shape no reader of that version takes."""


def nemo_gym_rollout_id(rollout_id: str) -> str:
    """`rollout_id` as NeMo Gym names it: `"<task>:<rollout>"` is `"<task>-<rollout>"`; an id NeMo Gym
    accepts is kept; any other is refused (`InvalidRolloutFailure`)."""
    ours = _OURS.match(rollout_id)
    if ours:
        return f"{ours.group(1)}-{ours.group(2)}"
    if _ROLLOUT_ID.match(rollout_id) and not _ATTEMPT_SUFFIX.search(rollout_id):
        return rollout_id
    raise InvalidRolloutFailure(f"rollout id {rollout_id!r:.80} has no NeMo Gym form")


class EpisodeId(BaseModel):
    """Which attempt of which rollout: NeMo Gym's `EpisodeId` (0-based `attempt`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    attempt: int = Field(default=0, ge=0)

    @field_validator("rollout_id")
    @classmethod
    def _reserve_attempt_suffix(cls, rollout_id: str) -> str:
        if _ATTEMPT_SUFFIX.search(rollout_id):
            raise ValueError("rollout_id must not end with the reserved attempt suffix '-a<N>'")
        return rollout_id

    @classmethod
    def of(cls, rollout_id: str, attempt: int) -> EpisodeId:
        """Our rollout id and 1-based attempt as NeMo Gym's episode id (see the module docstring)."""
        if type(attempt) is not int or attempt < 1:
            raise InvalidRolloutFailure(f"a gym-failures attempt is an integer from 1, not {attempt!r:.40}")
        return cls(rollout_id=nemo_gym_rollout_id(rollout_id), attempt=attempt - 1)

    @property
    def gym_rollout_id(self) -> str:
        """The rollout id as gym-failures names it: `"<task>-<rollout>"` is `"<task>:<rollout>"`."""
        theirs = _THEIRS.match(self.rollout_id)
        return f"{theirs.group(1)}:{theirs.group(2)}" if theirs else self.rollout_id

    @property
    def gym_attempt(self) -> int:
        """The attempt as gym-failures numbers it, from 1."""
        return self.attempt + 1


class RolloutFailure(BaseModel):
    """One failed attempt of one rollout, as the collector saw it: NeMo Gym's `RolloutFailure`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    episode_id: EpisodeId
    run_id: str = Field(min_length=1)
    source: Literal["environment", "collector"]
    delivery: Delivery
    failure: EpisodeFailure
    http_status: int | None = Field(default=None, ge=100, le=599)
    exception_type: str | None = Field(default=None, max_length=2000)

    @model_validator(mode="after")
    def _environment_failures_were_delivered(self) -> Self:
        if self.source == "environment" and self.delivery != "delivered":
            raise ValueError("a failure the environment reported was delivered (source=environment)")
        return self


def read_rollout_failure(data: object) -> RolloutFailure:
    """The record `data` holds: NeMo Gym's, or one gym-failures wrote before, migrated (see the module
    docstring). Anything else raises a `ValueError` saying why."""
    if not isinstance(data, Mapping):
        raise InvalidRolloutFailure(f"a rollout failure record is a JSON object, not {type(data).__name__}")
    version = data.get("schema_version", SCHEMA_VERSION)
    if type(version) is not int or version not in (1, 2):
        raise UnsupportedSchemaVersion(f"rollout failure schema version {version!r:.40} is not 1 or 2")
    if version == 2:
        return RolloutFailure.model_validate(_from_our_v2(data))
    if "episode_id" not in data and "rollout_id" in data:
        return RolloutFailure.model_validate(_from_our_flat_v1(data))
    return RolloutFailure.model_validate(data)


def _our_episode(rollout_id: object, attempt: object) -> dict[str, Any]:
    if not isinstance(rollout_id, str):
        raise InvalidRolloutFailure("a gym-failures record's rollout_id is a string")
    episode = EpisodeId.of(rollout_id, attempt)  # type: ignore[arg-type]  # checked there
    return episode.model_dump()


def _from_our_v2(data: Mapping[str, Any]) -> dict[str, Any]:
    """gym-failures' "version 2": NeMo Gym's fields, but our rollout id, a 1-based attempt, `repeat`."""
    record = dict(data)
    episode = record.get("episode_id")
    if not isinstance(episode, Mapping):
        raise InvalidRolloutFailure("a version-2 record's episode_id is an object")
    unknown = set(episode) - {"rollout_id", "attempt", "repeat"}
    if unknown:
        raise InvalidRolloutFailure(
            f"a version-2 episode_id has no field {sorted(map(str, unknown))[0]!r:.40}"
        )
    record["episode_id"] = _our_episode(episode.get("rollout_id"), episode.get("attempt"))
    record["schema_version"] = SCHEMA_VERSION
    return record


def _from_our_flat_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """gym-failures' flat "version 1": the episode's fields at the top level and `delivered`."""
    record = dict(data)
    rollout_id, attempt = record.pop("rollout_id"), record.pop("attempt", None)
    record.pop("repeat", None)
    if "delivered" not in record:
        raise InvalidRolloutFailure("a flat version-1 record has `delivered` (true, false or null)")
    delivered = record.pop("delivered")
    if delivered is not None and not isinstance(delivered, bool):
        raise InvalidRolloutFailure("a flat version-1 `delivered` is true, false or null")
    record["delivery"] = {False: "not_sent", None: "possibly_delivered", True: "delivered"}[delivered]
    record["episode_id"] = _our_episode(rollout_id, attempt)
    record["schema_version"] = SCHEMA_VERSION
    return record
