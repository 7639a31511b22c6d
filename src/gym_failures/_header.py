"""The `X-NG-Failure-Report` header and the terminal stream event's field: encode, decode, keep unknown kinds.

Public names are re-exported by `gym_failures.failure_transport`, which documents the flow.

Decisions:
- The value is compact ASCII JSON. Besides CR and LF, DEL (0x7f) is escaped too: RFC 9110 allows only
  visible ASCII and obs-text in a field value, and h11 refuses to send a value holding DEL, so one
  stray byte in a reason would otherwise make the whole reply unsendable.
- `decode` treats a value over `MAX_BYTES` as invalid (`omitted`): no conforming peer sends one, and
  reading an unbounded value is the cost the bound exists to avoid. `decode_stream_event` applies the
  same rule to the report's compact JSON, since a stream event arrives already parsed.
- An invalid value is logged with its size and the validation error's location and type, never its
  content. A location's parts that are not the schema's own names (an event id, an unknown key) are
  logged as `*`: they come from the value.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final

import pydantic_core
from pydantic import ValidationError

from gym_failures.failure_kinds import wire_failure_kind
from gym_failures.failure_records import (
    FailureEvent,
    FailureReport,
    ModelFailureDetails,
    SandboxFailureDetails,
    SdkErrorDetails,
)

LOGGER = logging.getLogger("gym_failures.failure_transport")

OMITTED_HEADER_VALUE: Final = '{"omitted": true}'
"""The header's value for a report over `FailureHeader.MAX_BYTES`."""
_OMITTED_FIELD: Final = {"omitted": True}


def report_keeping_unknown_kinds(value: Any) -> FailureReport:
    """`value` as a `FailureReport`. An event whose kind this Gym does not register (a server pinned to
    another version) is kept under `unregistered:<kind>` instead of invalidating the whole report; any
    other invalid value still raises."""
    try:
        return FailureReport.model_validate(value)
    except ValidationError:
        rewritten = _with_kept_kinds(value)
        if rewritten is value:
            raise
    return FailureReport.model_validate(rewritten)


def _with_kept_kinds(value: Any) -> Any:
    """`value` with every unregistered plain-name kind prefixed; `value` itself when nothing changed."""
    if not isinstance(value, Mapping):
        return value
    events = value.get("events")
    if not isinstance(events, Mapping):
        return value
    changed = False
    rewritten: dict[Any, Any] = {}
    for key, event in events.items():
        kind = event.get("failure_kind") if isinstance(event, Mapping) else None
        if isinstance(kind, str):
            try:
                kept = wire_failure_kind(kind)
            except ValueError:
                kept = kind  # not a name at all: let validation refuse it
            if kept != kind:
                event = {**event, "failure_kind": kept}
                changed = True
        rewritten[key] = event
    return {**value, "events": rewritten} if changed else value


# A location names fields, but also the value's own keys (an event id, an unknown field's name),
# which are content: only the schema's own names are logged.
_SCHEMA_NAMES: Final = frozenset(
    name
    for model in (
        FailureReport,
        FailureEvent,
        ModelFailureDetails,
        SandboxFailureDetails,
        SdkErrorDetails,
    )
    for name in (model.__name__, *model.model_fields)
)


def _schema_location(loc: tuple[int | str, ...], names: frozenset[str]) -> str:
    return ".".join(part if isinstance(part, str) and part in names else "*" for part in loc)


def _with_event_ids(data: Any) -> Any:
    """Freshly parsed `data` with each event's id restored from its key, in place (see
    `FailureReport._restore_event_ids`, which then has nothing left to copy)."""
    if isinstance(data, dict):
        events = data.get("events")
        if isinstance(events, dict):
            for key, event in events.items():
                if isinstance(event, dict) and "event_id" not in event:
                    event["event_id"] = key
    return data


def log_invalid_report(
    where: str, size: int, error: Exception, names: frozenset[str] = _SCHEMA_NAMES
) -> None:
    if isinstance(error, ValidationError) and error.error_count():
        first = error.errors(include_input=False, include_url=False)[0]
        location = _schema_location(first["loc"], names)
        count = error.error_count()
        what = f"{count} error{'' if count == 1 else 's'}, first {first['type']} at {location!r}"
    else:
        what = type(error).__name__
    LOGGER.warning("invalid failure report in %s (%d bytes): %s; reported as omitted", where, size, what)


def _is_empty(report: FailureReport) -> bool:
    return not report.events and not report.omitted


def _header_value(headers: Mapping[str, str], name: str) -> object:
    value = headers.get(name)
    if value is None:
        # aiohttp's, httpx's and Starlette's header mappings ignore case; a plain dict or any other
        # Mapping may not (`dict()` of an httpx or uvicorn reply holds lower-case names).
        lowered = name.lower()
        value = headers.get(lowered)
        if value is None:
            for key, item in headers.items():
                if isinstance(key, str) and key.lower() == lowered:
                    return item
    return value


def _utf8_size(value: str) -> int:
    """The bytes `value` was sent as (a surrogate escape is the byte it stands for); a lone surrogate
    that is no escape of a byte counts as the 3 bytes UTF-8 would need for it."""
    try:
        return len(value.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return len(value.encode("utf-8", "surrogatepass"))


class FailureHeader:
    """Encode a `FailureReport` into one reply header and decode it on the other side.

    aiohttp's client rejects a reply whose header line (name and value) is over 8190 bytes, and the
    caller then sees an unreadable error instead of the real status and body. A report whose JSON is
    over `MAX_BYTES` is therefore not sent: the header says `{"omitted": true}`, and every hop above
    keeps that flag.
    """

    MAX_BYTES: int = 4096
    NAME: str = "X-NG-Failure-Report"
    STREAM_FIELD: str = "nemo_gym_failure_report"

    @classmethod
    def _json(cls, report: FailureReport) -> str:
        """`report` as one line of ASCII JSON, or the omitted marker when over `MAX_BYTES`."""
        data = report.__pydantic_serializer__.to_json(report)
        if len(data) > cls.MAX_BYTES:
            return OMITTED_HEADER_VALUE
        if data.isascii() and b"\x7f" not in data:
            return data.decode("ascii")
        # JSON escapes control characters but not DEL, and pydantic writes raw UTF-8; escaping can
        # only grow the text, so the bound is checked again.
        text = json.dumps(
            json.loads(data), ensure_ascii=True, separators=(",", ":"), allow_nan=False
        ).replace("\x7f", "\\u007f")
        return text if len(text) <= cls.MAX_BYTES else OMITTED_HEADER_VALUE

    @classmethod
    def encode(cls, report: FailureReport) -> dict[str, str]:
        """The reply headers for `report`; none when it holds nothing."""
        if _is_empty(report):
            return {}
        return {cls.NAME: cls._json(report)}

    @classmethod
    def decode(cls, headers: Mapping[str, str] | None) -> FailureReport | None:
        """The report in `headers`; `None` without one. An invalid value is reported as omitted."""
        if headers is None:
            return None
        try:
            value = _header_value(headers, cls.NAME)
        except Exception as error:  # a hostile Mapping; reading must never raise
            log_invalid_report("a reply header", 0, error)
            return FailureReport(omitted=True)
        if value is None:
            return None
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if (
            not isinstance(value, str)
            or len(value) > cls.MAX_BYTES
            # aiohttp hands undecodable bytes over as surrogate escapes: count them as the bytes they were.
            or (not value.isascii() and _utf8_size(value) > cls.MAX_BYTES)
        ):
            size = len(value) if isinstance(value, str) else 0
            log_invalid_report("a reply header", size, ValueError("not a bounded string"))
            return FailureReport(omitted=True)
        return cls._decode_json(value, "a reply header")

    @classmethod
    def _decode_json(cls, value: str | bytes, where: str) -> FailureReport:
        try:
            # `FailureReport` restores event ids in a before-validator, so pydantic turns JSON into
            # Python objects before validating either way. Parsing here lets the ids be restored in
            # place, in objects nobody else holds, and the unknown-kind retry reuse the parse.
            data = _with_event_ids(pydantic_core.from_json(value))
            return report_keeping_unknown_kinds(data)
        except (ValidationError, ValueError, TypeError, RecursionError) as error:
            log_invalid_report(where, len(value), error)
            return FailureReport(omitted=True)

    @classmethod
    def stream_value(cls, report: FailureReport) -> dict[str, Any] | None:
        """The `STREAM_FIELD` value for `report`; `None` when it holds nothing."""
        if _is_empty(report):
            return None
        if len(report.__pydantic_serializer__.to_json(report)) > cls.MAX_BYTES:
            return dict(_OMITTED_FIELD)
        value: dict[str, Any] = report.model_dump(mode="json")
        return value

    @classmethod
    def decode_stream_event(cls, payload: Mapping[str, Any] | None) -> FailureReport | None:
        """The report a terminal stream event carries; `None` without one. An invalid value is
        reported as omitted."""
        if not isinstance(payload, Mapping):
            return None
        try:
            value = payload.get(cls.STREAM_FIELD)
        except Exception as error:  # a hostile Mapping; reading must never raise
            log_invalid_report("a stream event", 0, error)
            return FailureReport(omitted=True)
        if value is None:
            return None
        try:
            report = report_keeping_unknown_kinds(value)
            size = len(report.__pydantic_serializer__.to_json(report))
            if size > cls.MAX_BYTES:
                # The same rule as the header: `stream_value` never sends a report this large.
                raise ValueError("a report over MAX_BYTES")
            return report
        except (ValidationError, ValueError, RecursionError) as error:
            log_invalid_report("a stream event", 0, error)
            return FailureReport(omitted=True)
