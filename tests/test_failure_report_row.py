"""The row keys Collection saves a report under: fields, reading a saved row back, merging into a row."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_failures.failure_records import FailureEvent, FailureReport
from gym_failures.failure_transport import FailureReportRow
from tests.strategies import failure_reports

EVENTS, FAILURE_ID, OMITTED = FailureReportRow.EVENTS, FailureReportRow.FAILURE_ID, FailureReportRow.OMITTED


def _event(event_id: str, **fields: Any) -> FailureEvent:
    data: dict[str, Any] = {"event_id": event_id, "boundary": "model", "failure_kind": "model_server_error"}
    data.update(fields)
    return FailureEvent.model_validate(data)


def _report(*event_ids: str, failure_id: str | None = None, omitted: bool = False) -> FailureReport:
    return FailureReport(events={i: _event(i) for i in event_ids}, failure_id=failure_id, omitted=omitted)


def _saved(row: dict[str, Any]) -> dict[str, Any]:
    """`row` as it reads back from a JSON lines file."""
    saved: dict[str, Any] = json.loads(json.dumps(row))
    return saved


def test_keys_are_as_documented() -> None:
    assert FailureReportRow.KEYS == ("_ng_failure_events", "_ng_failure_id", "_ng_failure_events_omitted")
    assert (EVENTS, FAILURE_ID, OMITTED) == FailureReportRow.KEYS


# --- fields ---------------------------------------------------------------------------------------


def test_empty_report_has_no_fields() -> None:
    assert FailureReportRow.fields(FailureReport()) == {}


def test_fields_hold_every_key() -> None:
    fields = FailureReportRow.fields(_report("a", "b", failure_id="b"))

    assert set(fields) == set(FailureReportRow.KEYS)
    assert fields[FAILURE_ID] == "b"
    assert fields[OMITTED] is False
    assert set(fields[EVENTS]) == {"a", "b"}


def test_report_with_only_omitted_has_fields() -> None:
    """Losing events is itself a fact the row must keep."""
    assert FailureReportRow.fields(FailureReport(omitted=True)) == {
        EVENTS: {},
        FAILURE_ID: None,
        OMITTED: True,
    }


def test_saved_events_are_the_wire_form() -> None:
    """The key carries the event id, as in the header."""
    fields = FailureReportRow.fields(_report("a"))

    assert fields[EVENTS] == {
        "a": {"boundary": "model", "failure_kind": "model_server_error", "failure_reason": ""}
    }


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow])
@given(report=failure_reports())
def test_fields_are_json_ready(report: FailureReport) -> None:
    fields = FailureReportRow.fields(report)

    assert _saved(fields) == fields


# --- report ---------------------------------------------------------------------------------------


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(report=failure_reports())
def test_saved_row_reads_back_as_its_report(report: FailureReport) -> None:
    row = _saved({"reward": 1.0, **FailureReportRow.fields(report)})

    assert FailureReportRow.report(row) == report


@pytest.mark.parametrize("row", [{}, {"reward": 0.0, "response": {"output": []}}])
def test_row_without_keys_has_an_empty_report(row: dict[str, Any]) -> None:
    assert FailureReportRow.report(row) == FailureReport()


def test_unregistered_kind_in_a_saved_row_is_kept() -> None:
    """A row saved by a newer version stays readable."""
    row = _saved(FailureReportRow.fields(_report("a", failure_id="a")))
    row[EVENTS]["a"]["failure_kind"] = "provider_gpu_lost"

    assert FailureReportRow.report(row).events["a"].failure_kind == "unregistered:provider_gpu_lost"


def _valid_row() -> dict[str, Any]:
    return _saved(FailureReportRow.fields(_report("a", "b", failure_id="a")))


def _with(**changes: Any) -> dict[str, Any]:
    row = _valid_row()
    row.update({getattr(FailureReportRow, name): value for name, value in changes.items()})
    return row


def _without(*names: str) -> dict[str, Any]:
    row = _valid_row()
    for name in names:
        del row[getattr(FailureReportRow, name)]
    return row


def _with_event(**fields: Any) -> dict[str, Any]:
    row = _valid_row()
    row[EVENTS]["a"].update(fields)
    return row


INVALID_ROWS: list[Any] = [
    pytest.param(_with(EVENTS=[]), id="events-list"),
    pytest.param(_with(EVENTS="a,b"), id="events-string"),
    pytest.param(_with(EVENTS=None), id="events-null"),
    pytest.param(_with(FAILURE_ID=7), id="failure-id-number"),
    pytest.param(_with(FAILURE_ID="gone"), id="failure-id-names-no-event"),
    pytest.param(_with(OMITTED="maybe"), id="omitted-not-bool"),
    pytest.param(_with(OMITTED=None), id="omitted-null"),
    pytest.param(_with_event(failure_kind="Not A Kind"), id="bad-kind"),
    pytest.param(_with_event(cause_id="gone"), id="dangling-cause"),
    pytest.param(_with_event(cause_id="a"), id="self-cause"),
    pytest.param(_with_event(boundary="moon"), id="bad-boundary"),
    pytest.param(_with_event(extra=1), id="extra-field"),
    pytest.param(_without("FAILURE_ID"), id="without-failure-id"),
    pytest.param(_without("OMITTED"), id="without-omitted"),
    pytest.param(_without("EVENTS"), id="without-events"),
    pytest.param(_without("EVENTS", "OMITTED"), id="only-failure-id"),
]


@pytest.mark.parametrize("row", INVALID_ROWS)
def test_invalid_row_is_read_as_omitted(row: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    assert FailureReportRow.report(row) == FailureReport(omitted=True)
    assert "saved row" in caplog.text


_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300)
@given(
    row=st.dictionaries(
        st.one_of(st.sampled_from(FailureReportRow.KEYS), st.text(max_size=8)),
        st.one_of(_JSON, st.builds(object)),
        max_size=5,
    )
)
def test_report_never_raises_on_any_row(row: dict[str, Any]) -> None:
    assert isinstance(FailureReportRow.report(row), FailureReport)


def test_invalid_row_is_logged_without_its_content(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    row = _valid_row()
    row[EVENTS]["sk-CANARY-42"] = {"boundary": "model", "failure_kind": "sk-CANARY-42"}

    assert FailureReportRow.report(row) == FailureReport(omitted=True)
    assert caplog.records
    assert "sk-CANARY-42" not in caplog.text


# --- merged_into ----------------------------------------------------------------------------------


def test_merged_into_returns_a_new_row_and_leaves_the_input_unchanged() -> None:
    row = {"reward": 1.0, **FailureReportRow.fields(_report("a", failure_id="a"))}
    before = copy.deepcopy(row)

    merged = FailureReportRow.merged_into(row, _report("b"))

    assert merged is not row
    assert row == before


def test_merged_into_keeps_the_other_row_keys() -> None:
    row = {"reward": 1.0, "response": {"output_text": "42"}}

    merged = FailureReportRow.merged_into(row, _report("b"))

    assert merged["reward"] == 1.0
    assert merged["response"] == {"output_text": "42"}


def test_merged_into_merges_the_reports_into_the_saved_one() -> None:
    row = FailureReportRow.fields(_report("a", failure_id="a"))

    merged = FailureReportRow.merged_into(row, _report("b"), _report("c", "a"))

    assert set(FailureReportRow.report(merged).events) == {"a", "b", "c"}


def test_merged_into_keeps_the_rows_own_failure_id() -> None:
    row = FailureReportRow.fields(_report("a", failure_id="a"))

    merged = FailureReportRow.merged_into(row, _report("b", failure_id="b"))

    assert merged[FAILURE_ID] == "a"


def test_merged_into_takes_the_first_failure_id_when_the_row_has_none() -> None:
    row = {"reward": 0.0}

    merged = FailureReportRow.merged_into(
        row, _report("a"), _report("b", failure_id="b"), _report("c", failure_id="c")
    )

    assert merged[FAILURE_ID] == "b"
    assert FailureReportRow.report(merged).failure_id == "b"


@pytest.mark.parametrize(
    ("row_omitted", "report_omitted"), [(True, False), (False, True)], ids=["row", "report"]
)
def test_merged_into_keeps_omitted(row_omitted: bool, report_omitted: bool) -> None:
    row = FailureReportRow.fields(_report("a", omitted=row_omitted))

    merged = FailureReportRow.merged_into(row, _report("b", omitted=report_omitted))

    assert merged[OMITTED] is True


def test_merged_into_a_row_without_a_report_adds_nothing_for_empty_reports() -> None:
    assert FailureReportRow.merged_into({"reward": 1.0}, FailureReport()) == {"reward": 1.0}


def test_merged_row_is_json_ready() -> None:
    merged = FailureReportRow.merged_into({"reward": 1.0}, _report("a", failure_id="a"))

    assert FailureReportRow.report(_saved(merged)) == _report("a", failure_id="a")
