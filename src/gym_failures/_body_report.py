"""A failure report in a failure reply's body: for a reader that keeps the body and drops the headers.

NeMo Gym's collector keeps a failed `/run` reply's body (`_ng_failure_response_body`, its first 2000
characters) and none of its headers, so the report in `X-NG-Failure-Report` never reaches its rows.
A NeMo Gym server that `gym_failures.nemo_gym_server.instrument` instruments adds the report it sends
in that header to its failure reply's JSON body too, as the field `failure_report`
(`with_body_report`); `body_report` reads it back out of such a body, through the layers of quoting
NeMo Gym's own servers add around a body they pass on (`gym_failures.reporting._roots` describes
them), and `gym-failures explain` shows the chain it holds.

The field, compact ASCII JSON appended as the body object's last field::

    "failure_report": {"failure_id": "<id>", "events": [{"failure_kind": ..., "event_id": ...,
        "boundary": ..., "cause_id": ..., "http_status": ..., "stage": ..., "failure_reason": ...}],
        "omitted": true}

Decisions:
- The events are a list, not the header's map, in a fixed order: the events no chain names first,
  then the reply's failure and its causes, top down, so the root cause is the body's last event. Each
  event starts with `failure_kind`, `event_id` and `boundary`. So the body's root reads the same by
  `gym_failures.reporting._roots.body_root` (the last `failure_kind` at the deepest quoting, its
  `event_id` and `boundary` after it) and by the summary's SQL twin, neither changed: both find the
  root event of the chain without parsing the report.
- Only what a chain needs is kept (kind, id, boundary, cause, status, stage and a reason cut to
  `MAX_REASON` characters): NeMo Gym keeps 2000 characters of the whole body, quoting included. The
  field is fitted to `MAX_FIELD_CHARS`: reasons go first, then the events no chain names, then the
  chain's events just above its root (the top and the root stay); whatever went marks it `omitted`.
  A cause left pointing at a dropped event is unlinked.
- The report is the one the reply's header carries, scrubbed and fitted already: the body holds
  nothing the header did not.
- Reading is bounded (the first `MAX_TEXT` characters, at most `MAX_LAYERS` layers of quoting peeled)
  and never raises: a body cut inside an event keeps the events before it, marked `omitted`; an event
  that does not validate ends the list the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from pydantic import ValidationError

from gym_failures.failure_kinds import wire_failure_kind
from gym_failures.failure_records import FailureEvent, FailureReport

__all__ = [
    "FIELD",
    "MAX_FIELD_CHARS",
    "MAX_LAYERS",
    "MAX_REASON",
    "MAX_TEXT",
    "body_report",
    "with_body_report",
]

FIELD: Final = "failure_report"
MAX_FIELD_CHARS: Final = 1400
"""The most characters the field's JSON takes: most of what NeMo Gym keeps of a body."""
MAX_REASON: Final = 160
MAX_TEXT: Final = 16384
"""The most characters of a text `body_report` reads."""
MAX_LAYERS: Final = 8
_MAX_BODY = 65536
_EVENT_FIELDS = ("failure_kind", "event_id", "boundary", "cause_id", "http_status", "stage", "failure_reason")
_KEY = re.compile(r'(\\*)"' + FIELD + r'\\*"')
_FAILURE_ID = re.compile(r'"failure_id"[\t\n\r ]*:[\t\n\r ]*"([A-Za-z0-9_.:-]{1,128})"')
_EVENTS = re.compile(r'"events"[\t\n\r ]*:[\t\n\r ]*\[')
_JSON_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_REPR_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t"}


def _chain(report: FailureReport) -> list[str]:
    """The reply's failure and its causes, top down (each once)."""
    chain: list[str] = []
    current = report.failure_id
    while current is not None and current in report.events and current not in chain:
        chain.append(current)
        current = report.events[current].cause_id
    return chain


def _event(event: FailureEvent, reasons: bool) -> dict[str, Any]:
    data = event.model_dump(mode="json", include=set(_EVENT_FIELDS))
    shown: dict[str, Any] = {}
    for name in _EVENT_FIELDS:
        value = data.get(name)
        if name == "failure_reason" and (not reasons or not value):
            continue
        if value is not None:
            shown[name] = value[:MAX_REASON] if name == "failure_reason" else value
    return shown


def _field(report: FailureReport, order: list[str], reasons: bool, omitted: bool) -> str:
    kept = set(order)
    events = []
    for event_id in order:
        event = _event(report.events[event_id], reasons)
        if event.get("cause_id") is not None and event["cause_id"] not in kept:
            del event["cause_id"]
        events.append(event)
    field: dict[str, Any] = {"failure_id": report.failure_id, "events": events}
    if omitted:
        field["omitted"] = True
    return json.dumps(field, ensure_ascii=True, separators=(",", ":"))


def encode(report: FailureReport) -> str | None:
    """`report` as the body field's JSON, fitted to `MAX_FIELD_CHARS` (see the module's docstring);
    None for a report with no failure of its own."""
    chain = _chain(report)
    if not chain:
        return None
    others = [event_id for event_id in report.events if event_id not in chain]
    omitted = report.omitted
    text = _field(report, others + chain, True, omitted)
    if len(text) <= MAX_FIELD_CHARS:
        return text
    if others:
        omitted = True
    text = _field(report, others + chain, False, omitted)
    while len(text) > MAX_FIELD_CHARS and others:
        others.pop()
        text = _field(report, others + chain, False, omitted)
    while len(text) > MAX_FIELD_CHARS and len(chain) > 2:
        del chain[-2]
        omitted = True
        text = _field(report, chain, False, omitted)
    return text if len(text) <= MAX_FIELD_CHARS else None


def with_body_report(body: bytes, report: FailureReport) -> bytes | None:
    """`body` (a JSON object) with `report` appended as its last field, or None when the body is no
    JSON object, already has the field, is larger than 64 KiB, or the report has no failure."""
    if len(body) > _MAX_BODY:
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict) or FIELD in parsed:
        return None
    field = encode(report)
    if field is None:
        return None
    stripped = body.rstrip()
    separator = b", " if parsed else b""
    return stripped[:-1] + separator + b'"' + FIELD.encode() + b'": ' + field.encode("ascii") + b"}"


def _unescape(text: str, escapes: Mapping[str, str]) -> str:
    """`text` with one layer of backslash escapes undone, as far as it goes: JSON's (`\\uXXXX`) or a
    Python bytes repr's (`\\xNN`); an escape this does not know is kept as it is."""
    out: list[str] = []
    index, length = 0, len(text)
    while index < length:
        char = text[index]
        if char != "\\" or index + 1 >= length:
            out.append(char)
            index += 1
            continue
        following = text[index + 1]
        width = 4 if following == "u" and escapes is _JSON_ESCAPES else 2 if following == "x" else 0
        if width:
            digits = text[index + 2 : index + 2 + width]
            if len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits):
                out.append(chr(int(digits, 16)))
                index += 2 + width
                continue
        if following in escapes:
            out.append(escapes[following])
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)


def _peeled(text: str) -> Iterator[str]:
    """`text`, then `text` with one more NeMo Gym layer of quoting undone (a JSON string holding a
    bytes repr), up to `MAX_LAYERS` layers."""
    for _ in range(MAX_LAYERS + 1):
        yield text
        peeled = _unescape(_unescape(text, _JSON_ESCAPES), _REPR_ESCAPES)
        if peeled == text:
            return
        text = peeled


def body_report(text: object) -> FailureReport | None:
    """The report a failure reply's body carries in its `failure_report` field (see the module's
    docstring), read through NeMo Gym's quoting: the outermost such field, the one with the most
    hops under it. None when `text` holds none. Bounded, and never raises."""
    if not isinstance(text, str) or FIELD not in text:
        return None
    text = text[:MAX_TEXT]
    for layer in _peeled(text):
        field = next((match for match in _KEY.finditer(layer) if not match.group(1)), None)
        if field is not None:
            return _read_field(layer[field.end() :])
    return None


def _read_field(text: str) -> FailureReport | None:
    failure_id = _FAILURE_ID.search(text)
    events_start = _EVENTS.search(text)
    if failure_id is None or events_start is None:
        return None
    decoder = json.JSONDecoder()
    events: dict[str, FailureEvent] = {}
    omitted = False
    index = events_start.end()
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        if index < len(text) and text[index] == "]":
            break
        try:
            value, index = decoder.raw_decode(text, index)
            event = FailureEvent.model_validate(_kept_kind(value))
        except (ValueError, RecursionError, ValidationError):
            omitted = True  # cut by NeMo Gym's bound, or not an event: read as far as it goes
            break
        events.setdefault(event.event_id, event)
    omitted = (
        omitted
        or re.match(r'[\]\t\r\n ]*,?[\t\r\n ]*"omitted"[\t\r\n ]*:[\t\r\n ]*true', text[index:]) is not None
    )
    return _report(events, failure_id.group(1), omitted)


def _kept_kind(value: object) -> object:
    """An event whose kind this version does not register, kept as `unregistered:<kind>` (as the
    header's reader keeps it); anything else as it is."""
    kind = value.get("failure_kind") if isinstance(value, dict) else None
    if not isinstance(value, dict) or not isinstance(kind, str):
        return value
    try:
        return {**value, "failure_kind": wire_failure_kind(kind)}
    except ValueError:
        return value


def _report(events: dict[str, FailureEvent], failure_id: str, omitted: bool) -> FailureReport | None:
    if failure_id not in events:
        return None
    unlinked = {
        event_id: event.model_copy(update={"cause_id": None})
        if event.cause_id is not None and event.cause_id not in events
        else event
        for event_id, event in events.items()
    }
    try:
        return FailureReport(events=unlinked, failure_id=failure_id, omitted=omitted)
    except ValidationError:
        return None
