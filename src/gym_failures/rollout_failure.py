"""The per-attempt failure record, compatible with NeMo Gym's `RolloutFailure` (schema version 2).

One record describes one failed attempt of one rollout, as the collector saw it:

- `episode_id`: `rollout_id` (`"<task>:<rollout>"`), `attempt` (1-based, as gym-failures numbers
  attempts; NeMo Gym's `_ng_attempt_index` is `attempt - 1`) and `repeat` (the rollout's index among
  its task's repeats);
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

The record is frozen and refuses unknown fields. `read_rollout_failure` reads either version and
refuses any other: a reader never guesses at a record it does not know. No reward is ever inferred
from a failure: the record has no reward.

Version 1 (gym-failures' reconstruction; NeMo Gym's own version-1 code was not available): the episode
id's fields flat at the top level (`rollout_id`, `attempt`, `repeat`) and a tri-state `delivered`
(`false`, `null` for "may have been", `true`) in place of `delivery`. The mapping is one to one, so a
record migrates to version 2 (`migrate_v1`) and back (`to_v1`) without loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_failures.failure_records import EpisodeFailure

__all__ = [
    "SCHEMA_VERSION",
    "Delivery",
    "EpisodeId",
    "RolloutFailure",
    "UnsupportedSchemaVersion",
    "delivery_of",
    "migrate_v1",
    "read_rollout_failure",
    "to_v1",
]

SCHEMA_VERSION: Literal[2] = 2

Delivery = Literal["not_sent", "possibly_delivered", "delivered"]

_DELIVERY_BY_HTTP: Mapping[str, Delivery] = {
    "not_sent": "not_sent",
    "unknown": "possibly_delivered",
    "answered": "delivered",
}
_V1_DELIVERED: Mapping[Delivery, bool | None] = {
    "not_sent": False,
    "possibly_delivered": None,
    "delivered": True,
}


def delivery_of(http_delivery: str) -> Delivery:
    """The record's delivery state for an `HttpDetails.delivery` (`not_sent`, `unknown`, `answered`)."""
    return _DELIVERY_BY_HTTP[http_delivery]


class UnsupportedSchemaVersion(ValueError):
    """A record of a schema version this reader does not know."""


class EpisodeId(BaseModel):
    """Which attempt of which rollout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str = Field(min_length=1, max_length=128)
    attempt: int = Field(ge=1)
    repeat: int = Field(ge=0)


class RolloutFailure(BaseModel):
    """One failed attempt of one rollout, as the collector saw it (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[2] = SCHEMA_VERSION
    episode_id: EpisodeId
    run_id: str = Field(min_length=1, max_length=128)
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


def migrate_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version-1 record's fields as version 2 (validate with `RolloutFailure.model_validate`)."""
    record = dict(data)
    if record.pop("schema_version", None) != 1:
        raise UnsupportedSchemaVersion("migrate_v1 takes a version-1 record")
    episode = {key: record.pop(key) for key in ("rollout_id", "attempt", "repeat") if key in record}
    if "delivered" not in record:
        raise ValueError("a version-1 record has `delivered` (true, false or null)")
    delivered = record.pop("delivered")
    if delivered is not None and not isinstance(delivered, bool):
        raise ValueError("a version-1 `delivered` is true, false or null")
    delivery = {False: "not_sent", None: "possibly_delivered", True: "delivered"}[delivered]
    return {"schema_version": SCHEMA_VERSION, "episode_id": episode, "delivery": delivery, **record}


def to_v1(record: RolloutFailure) -> dict[str, Any]:
    """`record` as a version-1 record, for a reader that knows only version 1."""
    data = record.model_dump(mode="json", exclude_none=True)
    data.pop("schema_version")
    episode = data.pop("episode_id")
    delivery: Delivery = data.pop("delivery")
    return {"schema_version": 1, **episode, "delivered": _V1_DELIVERED[delivery], **data}


def read_rollout_failure(data: object) -> RolloutFailure:
    """The record `data` holds, version 1 migrated; `UnsupportedSchemaVersion` for any other version,
    `pydantic.ValidationError` for unknown fields or invalid values."""
    if not isinstance(data, Mapping):
        raise UnsupportedSchemaVersion("a rollout failure record is a JSON object")
    version = data.get("schema_version")
    if version == 1 and type(version) is int:
        return RolloutFailure.model_validate(migrate_v1(data))
    if version == SCHEMA_VERSION and type(version) is int:
        return RolloutFailure.model_validate(data)
    raise UnsupportedSchemaVersion(f"rollout failure schema version {version!r:.40} is not 1 or 2")
