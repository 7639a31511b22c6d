"""A failure's root cause: its report's deepest cause, or the innermost error body NeMo Gym kept.

The deepest event of a report's cause chain, or, for a NeMo Gym row without a report, the innermost
gym-failures error body in the text it keeps. Public functions (the module is private so that it
needs no reference page; they are what the summary's Python twin and the gate call, and none of
them loads DuckDB or pydantic):

- `root_event(report)`: of a validated `FailureReport`, the event its `failure_id` leads to by
  following `cause_id` down to the deepest event still in the report; None without a failure.
- `saved_root(row)`: the same over a saved row's report as written (`_ng_failure_events`,
  `_ng_failure_id`), without validating it: the summary's SQL reads it so, and a differential test
  keeps the two equal. A report that validation would refuse is read as far as it goes: a cause
  that names no event of the report ends the chain, as does a cause already followed (a cycle).
- `body_root(text)`: the innermost gym-failures error body in a text a NeMo Gym row keeps, and what
  it names.
- `row_root(row)`: a row's root: `saved_root`, else (a failure row) `body_root` of its kept reply
  body (`_ng_failure_response_body`), else of its reason.

A report's chain is followed at most `MAX_ROOT_DEPTH` links (a failure's own projection stops at 64
too: `gym_failures.failures`), and never further than its number of events.

Reading a body. NeMo Gym keeps no headers: when a failed `/run` reply came from a NeMo Gym server
whose upstream replied with gym-failures' error body (`gym_failures.asgi.error_body`), that body
survives only inside the text NeMo Gym wrote about it. Each NeMo Gym server that sees an upstream's
error answers 500 with a JSON string, `"Hit an exception in <server> calling an inner server: "`
followed by `repr()` of the upstream's body bytes (`nemo_gym/server_utils.py`,
`setup_exception_middleware`), and the collector keeps the outermost reply's body
(`nemo_gym/rollout_collection.py`, `_agent_request_failure_row`, `_truncated_body`: 2000 characters
and "…"). Behind a simple agent and a model server the endpoint's body sits three quotings deep.

Quoting never touches the characters of the body's keys and values (a kind, an event id, a boundary
and an error type are ASCII letters, digits and `_.:-`): a JSON string escapes `"` as `\\"` and `\\`
as `\\\\`, a Python `repr()` of text holding `"` keeps `"` and doubles `\\`. So each field of a body
quoted n layers deep reads `<k backslashes>"failure_kind<k>": <k>"value<k>"`, where k never
shrinks as n grows. The decoder finds every `failure_kind` field, takes the one with the most
backslashes before its quote (the innermost body; the last such one on a tie), and reads that body's
`event_id` and `boundary` from the text after it and its error `type` from the text before it (up to
the neighbouring `failure_kind` fields), each at the same quoting. No layer is unescaped: a body cut
by NeMo Gym's bound is read as far as it goes, and nothing in the text can make it raise. Bounds: the
first `MAX_BODY_TEXT` characters are read, a body quoted behind more than `MAX_ESCAPE_RUN`
backslashes (about ten layers) is not, and a kind is at most 128 characters.

A body names no HTTP status of its own. Its status is the one its error `type` names when only one
status is sent with that type (`STATUS_BY_ERROR_TYPE`: the OpenAI and Anthropic shapes' types that
`gym_failures._error_body.ERROR_TYPES` gives one status, such as `rate_limit_error` for 429); else
none. The status of the reply that carried the body (NeMo Gym's `_ng_failure_http_status`) is never
taken for it: it is the replying server's (gym-failures' middleware answers 500 for any failure unless
told otherwise), not the failure's, and reading a model's timeout as "the model answered 500" is the
mistake a root cause is there to undo.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

if TYPE_CHECKING:  # annotations only: reading a root loads no pydantic model
    from gym_failures.failure_records import FailureEvent, FailureReport

__all__ = [
    "BOUNDARY_FIELD_REGEX",
    "EVENT_ID_FIELD_REGEX",
    "KIND_FIELD_REGEX",
    "KIND_FIELD_SPLIT_REGEX",
    "MAX_BODY_TEXT",
    "MAX_ESCAPE_RUN",
    "MAX_KIND_CHARS",
    "MAX_ROOT_DEPTH",
    "STATUS_BY_ERROR_TYPE",
    "TYPE_FIELD_REGEX",
    "RootCause",
    "body_root",
    "root_event",
    "row_root",
    "saved_root",
]

MAX_ROOT_DEPTH: Final = 64
"""The most cause links followed from a report's failure to its root."""
MAX_BODY_TEXT: Final = 2001
"""How much of a text is read for a body: NeMo Gym's 2000 characters and its "…"."""
MAX_ESCAPE_RUN: Final = 1023
"""A body behind more backslashes than this (about ten layers of quoting) is not read."""
MAX_KIND_CHARS: Final = 128

_EVENTS = "_ng_failure_events"  # `FailureReportRow.EVENTS` (tests check the names agree)
_FAILURE_ID = "_ng_failure_id"
_RESPONSE_BODY = "_ng_failure_response_body"  # `gym_failures.nemo_gym.FAILURE_RESPONSE_BODY`

_SPACE = r"[\t\n\f\r ]*"


def _field(name: str, value: str, capture: bool = True) -> str:
    """A JSON field `"name": "value"` at any quoting: `(\\\\*)` before each quote, the run captured
    (group 1) with the value (group 2) unless `capture` is false."""
    run, open_value = (r"(\\*)", "(") if capture else (r"\\*", "(?:")
    return rf'{run}"{name}\\*"{_SPACE}:{_SPACE}\\*"{open_value}{value})\\*"'


_KIND_VALUE = r"[a-z][a-z0-9_]*(?::[a-z][a-z0-9_]*)?"
KIND_FIELD_REGEX: Final = _field("failure_kind", _KIND_VALUE)
KIND_FIELD_SPLIT_REGEX: Final = _field("failure_kind", _KIND_VALUE, capture=False)
EVENT_ID_FIELD_REGEX: Final = _field("event_id", r"[A-Za-z0-9_.:-]{1,128}")
BOUNDARY_FIELD_REGEX: Final = _field("boundary", r"[a-z_]{1,32}")
TYPE_FIELD_REGEX: Final = _field("type", r"[a-z_]{1,64}")

# Every pattern is written for both Python's `re` and DuckDB's RE2 (the summary runs them in SQL):
# ASCII classes only, no `\s`, `\b`, `$`, look-around or back-reference.
_KIND = re.compile(KIND_FIELD_REGEX)
_KIND_SPLIT = re.compile(KIND_FIELD_SPLIT_REGEX)
_EVENT_ID = re.compile(EVENT_ID_FIELD_REGEX)
_BOUNDARY = re.compile(BOUNDARY_FIELD_REGEX)
_TYPE = re.compile(TYPE_FIELD_REGEX)

STATUS_BY_ERROR_TYPE: Final[Mapping[str, int]] = {
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "conflict_error": 409,
    "request_too_large": 413,
    "unprocessable_entity_error": 422,
    "rate_limit_error": 429,
    "overloaded_error": 529,
}
"""The error types of our OpenAI- and Anthropic-shaped bodies that only one status is sent with
(the inverse of `gym_failures._error_body.ERROR_TYPES` where it is one to one; a test keeps them
equal). `invalid_request_error`, `server_error` and `api_error` stand for many statuses: none."""


@dataclass(frozen=True)
class RootCause:
    """The root of a failure, as far as a row shows it."""

    failure_kind: str | None
    boundary: str | None
    http_status: int | None
    event_id: str | None
    stage: str | None = None
    source: Literal["report", "body"] = "report"
    """`report`: the deepest event of the saved report's chain; `body`: the innermost error body."""
    depth: int = 0
    """For a report, the cause links followed from the failure (0: the failure is its own root); for
    a body, the backslashes before its quotes (0: unquoted)."""


def _status(value: object) -> int | None:
    """An HTTP status as the summary counts one: an integer 100-599 (never a bool or a float)."""
    return value if type(value) is int and 100 <= value <= 599 else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


_Event = TypeVar("_Event")


def _chain_end(
    events: Mapping[str, _Event], start: str, cause_of: Callable[[_Event], object]
) -> tuple[str, _Event, int] | None:
    """The deepest event of the chain from `start`: its id, itself and the links followed. A cause
    that names no event of `events`, or one already followed, ends the chain; at most
    `min(len(events), MAX_ROOT_DEPTH)` links are followed."""
    event = events.get(start)
    if event is None:
        return None
    current, visited = start, {start}
    for _ in range(min(len(events), MAX_ROOT_DEPTH)):
        cause = cause_of(event)
        following = events.get(cause) if isinstance(cause, str) and cause not in visited else None
        if following is None:
            break
        assert isinstance(cause, str)
        current, event = cause, following
        visited.add(cause)
    return current, event, len(visited) - 1


def root_event(report: FailureReport) -> FailureEvent | None:
    """The root cause of `report`'s failure: from `failure_id`, `cause_id` followed to the deepest
    event still in the report (the failure itself when it names no cause); None when the report has
    no failure (a success, or a failure id that names no event).

    For `raise AgentFailure(...) from model_failure` the root is the model's event: its kind,
    boundary, `http_status` and `event_id` say what really failed."""
    if report.failure_id is None:
        return None
    found = _chain_end(report.events, report.failure_id, lambda event: event.cause_id)
    return None if found is None else found[1]


def _raw_cause(event: object) -> object:
    return event.get("cause_id") if isinstance(event, Mapping) else None


def saved_root(row: Mapping[str, Any]) -> RootCause | None:
    """The root of the failure a row's saved report names (`_ng_failure_id`; a success row names
    one only when it was built on a call that ended in failure), read as written, or None.

    An event saved as something other than an object is an event with no fields (DuckDB reads it
    so); a field of the wrong type is no value. Never raises."""
    events, failure_id = row.get(_EVENTS), row.get(_FAILURE_ID)
    if not isinstance(events, Mapping) or not isinstance(failure_id, str):
        return None
    found = _chain_end(events, failure_id, _raw_cause)
    if found is None:
        return None
    event_id, event, depth = found
    fields: Mapping[str, Any] = event if isinstance(event, Mapping) else {}
    return RootCause(
        failure_kind=_text(fields.get("failure_kind")),
        boundary=_text(fields.get("boundary")),
        http_status=_status(fields.get("http_status")),
        event_id=event_id,
        stage=_text(fields.get("stage")),
        source="report",
        depth=depth,
    )


def _run(match: re.Match[str]) -> int:
    return len(match.group(1))


def _first_at(pattern: re.Pattern[str], text: str, run: int) -> str | None:
    return next((match.group(2) for match in pattern.finditer(text) if _run(match) == run), None)


def _last_at(pattern: re.Pattern[str], text: str, run: int) -> str | None:
    found = [match.group(2) for match in pattern.finditer(text) if _run(match) == run]
    return found[-1] if found else None


def body_root(text: object) -> RootCause | None:
    """The failure the innermost gym-failures error body in `text` names (see the module
    docstring), or None when `text` holds none. Bounded, and never raises, whatever `text` is."""
    if not isinstance(text, str):
        return None
    text = text[:MAX_BODY_TEXT]
    if "failure_kind" not in text:
        return None
    found = [
        (_run(match), match.group(2))
        for match in _KIND.finditer(text)  # in step with `_KIND_SPLIT.split` below: one scan's matches
    ]
    eligible = [
        index
        for index, (run, kind) in enumerate(found)
        if run <= MAX_ESCAPE_RUN and len(kind) <= MAX_KIND_CHARS
    ]
    if not eligible:
        return None
    deepest = max(found[index][0] for index in eligible)
    index = max(index for index in eligible if found[index][0] == deepest)
    parts = _KIND_SPLIT.split(text)
    before, after = parts[index], parts[index + 1]
    error_type = _last_at(_TYPE, before, deepest)
    status = None if error_type is None else STATUS_BY_ERROR_TYPE.get(error_type)
    return RootCause(
        failure_kind=found[index][1],
        boundary=_first_at(_BOUNDARY, after, deepest),
        http_status=status,
        event_id=_first_at(_EVENT_ID, after, deepest),
        source="body",
        depth=deepest,
    )


def _reason(row: Mapping[str, Any]) -> str | None:
    failure = row.get("failure")
    return _text(failure.get("failure_reason")) if isinstance(failure, Mapping) else None


def row_root(row: Mapping[str, Any]) -> RootCause | None:
    """The root of `row`'s failure, `row` as `gym_failures.rows.normalized` reads it: the saved
    report's (`saved_root`); else, on a failure row, the innermost error body in its kept reply body
    (`_ng_failure_response_body`) or in its reason (`body_root`); else None. A failure with no cause
    below it is its own root."""
    saved = saved_root(row)
    if saved is not None or "failure" not in row:
        return saved
    found = body_root(row.get(_RESPONSE_BODY))
    return found if found is not None else body_root(_reason(row))
