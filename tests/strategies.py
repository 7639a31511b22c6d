"""Hypothesis strategies for the failure records, shared by every test module.

`failure_reports()` draws only valid reports: unique event ids, each event's cause an earlier event
(so every chain resolves and none loops), the details schema its boundary selects, and every bounded
field within its bound, sometimes exactly at it.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any, get_args

from hypothesis import strategies as st

from gym_failures.failure_kinds import FAILURE_KINDS, FailureStage
from gym_failures.failure_records import (
    FailureBoundary,
    FailureDetails,
    FailureEvent,
    FailureReport,
    ModelFailureDetails,
    SandboxFailureDetails,
    SdkErrorDetails,
)

__all__ = [
    "bounded_texts",
    "event_ids",
    "examples",
    "failure_events",
    "failure_kinds",
    "failure_reports",
    "failure_stages",
    "foreign_errors",
    "http_statuses",
    "json_values",
    "objects_in",
]


def examples(make_test: int, *, fuzz: int) -> int:
    """The example count of a property test whose every example is costly (a DuckDB query, a file
    scan): `make_test` under `make test`, `fuzz` under `make fuzz` (`HYPOTHESIS_PROFILE=fuzz`). A
    count given in `@settings` beats the profile's, so such a test names both here."""
    return fuzz if os.environ.get("HYPOTHESIS_PROFILE") == "fuzz" else make_test


# Strategies are built once: building one per draw costs more than drawing from it.


@cache
def bounded_texts(max_length: int, *, min_size: int = 0) -> st.SearchStrategy[str]:
    """Short text, or text exactly at `max_length` (the bound a record must still accept).

    Text at the bound repeats one drawn character: drawing 2000 independent characters is slow and
    finds nothing the short text does not.
    """
    return st.one_of(
        st.text(min_size=min_size, max_size=min(max_length, 24)),
        st.characters(codec="utf-8").map(lambda character: character * max_length),
    )


@cache
def event_ids() -> st.SearchStrategy[str]:
    """Any non-empty id of at most 128 characters, not only the ones `new_event_id` makes."""
    return bounded_texts(128, min_size=1)


@cache
def failure_kinds() -> st.SearchStrategy[str]:
    """A registered kind or an environment's own `<server>:<kind>` name."""
    return st.one_of(
        st.sampled_from(sorted(FAILURE_KINDS)),
        st.from_regex(r"[a-z][a-z0-9_]{0,8}:[a-z][a-z0-9_]{0,8}", fullmatch=True),
    )


@cache
def failure_stages() -> st.SearchStrategy[FailureStage | None]:
    return st.one_of(st.none(), st.sampled_from(get_args(FailureStage)))


@cache
def http_statuses() -> st.SearchStrategy[int | None]:
    return st.one_of(st.none(), st.integers(min_value=100, max_value=599))


@cache
def _optional(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), strategy)


@cache
def foreign_errors() -> st.SearchStrategy[SdkErrorDetails]:
    return st.builds(
        SdkErrorDetails,
        exception_type=bounded_texts(256, min_size=1),
        http_status=http_statuses(),
        message=bounded_texts(2000),
    )


@cache
def _sandbox_details() -> st.SearchStrategy[SandboxFailureDetails]:
    return st.builds(
        SandboxFailureDetails,
        execution_id=_optional(bounded_texts(256)),
        exit_code=st.one_of(st.none(), st.integers()),
        provider=_optional(bounded_texts(256)),
        provider_status_reason=_optional(bounded_texts(2000)),
        sandbox_id=_optional(bounded_texts(256)),
    )


@cache
def _model_details() -> st.SearchStrategy[ModelFailureDetails]:
    return st.builds(
        ModelFailureDetails,
        provider_request_id=_optional(bounded_texts(256)),
        request_upload_complete=st.one_of(st.none(), st.booleans()),
    )


@cache
def _details_for(boundary: FailureBoundary) -> st.SearchStrategy[FailureDetails | None]:
    if boundary is FailureBoundary.SANDBOX:
        return st.one_of(st.none(), _sandbox_details())
    if boundary is FailureBoundary.MODEL:
        return st.one_of(st.none(), _model_details())
    return st.none()


@st.composite
def failure_events(draw: st.DrawFn, event_id: str | None = None, cause_id: str | None = None) -> FailureEvent:
    """A valid event; `event_id` and `cause_id` are drawn unless given."""
    boundary = draw(st.sampled_from(FailureBoundary))
    return FailureEvent(
        event_id=draw(event_ids()) if event_id is None else event_id,
        boundary=boundary,
        failure_kind=draw(failure_kinds()),
        failure_reason=draw(bounded_texts(2000)),
        stage=draw(failure_stages()),
        cause_id=cause_id,
        http_status=draw(http_statuses()),
        operation=draw(_optional(bounded_texts(256))),
        operation_id=draw(_optional(event_ids())),
        attempt_id=draw(_optional(event_ids())),
        details=draw(_details_for(boundary)),
        foreign_error=draw(st.one_of(st.none(), foreign_errors())),
        exception_type=draw(_optional(bounded_texts(256))),
    )


@st.composite
def failure_reports(draw: st.DrawFn, max_events: int = 5) -> FailureReport:
    """A valid report: events keyed by id, causes forming chains (a forest, never a cycle)."""
    ids = draw(st.lists(event_ids(), unique=True, max_size=max_events))
    events: dict[str, FailureEvent] = {}
    for index, event_id in enumerate(ids):
        # A cause is always an earlier event, so every chain resolves and none can loop.
        cause_id = draw(st.one_of(st.none(), st.sampled_from(ids[:index]))) if index else None
        events[event_id] = draw(failure_events(event_id=event_id, cause_id=cause_id))
    failure_id = draw(st.one_of(st.none(), st.sampled_from(ids))) if ids else None
    return FailureReport(events=events, failure_id=failure_id, omitted=draw(st.booleans()))


@cache
def json_values() -> st.SearchStrategy[Any]:
    """Any small JSON value: what a peer or a damaged file can hand a decoder."""
    return st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12)),
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
        ),
        max_leaves=12,
    )


def objects_in(node: Any) -> list[dict[str, Any]]:
    """Every JSON object in `node`, `node` itself first, nested objects of objects after it."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found.extend(objects_in(value))
    return found
