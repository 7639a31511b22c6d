"""What a failure records: the events Gym servers observe, the report forwarding them, the episode failure.

Failure kinds live in `gym_failures.failure_kinds`; `gym_failures.failure_transport` carries reports
over HTTP (API reference: ``spec/failure_records.md``).

Wire form: a `FailureReport` serializes its events keyed by event id and leaves `event_id` out of each
event, because the key carries it (a 4096-byte header has no room for every id twice);
`_restore_event_ids` puts it back on the way in, and an event that does carry an id must carry its key.
Every model drops fields that are `None` when serialized, so the wire form stays small and a
`model_validate_json(model_dump_json())` round trip is exact.

Inside a server request, no record carries the request's own credentials out, whoever serializes it
(`gym_failures._request_context`): every free text (`EpisodeFailure.failure_reason`, a
`FailureEvent`'s reason and operation, `SdkErrorDetails.message`,
`SandboxFailureDetails.provider_status_reason`) is scrubbed of them, and of the registered secrets,
when the record is serialized; the envelope and details records an app writes by hand are scrubbed
when they are made too, so their attributes are safe to log. A `FailureEvent`, which a server decodes
from every header it reads, is scrubbed when it leaves, not when it is made (a failure raised in the
request, `NgFailureEvent`, is scrubbed where it is made). Outside a request, with nothing registered,
a record is data and stays as it was.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    SkipValidation,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from gym_failures._request_context import known_values_removed, scrub_in_request, secrets_to_scrub
from gym_failures.failure_kinds import FailureStage, require_failure_kind, validate_failure_kind

_MAX_REASON = 2000
_MAX_ID = 128
_MAX_NAME = 256


def _without_none(data: Any) -> Any:
    if isinstance(data, dict):
        return {key: value for key, value in data.items() if value is not None}
    return data


def _scrubbed(data: Any, texts: tuple[tuple[str, int], ...]) -> Any:
    """`data` (a record's serialized fields) with each of its free `texts` (`(key, bound)`) scrubbed of
    the current request's credentials and the registered secrets (`scrub_in_request`)."""
    if not isinstance(data, dict):
        return data
    found = secrets_to_scrub()
    if found is None:
        return data
    for key, bound in texts:
        value = data.get(key)
        if isinstance(value, str):
            data[key] = known_values_removed(value, found[0], bound)
    return data


class FailureBoundary(enum.Enum):
    """The places a failure is observed, as the failure-boundaries RFC names them.

    Each one reports what it observed; none of them chooses retries, terminality or scores.
    """

    AGENT = "agent"
    COLLECTION = "collection"
    ENVIRONMENT = "environment"
    HARNESS = "harness"
    MODEL = "model"
    RESOURCES_SERVER = "resources_server"
    SANDBOX = "sandbox"

    def __str__(self) -> str:
        # Printed as its value ("agent"), as a log line or an f-string wants it.
        return str(self.value)


class SdkErrorDetails(BaseModel):
    """Diagnostics an adapter selected from a third-party SDK error before it raised its own failure.

    The adapter chooses the message (for example the SDK's `message` field), because `str()` of an SDK
    error can contain request data. The SDK object, its request and its response body are never stored.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    exception_type: str = Field(min_length=1, max_length=_MAX_NAME)
    http_status: int | None = Field(default=None, ge=100, le=599)
    message: str = Field(max_length=_MAX_REASON)

    @field_validator("message")
    @classmethod
    def _scrub_message(cls, value: str) -> str:
        return scrub_in_request(value, _MAX_REASON)

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _scrubbed(_without_none(handler(self)), (("message", _MAX_REASON),))


class ModelFailureDetails(BaseModel):
    """Observed model-request facts, independent of retry or scoring policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider_request_id: str | None = Field(default=None, max_length=_MAX_NAME)
    request_upload_complete: bool | None = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_none(handler(self))


class SandboxFailureDetails(BaseModel):
    """Observed sandbox facts; missing evidence stays absent, with no inferred cause or policy.

    A last execution ID does not establish causation. Preserve provider reason codes as reported;
    use only reported command exit codes, not synthesized fallback codes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    execution_id: str | None = Field(default=None, max_length=_MAX_NAME)
    exit_code: int | None = None
    provider: str | None = Field(default=None, max_length=_MAX_NAME)
    provider_status_reason: str | None = Field(default=None, max_length=_MAX_REASON)
    sandbox_id: str | None = Field(default=None, max_length=_MAX_NAME)

    @field_validator("provider_status_reason")
    @classmethod
    def _scrub_reason(cls, value: str | None) -> str | None:
        return None if value is None else scrub_in_request(value, _MAX_REASON)

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _scrubbed(_without_none(handler(self)), (("provider_status_reason", _MAX_REASON),))


FailureDetails = SandboxFailureDetails | ModelFailureDetails

_DETAILS_BY_BOUNDARY: dict[FailureBoundary, type[SandboxFailureDetails] | type[ModelFailureDetails]]
_DETAILS_BY_BOUNDARY = {
    FailureBoundary.SANDBOX: SandboxFailureDetails,
    FailureBoundary.MODEL: ModelFailureDetails,
}


class FailureEvent(BaseModel):
    """One observed failure: who observed it, what failed, and which failure caused it.

    This is the validated wire projection of a `NgFailureEvent`, whose fields and origin identity live
    on the exception itself. `cause_id` names another Gym failure in the same map. Foreign SDK facts
    live in `foreign_error`; they are not boundary-less Gym events. `details` uses the schema selected
    by `boundary`; common facts stay on this event, without a second copy in details.

    Readers count each failure once by `event_id`. Outcome policy stays with
    `EpisodeFailure.terminal` and the collector's existing rules.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: str = Field(min_length=1, max_length=_MAX_ID)
    boundary: FailureBoundary
    failure_kind: str
    failure_reason: str = Field(default="", max_length=_MAX_REASON)
    stage: FailureStage | None = None
    cause_id: str | None = Field(default=None, max_length=_MAX_ID)
    http_status: int | None = Field(default=None, ge=100, le=599)
    operation: str | None = Field(default=None, max_length=_MAX_NAME)
    operation_id: str | None = Field(default=None, max_length=_MAX_ID)
    attempt_id: str | None = Field(default=None, max_length=_MAX_ID)
    # This validator chooses the schema by boundary and validates with it; the union's own
    # validation would only repeat an instance check on the result (about a tenth of the cost of
    # decoding a header), so it is skipped. Serialization and the JSON schema still use the union.
    details: SkipValidation[FailureDetails | None] = None
    foreign_error: SdkErrorDetails | None = None
    exception_type: str | None = Field(default=None, max_length=_MAX_NAME)

    TEXT_FIELDS: ClassVar[tuple[tuple[str, str | None, int], ...]] = (
        ("failure_reason", None, _MAX_REASON),
        ("operation", None, _MAX_NAME),
        ("foreign_error", "message", _MAX_REASON),
        ("details", "provider_status_reason", _MAX_REASON),
    )
    """The free-text fields, which may quote what a producer saw (a request, a provider's message):
    `(field, subfield or None, bound)`. Everything that makes a text safe to send goes over these."""

    def with_texts(self, change: Callable[[str, int], str]) -> FailureEvent:
        """This event with `change(text, bound)` applied to each free-text field (`TEXT_FIELDS`);
        the event itself when nothing changed. `change` must keep each text within its bound."""
        update: dict[str, Any] = {}
        for name, subfield, bound in self.TEXT_FIELDS:
            value = getattr(self, name)
            holder = value
            if subfield is not None:
                value = getattr(holder, subfield, None)
            if not isinstance(value, str):
                continue
            changed = change(value, bound)
            if changed == value:
                continue
            update[name] = changed if subfield is None else holder.model_copy(update={subfield: changed})
        return self.model_copy(update=update) if update else self

    @field_validator("failure_kind")
    @classmethod
    def _validate_failure_kind(cls, value: str) -> str:
        return require_failure_kind(value)

    @field_validator("details", mode="before")
    @classmethod
    def _validate_details(cls, value: object, info: ValidationInfo) -> FailureDetails | None:
        if value is None:
            return None
        boundary = info.data.get("boundary")
        if boundary is None:
            raise ValueError("details need a valid boundary to choose their schema")
        schema = _DETAILS_BY_BOUNDARY.get(boundary)
        if schema is None:
            raise ValueError(f"the {boundary.value} boundary has no details schema")
        # A model's isinstance goes through ABCMeta; decoded details are always a plain dict.
        if type(value) is not dict:
            if isinstance(value, schema):
                return value
            if isinstance(value, BaseModel):
                raise ValueError(f"{boundary.value} details must be {schema.__name__}")
        details: FailureDetails = schema.__pydantic_validator__.validate_python(value)
        return details

    @model_serializer(mode="wrap")
    def _serialize_event(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _scrubbed(_without_none(handler(self)), _EVENT_TEXTS)


_EVENT_TEXTS = (("failure_reason", _MAX_REASON), ("operation", _MAX_NAME))


def validate_failure_event_map(events: Mapping[str, FailureEvent]) -> Mapping[str, FailureEvent]:
    """Check that `events` is keyed by event id and that every `cause_id` resolves in it without a cycle."""
    for key, event in events.items():
        if key != event.event_id:
            raise ValueError(f"event {event.event_id!r} is keyed as {key!r}")
        if event.cause_id is not None and event.cause_id not in events:
            raise ValueError(f"event {key!r} names cause {event.cause_id!r}, which is not in the report")
    # Each event has at most one cause, so the map is a set of chains: walk each chain once,
    # remembering the events already known to end without a cycle.
    acyclic: set[str] = set()
    for start in events:
        path: set[str] = set()
        current: str | None = start
        while current is not None and current not in acyclic:
            if current in path:
                raise ValueError(f"the causes of event {start!r} form a cycle")
            path.add(current)
            current = events[current].cause_id
        acyclic |= path
    return events


class FailureReport(BaseModel):
    """The failures one reply forwards: its own failure (`failure_id`, absent on success) and every
    failure observed while serving the request, each with its explicit causes.

    `omitted` says that a report on the way here was too large to send, so events are missing.
    `gym_failures.failure_transport` carries it in one HTTP header; Collection saves it beside the
    outcome.
    """

    model_config = ConfigDict(extra="forbid")

    events: dict[str, FailureEvent] = Field(default_factory=dict)
    failure_id: str | None = Field(default=None, max_length=_MAX_ID)
    omitted: bool = False

    @model_validator(mode="before")
    @classmethod
    def _restore_event_ids(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        events = value.get("events")
        if not isinstance(events, Mapping):
            return value
        restored: dict[Any, Any] = {}
        for key, event in events.items():
            if isinstance(event, Mapping) and "event_id" not in event:
                event = {"event_id": key, **event}
            restored[key] = event
        return {**value, "events": restored}

    @field_validator("events")
    @classmethod
    def _validate_events(cls, value: dict[str, FailureEvent]) -> dict[str, FailureEvent]:
        validate_failure_event_map(value)
        return value

    @model_validator(mode="after")
    def _failure_id_is_an_event(self) -> Self:
        if self.failure_id is not None and self.failure_id not in self.events:
            raise ValueError(f"failure_id {self.failure_id!r} names no event of the report")
        return self

    @model_serializer(mode="wrap")
    def _serialize_report(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            events = data.get("events")
            if isinstance(events, dict):
                # The key carries the id; see the module docstring.
                for event in events.values():
                    if isinstance(event, dict):
                        event.pop("event_id", None)
            data = _without_none(data)
            if data.get("omitted") is False:
                del data["omitted"]
        return data

    def merged(self, other: FailureReport) -> FailureReport:
        """This report with `other`'s events added; `failure_id` stays this report's.

        An event id names one immutable record, so the first copy of an id is kept. `omitted` is
        kept if either side had it.
        """
        if not other.events and (self.omitted or not other.omitted):
            return self
        events = dict(self.events)
        for event_id, event in other.events.items():
            events.setdefault(event_id, event)
        # Both maps are valid and each kept event's chain stays inside the map it came from, so the
        # union is valid too: no second validation on this hot path.
        return FailureReport.model_construct(
            events=events, failure_id=self.failure_id, omitted=self.omitted or other.omitted
        )


class EpisodeFailure(BaseModel):
    """Describe a failure using the same fields on the wire and in saved records.

    An environment server returns this envelope for one failed episode attempt. Collection uses its
    existing `terminal` flag and retry budget; `failure_kind` describes the failure without deciding
    terminality. Kind and stage are optional because a collector observing a lost reply may not know
    them, and are left out of the serialized form when absent.

    The attempt's `FailureReport` travels beside this envelope (`BaseEpisodeResponse.failure_report`),
    so records that nest `EpisodeFailure` keep their saved format. Its kind is checked with the
    migration validator (`validate_failure_kind`): a legacy label is kept and warned about, not refused.
    """

    model_config = ConfigDict(extra="forbid")

    failure_kind: str | None = None
    failure_reason: str = Field(max_length=_MAX_REASON)
    stage: FailureStage | None = None
    terminal: bool

    @field_validator("failure_kind")
    @classmethod
    def _validate_failure_kind(cls, value: str | None) -> str | None:
        return validate_failure_kind(value)

    @field_validator("failure_reason")
    @classmethod
    def _scrub_reason(cls, value: str) -> str:
        return scrub_in_request(value, _MAX_REASON)

    @model_serializer(mode="wrap")
    def _serialize_failure(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _scrubbed(_without_none(handler(self)), (("failure_reason", _MAX_REASON),))


class BaseEpisodeResponse(BaseModel):
    """What an environment (agent) server replies for one episode attempt: exactly one of `result` or
    `failure`, and the attempt's `failure_report` beside it.

    `result` is the outcome of an episode that ran to a verdict (its reward, the policy's response,
    the verification); `failure` is the `EpisodeFailure` of one that did not. An infrastructure failure
    is a `failure`, never a `result` with reward 0. `failure_report` carries what was observed on the
    way, for a success too (recovered retries), so records that nest `EpisodeFailure` keep their format.
    """

    model_config = ConfigDict(extra="forbid")

    result: dict[str, Any] | None = None
    failure: EpisodeFailure | None = None
    failure_report: FailureReport | None = None

    @model_validator(mode="after")
    def _exactly_one_outcome(self) -> Self:
        if (self.result is None) == (self.failure is None):
            raise ValueError("an episode response has exactly one of result or failure")
        return self

    @model_serializer(mode="wrap")
    def _serialize_response(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_none(handler(self))


def merged_taking_failure_id(report: FailureReport, other: FailureReport) -> FailureReport:
    """`report.merged(other)`, but a `report` without a failure takes `other`'s `failure_id`.

    For readers that gather several reports of one outcome (a stream's terminal events, a row and
    the reports merged into it): the first failure named wins. `other`'s failure event is in the
    merged events, so the result stays valid without a second validation.
    """
    merged = report.merged(other)
    if merged.failure_id is None and other.failure_id is not None:
        merged = FailureReport.model_construct(
            events=merged.events, failure_id=other.failure_id, omitted=merged.omitted
        )
    return merged
