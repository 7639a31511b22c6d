"""The root cause of a failure (`gym_failures.reporting._roots`): a report's deepest cause, and the
innermost gym-failures error body in a text NeMo Gym keeps, read through its layers of quoting.

The layers here are the ones NeMo Gym 0.7.0's servers really add (`tests/nemo_gym_peer` checks one
made by its own code): its exception middleware answers an upstream's failure with the JSON string
`"Hit an exception in <server> calling an inner server: " + repr(body bytes)` (starlette's
`JSONResponse` of a str), and its collector keeps the outermost reply's body, cut at 2000 characters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gym_failures import nemo_gym
from gym_failures._error_body import ERROR_TYPES, ErrorShape, error_body
from gym_failures.failure_records import FailureBoundary, FailureEvent, FailureReport
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import AgentFailure, ModelFailure
from gym_failures.reporting._roots import (
    MAX_BODY_TEXT,
    MAX_ROOT_DEPTH,
    STATUS_BY_ERROR_TYPE,
    RootCause,
    body_root,
    root_event,
    row_root,
    saved_root,
)
from gym_failures.reporting._sql import MACROS
from gym_failures.rows import normalized
from tests.saved_rows import failure_row, raised, success_row
from tests.strategies import examples, failure_kinds, failure_reports, json_values

# --- a report's root ----------------------------------------------------------------------------


def _readme_failure() -> tuple[AgentFailure, ModelFailure]:
    """The README's pattern: `raise AgentFailure("agent_run_error") from model_failure`."""
    model = ModelFailure(
        failure_kind="provider_quota_exhausted", failure_reason="quota spent", http_status=429, stage="agent"
    )
    agent = AgentFailure(failure_kind="agent_run_error", failure_reason="no answer", stage="agent")
    failure = raised(agent, model)
    assert isinstance(failure, AgentFailure)
    return failure, model


def test_the_root_of_the_readme_pattern_is_the_models_failure() -> None:
    agent, model = _readme_failure()
    root = root_event(agent.failure_report())
    assert root is not None
    assert (root.failure_kind, root.boundary, root.http_status, root.event_id) == (
        "provider_quota_exhausted",
        FailureBoundary.MODEL,
        429,
        model.event_id,
    )
    saved = saved_root(failure_row(agent))
    assert saved == RootCause("provider_quota_exhausted", "model", 429, model.event_id, "agent", "report", 1)


def test_a_failure_without_a_cause_is_its_own_root() -> None:
    failure = ModelFailure(failure_kind="model_server_error", http_status=503)
    report = failure.failure_report()
    assert root_event(report) == report.events[failure.event_id]
    found = saved_root(failure_row(failure))
    assert found is not None
    assert (found.event_id, found.depth) == (failure.event_id, 0)


def test_a_report_without_a_failure_has_no_root() -> None:
    assert root_event(FailureReport()) is None
    recovered = success_row(recovered=ModelFailure(failure_kind="model_server_error"))
    assert saved_root(recovered) is None
    assert row_root(normalized(recovered)) is None


def test_a_success_built_on_a_failed_call_has_its_failures_root() -> None:
    """A tainted success row names the failure it was built on (`_ng_failure_id`): its root is read."""
    agent, model = _readme_failure()
    row = success_row()
    row.update(FailureReportRow.fields(agent.failure_report()))
    found = row_root(normalized(row))
    assert found is not None
    assert (found.failure_kind, found.event_id) == (
        "provider_quota_exhausted",
        model.event_id,
    )


def _event(kind: str, cause: object = None, **fields: Any) -> dict[str, Any]:
    return {"boundary": "model", "failure_kind": kind, "cause_id": cause, **fields}


@pytest.mark.parametrize(
    ("events", "root", "depth"),
    [
        ({"a": _event("k", "b"), "b": _event("k2", "c"), "c": _event("k3", "b")}, "c", 2),  # a cycle
        ({"a": _event("k", "a")}, "a", 0),  # its own cause
        ({"a": _event("k", "gone")}, "a", 0),  # a cause the report does not hold
        ({"a": _event("k", "b"), "b": None}, "a", 0),  # a cause saved as null
        ({"a": _event("k", "b"), "b": 5}, "b", 1),  # an event saved as no object: no fields
        ({"a": _event("k", 7), "7": _event("k2")}, "a", 0),  # a cause that is no string
    ],
)
def test_a_saved_report_is_read_as_far_as_it_goes(events: dict[str, Any], root: str, depth: int) -> None:
    found = saved_root(
        {"_ng_failure_events": events, "_ng_failure_id": "a", "_ng_failure_events_omitted": False}
    )
    assert found is not None
    assert (found.event_id, found.depth) == (root, depth)


@pytest.mark.parametrize(
    "row",
    [
        {},
        {"_ng_failure_events": "garbage", "_ng_failure_id": "a"},
        {"_ng_failure_events": {"a": _event("k")}, "_ng_failure_id": "b"},
        {"_ng_failure_events": {"a": _event("k")}, "_ng_failure_id": 5},
        {"_ng_failure_events": {"a": None}, "_ng_failure_id": "a"},
    ],
)
def test_a_row_whose_report_names_no_saved_failure_has_no_saved_root(row: dict[str, Any]) -> None:
    assert saved_root(row) is None


def test_a_chain_is_followed_at_most_64_links() -> None:
    events = {f"e{index}": _event("k", f"e{index + 1}") for index in range(100)}
    events["e100"] = _event("k")
    found = saved_root({"_ng_failure_events": events, "_ng_failure_id": "e0"})
    assert found is not None
    assert (found.event_id, found.depth) == (f"e{MAX_ROOT_DEPTH}", MAX_ROOT_DEPTH)


@given(report=failure_reports())
def test_a_saved_report_read_as_written_has_the_validated_reports_root(report: FailureReport) -> None:
    event = root_event(report)
    saved = saved_root(FailureReportRow.fields(report))
    if event is None:
        assert saved is None
    else:
        assert saved is not None
        assert (saved.failure_kind, saved.boundary, saved.http_status, saved.event_id, saved.stage) == (
            event.failure_kind,
            event.boundary.value,
            event.http_status,
            event.event_id,
            event.stage,
        )


def test_the_saved_keys_are_the_reports_row_keys() -> None:
    row = FailureReportRow.fields(_readme_failure()[0].failure_report())
    assert saved_root(row) is not None
    assert set(row) == set(FailureReportRow.KEYS)
    body_row = {
        "failure": {},
        nemo_gym.FAILURE_RESPONSE_BODY: '{"type": "rate_limit_error", "failure_kind": "x"}',
    }
    found = row_root(body_row)
    assert found is not None
    assert (found.failure_kind, found.http_status) == ("x", 429)
    reason_row = {"failure": {"failure_reason": 'upstream said b\'{"failure_kind": "y"}\''}}
    found = row_root(reason_row)
    assert found is not None
    assert found.failure_kind == "y"


def test_reading_a_root_loads_neither_duckdb_nor_pydantic() -> None:
    """The gate calls it: it must cost no start-up of its own."""
    code = (
        "import sys, gym_failures.reporting._roots as roots\n"
        "roots.row_root({'failure': {}, '_ng_failure_response_body': '{\"failure_kind\": \"x\"}'})\n"
        "print(sorted(name for name in ('duckdb', 'pydantic') if name in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# --- a body's root ------------------------------------------------------------------------------


def _body(kind: str, event_id: str, boundary: str, status: int, shape: ErrorShape, reason: str = "r") -> str:
    event = FailureEvent(
        event_id=event_id, boundary=FailureBoundary(boundary), failure_kind=kind, failure_reason=reason
    )
    return error_body(event, status=status, shape=shape).decode()


def _wrapped(text: str, server: str = "SimpleAgent___agent") -> str:
    """`text`, a reply's body, as the reply of a NeMo Gym server whose upstream sent it
    (nemo_gym/server_utils.py, `setup_exception_middleware`; starlette's `JSONResponse`)."""
    return json.dumps(
        f"Hit an exception in {server} calling an inner server: {text.encode()!r}", ensure_ascii=False
    )


def test_a_bodys_status_is_never_the_status_of_the_reply_that_carried_it() -> None:
    """A reply's status is its server's (gym-failures' middleware answers 500 for any failure): the
    agent's 500 carrying a model timeout is no model that answered 500."""
    body = _body("model_policy_response_timeout", "ev-1", "model", 500, "gym")
    assert body_root(body) == RootCause(
        "model_policy_response_timeout", "model", None, "ev-1", None, "body", 0
    )
    row = {"failure": {}, nemo_gym.FAILURE_RESPONSE_BODY: body, nemo_gym.FAILURE_HTTP_STATUS: 500}
    assert row_root(row) == body_root(body)


@pytest.mark.parametrize(
    ("shape", "status", "read"),
    [
        ("openai", 429, 429),
        ("anthropic", 429, 429),
        ("anthropic", 529, 529),
        ("openai", 401, 401),
        ("openai", 400, None),  # invalid_request_error: many statuses
        ("openai", 503, None),  # server_error: any server error
        ("gym", 429, None),  # the gym shape names no type
    ],
)
def test_a_quoted_bodys_status_is_the_one_its_error_type_names(
    shape: ErrorShape, status: int, read: int | None
) -> None:
    text = _wrapped(
        _wrapped(_wrapped(_body("provider_quota_exhausted", "AbC_12-xyz", "model", status, shape)))
    )
    found = body_root(text)
    assert found is not None
    assert (found.failure_kind, found.boundary, found.event_id, found.http_status) == (
        "provider_quota_exhausted",
        "model",
        "AbC_12-xyz",
        read,
    )


def test_the_innermost_body_is_read_not_the_one_that_quotes_it() -> None:
    inner = _body("provider_quota_exhausted", "inner", "model", 429, "openai")
    outer = _body("agent_run_error", "outer", "agent", 500, "gym", reason=f"the model said {inner}")
    found = body_root(outer)
    assert found is not None
    assert (found.failure_kind, found.event_id, found.http_status) == (
        "provider_quota_exhausted",
        "inner",
        429,
    )


def test_a_body_cut_by_nemo_gyms_bound_is_read_as_far_as_it_goes() -> None:
    body = _wrapped(_wrapped(_body("model_server_error", "ev-1", "model", 503, "gym", reason="x" * 1990)))
    kept = body[:2000] + "…"  # `_truncated_body`
    found = body_root(kept)
    assert found is not None
    assert (found.failure_kind, found.event_id, found.boundary) == (
        "model_server_error",
        None,
        None,
    )
    assert body_root(" " * MAX_BODY_TEXT + body) is None, "only the first 2001 characters are read"


@pytest.mark.parametrize(
    "text",
    [
        None,
        7,
        "",
        "Internal Server Error",
        '{"detail": "boom"}',
        '{"failure_kind": "X"}',
        "failure_kind",
        b"{}",
    ],
)
def test_a_text_that_holds_no_body_names_no_root(text: object) -> None:
    assert body_root(text) is None


def test_the_error_types_read_as_statuses_are_the_ones_sent_with_one_status_only() -> None:
    sent: dict[str, set[int]] = {}
    for by_status, _ in ERROR_TYPES.values():
        for status, name in by_status.items():
            sent.setdefault(name, set()).add(status)
    fallbacks = {other for _, other in ERROR_TYPES.values()} | {"invalid_request_error"}
    one_to_one = {name: next(iter(statuses)) for name, statuses in sent.items() if len(statuses) == 1}
    assert dict(STATUS_BY_ERROR_TYPE) == {
        name: status for name, status in one_to_one.items() if name not in fallbacks
    }


# --- the decoder's properties -------------------------------------------------------------------

_QUOTINGS: dict[str, Callable[[str], str]] = {
    "nemo_gym_server": _wrapped,
    "json_string": json.dumps,
    "json_string_utf8": lambda text: json.dumps(text, ensure_ascii=False),
    "bytes_repr": lambda text: repr(text.encode()),
    "str_repr": repr,
    "in_prose": lambda text: f"upstream said: {text} (retry later)",
}
_BODIES = st.builds(
    _body,
    kind=failure_kinds(),
    event_id=st.from_regex(r"[A-Za-z0-9_.:-]{1,40}", fullmatch=True),
    boundary=st.sampled_from([boundary.value for boundary in FailureBoundary]),
    status=st.integers(400, 599),
    shape=st.sampled_from(["gym", "openai", "anthropic"]),
    reason=st.text(max_size=40),
)
_LAYERS = st.lists(st.sampled_from(sorted(_QUOTINGS)), max_size=5)


def _quoted(body: str, layers: list[str]) -> str:
    for layer in layers:
        body = _QUOTINGS[layer](body)
    return body


@given(body=_BODIES, layers=_LAYERS)
def test_a_body_under_any_layers_of_quoting_names_its_failure(body: str, layers: list[str]) -> None:
    text = _quoted(body, layers)
    if len(text) > MAX_BODY_TEXT:
        return
    found = body_root(text)
    facts = json.loads(body)
    facts = facts.get("error", facts)
    assert found is not None
    assert (found.failure_kind, found.event_id, found.boundary, found.http_status) == (
        facts["failure_kind"],
        facts["event_id"],
        facts["boundary"],
        STATUS_BY_ERROR_TYPE.get(facts.get("type", "")),
    )


@given(body=_BODIES, layers=_LAYERS, cut=st.integers(0, MAX_BODY_TEXT))
def test_a_cut_body_names_its_own_failure_or_nothing(body: str, layers: list[str], cut: int) -> None:
    found = body_root(_quoted(body, layers)[:cut] + "…")
    facts = json.loads(body)
    facts = facts.get("error", facts)
    if found is not None:
        assert found.failure_kind == facts["failure_kind"]
        assert found.event_id in (None, facts["event_id"])
        assert found.boundary in (None, facts["boundary"])


@given(
    text=st.one_of(
        st.text(), st.text(alphabet="\\\"'{}: failure_kind_event_id_boundary_type_ab"), json_values()
    )
)
@example(text='\\"failure_kind\\": \\"a\\"' * 3)
def test_any_text_is_read_without_raising(text: object) -> None:
    found = body_root(text)
    assert found is None or found.failure_kind is not None


# --- the summary's SQL reads a body as the Python does ------------------------------------------


@pytest.fixture(scope="module")
def connection() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect(":memory:")
    connection.execute(MACROS)
    yield connection
    connection.close()


def _sql_root(connection: duckdb.DuckDBPyConnection, text: str) -> tuple[Any, ...] | None:
    found = connection.execute("SELECT _gf_body_root(?)", [text]).fetchone()
    assert found is not None
    value = found[0]
    return (
        None if value is None else (value["kind"], value["boundary"], value["event_id"], value["http_status"])
    )


def _python_root(text: str) -> tuple[Any, ...] | None:
    found = body_root(text)
    return None if found is None else (found.failure_kind, found.boundary, found.event_id, found.http_status)


@settings(max_examples=examples(60, fuzz=2000), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.one_of(
        st.text(alphabet="\\\"' {}:,failure_kindeventidboundarytypexrate_limit_error"),
        st.builds(_quoted, _BODIES, _LAYERS),
        st.builds(
            lambda body, layers, cut: _quoted(body, layers)[:cut], _BODIES, _LAYERS, st.integers(0, 3000)
        ),
        st.text(),
    )
)
@example(text=' {"failure_kind": "a", "type": "rate_limit_error"}')
def test_the_summarys_sql_reads_a_body_as_the_python_does(
    connection: duckdb.DuckDBPyConnection, text: str
) -> None:
    assert _sql_root(connection, text) == _python_root(text)
