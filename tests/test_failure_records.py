"""Tests for the failure records: bounds, strictness, details schemas, reports and their wire form."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from gym_failures import _vocabulary, failure_kinds
from gym_failures.failure_records import (
    EpisodeFailure,
    FailureBoundary,
    FailureEvent,
    FailureReport,
    ModelFailureDetails,
    SandboxFailureDetails,
    SdkErrorDetails,
    validate_failure_event_map,
)
from tests.strategies import failure_reports, json_values, objects_in

ID_FIELDS = ("event_id", "cause_id", "operation_id", "attempt_id")
NAME_FIELDS = ("operation", "exception_type")


@pytest.fixture
def warned(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    fresh: set[str] = set()
    monkeypatch.setattr(_vocabulary, "WARNED_UNKNOWN", fresh)
    return fresh


def event(event_id: str = "e1", **fields: Any) -> FailureEvent:
    data: dict[str, Any] = {"event_id": event_id, "boundary": "model", "failure_kind": "model_server_error"}
    data.update(fields)
    return FailureEvent.model_validate(data)


def report(*events: FailureEvent, failure_id: str | None = None, omitted: bool = False) -> FailureReport:
    return FailureReport(events={e.event_id: e for e in events}, failure_id=failure_id, omitted=omitted)


def round_trip(value: FailureReport) -> FailureReport:
    return FailureReport.model_validate_json(value.model_dump_json())


class TestFailureEventBounds:
    @pytest.mark.parametrize("field", ID_FIELDS)
    def test_id_at_128_accepted(self, field: str) -> None:
        assert getattr(event(**{field: "i" * 128}), field) == "i" * 128

    @pytest.mark.parametrize("field", ID_FIELDS)
    def test_id_at_129_refused(self, field: str) -> None:
        with pytest.raises(ValidationError, match=field):
            event(**{field: "i" * 129})

    def test_empty_event_id_refused(self) -> None:
        with pytest.raises(ValidationError, match="event_id"):
            event("")

    def test_reason_at_2000_accepted(self) -> None:
        assert event(failure_reason="r" * 2000).failure_reason == "r" * 2000

    def test_reason_at_2001_refused(self) -> None:
        with pytest.raises(ValidationError, match="failure_reason"):
            event(failure_reason="r" * 2001)

    @pytest.mark.parametrize("field", NAME_FIELDS)
    def test_name_at_256_accepted(self, field: str) -> None:
        assert getattr(event(**{field: "n" * 256}), field) == "n" * 256

    @pytest.mark.parametrize("field", NAME_FIELDS)
    def test_name_at_257_refused(self, field: str) -> None:
        with pytest.raises(ValidationError, match=field):
            event(**{field: "n" * 257})

    @pytest.mark.parametrize("status", [100, 599])
    def test_http_status_at_bounds_accepted(self, status: int) -> None:
        assert event(http_status=status).http_status == status

    @pytest.mark.parametrize("status", [99, 600])
    def test_http_status_past_bounds_refused(self, status: int) -> None:
        with pytest.raises(ValidationError, match="http_status"):
            event(http_status=status)


class TestFailureEvent:
    def test_extra_fields_forbidden(self) -> None:
        with pytest.raises(ValidationError, match="extra"):
            event(retryable=True)

    def test_frozen(self) -> None:
        with pytest.raises(ValidationError, match="frozen"):
            event().failure_reason = "changed"  # type: ignore[misc]

    def test_unregistered_kind_refused(self) -> None:
        with pytest.raises(ValidationError, match="unregistered"):
            event(failure_kind="legacy_label")

    def test_gate_derived_kind_refused(self) -> None:
        with pytest.raises(ValidationError, match="acceptance gate"):
            event(failure_kind="empty_answer")

    @pytest.mark.parametrize("kind", ["env:slow_tool", "unregistered:legacy_label"])
    def test_namespaced_kind_accepted(self, kind: str) -> None:
        assert event(failure_kind=kind).failure_kind == kind

    def test_unknown_boundary_refused(self) -> None:
        with pytest.raises(ValidationError, match="boundary"):
            event(boundary="judge")

    def test_unknown_stage_refused(self) -> None:
        with pytest.raises(ValidationError, match="stage"):
            event(stage="training")

    def test_serializes_without_nulls(self) -> None:
        assert event().model_dump(mode="json") == {
            "event_id": "e1",
            "boundary": "model",
            "failure_kind": "model_server_error",
            "failure_reason": "",
        }


class TestDetails:
    def test_sandbox_boundary_selects_sandbox_details(self) -> None:
        observed = event(boundary="sandbox", failure_kind="provider_oom_killed", details={"exit_code": 137})

        assert observed.details == SandboxFailureDetails(exit_code=137)

    def test_model_boundary_selects_model_details(self) -> None:
        observed = event(details={"provider_request_id": "req-1"})

        assert observed.details == ModelFailureDetails(provider_request_id="req-1")

    def test_fields_of_the_other_schema_refused(self) -> None:
        with pytest.raises(ValidationError, match="exit_code"):
            event(details={"exit_code": 137})

    @pytest.mark.parametrize("boundary", [b for b in FailureBoundary if b.value not in ("sandbox", "model")])
    def test_details_on_other_boundaries_refused(self, boundary: FailureBoundary) -> None:
        with pytest.raises(ValidationError, match="no details schema"):
            event(boundary=boundary, details={})

    @pytest.mark.parametrize("boundary", [b for b in FailureBoundary if b.value not in ("sandbox", "model")])
    def test_no_details_accepted_on_other_boundaries(self, boundary: FailureBoundary) -> None:
        assert event(boundary=boundary).details is None

    def test_wrong_details_model_refused(self) -> None:
        with pytest.raises(ValidationError, match="SandboxFailureDetails"):
            event(boundary="sandbox", failure_kind="kill_shaped", details=ModelFailureDetails())

    def test_wrong_details_model_refused_for_model(self) -> None:
        with pytest.raises(ValidationError, match="ModelFailureDetails"):
            event(details=SandboxFailureDetails(exit_code=1))

    def test_details_without_a_valid_boundary_refused(self) -> None:
        with pytest.raises(ValidationError, match="boundary"):
            event(boundary="judge", details={})

    @pytest.mark.parametrize(
        "details",
        [SandboxFailureDetails(exit_code=1), ModelFailureDetails(request_upload_complete=True)],
        ids=["sandbox", "model"],
    )
    def test_details_frozen(self, details: BaseModel) -> None:
        field = next(iter(type(details).model_fields))

        with pytest.raises(ValidationError, match="frozen"):
            setattr(details, field, None)

    def test_details_extra_fields_forbidden(self) -> None:
        with pytest.raises(ValidationError, match="extra"):
            SandboxFailureDetails.model_validate({"signal": 9})
        with pytest.raises(ValidationError, match="extra"):
            ModelFailureDetails.model_validate({"retryable": True})

    def test_provider_status_reason_at_2000_accepted(self) -> None:
        assert SandboxFailureDetails(provider_status_reason="r" * 2000).provider_status_reason == "r" * 2000

    def test_provider_status_reason_at_2001_refused(self) -> None:
        with pytest.raises(ValidationError, match="provider_status_reason"):
            SandboxFailureDetails(provider_status_reason="r" * 2001)

    @pytest.mark.parametrize("field", ["execution_id", "provider", "sandbox_id"])
    def test_sandbox_names_bounded_at_256(self, field: str) -> None:
        assert getattr(SandboxFailureDetails.model_validate({field: "n" * 256}), field) == "n" * 256
        with pytest.raises(ValidationError, match=field):
            SandboxFailureDetails.model_validate({field: "n" * 257})

    def test_provider_request_id_bounded_at_256(self) -> None:
        assert ModelFailureDetails(provider_request_id="n" * 256).provider_request_id == "n" * 256
        with pytest.raises(ValidationError, match="provider_request_id"):
            ModelFailureDetails(provider_request_id="n" * 257)


class TestSdkErrorDetails:
    def test_message_at_2000_accepted(self) -> None:
        assert SdkErrorDetails(exception_type="E", message="m" * 2000).message == "m" * 2000

    def test_message_at_2001_refused(self) -> None:
        with pytest.raises(ValidationError, match="message"):
            SdkErrorDetails(exception_type="E", message="m" * 2001)

    def test_exception_type_at_1_and_256_accepted(self) -> None:
        assert SdkErrorDetails(exception_type="E", message="").exception_type == "E"
        assert SdkErrorDetails(exception_type="E" * 256, message="").exception_type == "E" * 256

    @pytest.mark.parametrize("exception_type", ["", "E" * 257])
    def test_exception_type_past_bounds_refused(self, exception_type: str) -> None:
        with pytest.raises(ValidationError, match="exception_type"):
            SdkErrorDetails(exception_type=exception_type, message="")

    @pytest.mark.parametrize("status", [99, 600])
    def test_http_status_past_bounds_refused(self, status: int) -> None:
        with pytest.raises(ValidationError, match="http_status"):
            SdkErrorDetails(exception_type="E", message="", http_status=status)

    def test_message_required(self) -> None:
        with pytest.raises(ValidationError, match="message"):
            SdkErrorDetails.model_validate({"exception_type": "E"})

    def test_extra_fields_forbidden(self) -> None:
        """There is no place for the SDK's request or response body."""
        with pytest.raises(ValidationError, match="extra"):
            SdkErrorDetails.model_validate({"exception_type": "E", "message": "", "body": "..."})

    def test_frozen(self) -> None:
        details = SdkErrorDetails(exception_type="E", message="")

        with pytest.raises(ValidationError, match="frozen"):
            details.message = "changed"  # type: ignore[misc]


class TestValidateFailureEventMap:
    def test_valid_map_returned(self) -> None:
        events = {"a": event("a"), "b": event("b", cause_id="a")}

        assert validate_failure_event_map(events) is events

    def test_mismatched_key_refused(self) -> None:
        with pytest.raises(ValueError, match="keyed"):
            validate_failure_event_map({"a": event("b")})

    def test_dangling_cause_refused(self) -> None:
        with pytest.raises(ValueError, match="not in the report"):
            validate_failure_event_map({"a": event("a", cause_id="gone")})


class TestFailureReport:
    def test_empty_report(self) -> None:
        assert FailureReport().model_dump(mode="json") == {"events": {}}

    def test_wire_form_leaves_event_ids_to_the_key(self) -> None:
        wire = json.loads(report(event("a"), failure_id="a").model_dump_json())

        assert wire == {
            "events": {
                "a": {"boundary": "model", "failure_kind": "model_server_error", "failure_reason": ""}
            },
            "failure_id": "a",
        }

    def test_event_id_restored_from_the_key(self) -> None:
        restored = FailureReport.model_validate(
            {"events": {"a": {"boundary": "model", "failure_kind": "model_server_error"}}}
        )

        assert restored.events["a"].event_id == "a"

    def test_event_id_matching_its_key_accepted(self) -> None:
        restored = FailureReport.model_validate(
            {"events": {"a": {"event_id": "a", "boundary": "model", "failure_kind": "model_server_error"}}}
        )

        assert restored.events["a"].event_id == "a"

    def test_mismatched_key_refused(self) -> None:
        with pytest.raises(ValidationError, match="keyed"):
            FailureReport.model_validate(
                {
                    "events": {
                        "a": {"event_id": "b", "boundary": "model", "failure_kind": "model_server_error"}
                    }
                }
            )

    def test_mismatched_key_refused_for_an_event_object(self) -> None:
        with pytest.raises(ValidationError, match="keyed"):
            FailureReport(events={"a": event("b")})

    def test_failure_id_must_name_an_event(self) -> None:
        with pytest.raises(ValidationError, match="names no event"):
            report(event("a"), failure_id="b")

    def test_failure_id_at_128_accepted(self) -> None:
        event_id = "f" * 128

        assert report(event(event_id), failure_id=event_id).failure_id == event_id

    def test_failure_id_at_129_refused(self) -> None:
        event_id = "f" * 129

        with pytest.raises(ValidationError, match="failure_id"):
            FailureReport(failure_id=event_id)

    def test_dangling_cause_refused(self) -> None:
        with pytest.raises(ValidationError, match="not in the report"):
            report(event("a", cause_id="gone"))

    def test_self_cycle_refused(self) -> None:
        with pytest.raises(ValidationError, match="cycle"):
            report(event("a", cause_id="a"))

    def test_two_cycle_refused(self) -> None:
        with pytest.raises(ValidationError, match="cycle"):
            report(event("a", cause_id="b"), event("b", cause_id="a"))

    def test_long_cycle_refused(self) -> None:
        events = [event(f"e{i}", cause_id=f"e{(i + 1) % 50}") for i in range(50)]

        with pytest.raises(ValidationError, match="cycle"):
            report(*events)

    def test_cycle_behind_a_chain_refused(self) -> None:
        with pytest.raises(ValidationError, match="cycle"):
            report(event("top", cause_id="a"), event("a", cause_id="b"), event("b", cause_id="a"))

    def test_long_chain_accepted(self) -> None:
        events = [event(f"e{i}", cause_id=f"e{i + 1}" if i < 199 else None) for i in range(200)]

        assert len(report(*events, failure_id="e0").events) == 200

    def test_extra_fields_forbidden(self) -> None:
        with pytest.raises(ValidationError, match="extra"):
            FailureReport.model_validate({"events": {}, "dropped": 3})

    def test_omitted_kept_on_the_wire(self) -> None:
        assert json.loads(FailureReport(omitted=True).model_dump_json()) == {"events": {}, "omitted": True}
        assert round_trip(FailureReport(omitted=True)).omitted

    def test_unregistered_kind_in_an_event_refused(self) -> None:
        with pytest.raises(ValidationError, match="unregistered"):
            FailureReport.model_validate({"events": {"a": {"boundary": "model", "failure_kind": "legacy"}}})


class TestMerged:
    def test_adds_the_other_events(self) -> None:
        merged = report(event("a"), failure_id="a").merged(report(event("b")))

        assert set(merged.events) == {"a", "b"}

    def test_keeps_the_first_copy_of_an_id(self) -> None:
        first = event("a", failure_reason="first")
        second = event("a", failure_reason="second")

        merged = report(first).merged(report(second))

        assert merged.events["a"] is first

    def test_keeps_this_reports_failure_id(self) -> None:
        merged = report(event("a"), failure_id="a").merged(report(event("b"), failure_id="b"))

        assert merged.failure_id == "a"

    def test_keeps_no_failure_id_when_this_report_has_none(self) -> None:
        merged = report(event("a")).merged(report(event("b"), failure_id="b"))

        assert merged.failure_id is None

    @pytest.mark.parametrize(("mine", "theirs"), [(True, False), (False, True), (True, True)])
    def test_keeps_omitted_if_either_had_it(self, mine: bool, theirs: bool) -> None:
        assert report(event("a"), omitted=mine).merged(report(omitted=theirs)).omitted
        assert report(omitted=mine).merged(report(event("b"), omitted=theirs)).omitted

    def test_not_omitted_if_neither_had_it(self) -> None:
        assert not report(event("a")).merged(report(event("b"))).omitted

    def test_leaves_both_reports_unchanged(self) -> None:
        mine = report(event("a"), failure_id="a")
        theirs = report(event("b"), omitted=True)
        before = (mine.model_dump(), theirs.model_dump())

        mine.merged(theirs)

        assert (mine.model_dump(), theirs.model_dump()) == before

    def test_result_validates(self) -> None:
        mine = report(event("a", cause_id="b"), event("b"), failure_id="a")
        theirs = report(event("c", cause_id="b"), event("b", failure_reason="other copy"), failure_id="c")

        merged = mine.merged(theirs)

        assert round_trip(merged) == merged
        assert FailureReport.model_validate(merged.model_dump()) == merged

    @settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
    @given(mine=failure_reports(), theirs=failure_reports())
    def test_result_of_any_two_reports_validates(self, mine: FailureReport, theirs: FailureReport) -> None:
        merged = mine.merged(theirs)

        assert round_trip(merged) == merged
        assert merged.failure_id == mine.failure_id
        assert merged.omitted == (mine.omitted or theirs.omitted)
        assert set(merged.events) == set(mine.events) | set(theirs.events)
        for event_id, kept in merged.events.items():
            assert kept == mine.events.get(event_id, theirs.events.get(event_id))


class TestEpisodeFailure:
    def test_serializes_without_null_kind_and_stage(self) -> None:
        failure = EpisodeFailure(failure_reason="lost reply", terminal=False)

        assert failure.model_dump() == {"failure_reason": "lost reply", "terminal": False}
        assert json.loads(failure.model_dump_json()) == {"failure_reason": "lost reply", "terminal": False}

    def test_serializes_kind_and_stage_when_given(self) -> None:
        failure = EpisodeFailure(
            failure_kind="judge_failed", failure_reason="", stage="verification", terminal=True
        )

        assert failure.model_dump() == {
            "failure_kind": "judge_failed",
            "failure_reason": "",
            "stage": "verification",
            "terminal": True,
        }

    def test_keeps_a_legacy_kind_with_a_warning(
        self, warned: set[str], caplog: pytest.LogCaptureFixture
    ) -> None:
        failure = EpisodeFailure(failure_kind="legacy_label", failure_reason="", terminal=True)

        messages = [
            r.getMessage()
            for r in caplog.records
            if r.name == failure_kinds.__name__ and r.levelno == logging.WARNING
        ]
        assert failure.failure_kind == "legacy_label"
        assert len(messages) == 1
        assert "legacy_label" in messages[0]

    def test_round_trip(self) -> None:
        failure = EpisodeFailure(
            failure_kind="judge_failed", failure_reason="r", stage="agent", terminal=True
        )

        assert EpisodeFailure.model_validate_json(failure.model_dump_json()) == failure

    def test_reason_at_2000_accepted(self) -> None:
        assert len(EpisodeFailure(failure_reason="r" * 2000, terminal=True).failure_reason) == 2000

    def test_reason_at_2001_refused(self) -> None:
        with pytest.raises(ValidationError, match="failure_reason"):
            EpisodeFailure(failure_reason="r" * 2001, terminal=True)

    def test_terminal_required(self) -> None:
        with pytest.raises(ValidationError, match="terminal"):
            EpisodeFailure.model_validate({"failure_reason": ""})

    def test_extra_fields_forbidden(self) -> None:
        with pytest.raises(ValidationError, match="extra"):
            EpisodeFailure.model_validate({"failure_reason": "", "terminal": True, "retryable": True})


@st.composite
def _damaged_reports(draw: st.DrawFn) -> Any:
    """A valid report's JSON with one value anywhere in it replaced or added, or any JSON at all.

    The new value is arbitrary JSON or one that is valid somewhere else in a report (another
    event's id, a kind, a boundary), so the damage reaches the cross-field rules too.
    """
    if draw(st.integers(0, 4)) == 0:
        return draw(json_values())
    data: Any = json.loads(draw(failure_reports()).model_dump_json())
    ids = sorted(data["events"])
    value = draw(
        st.one_of(
            json_values(),
            st.sampled_from([*ids, "sandbox", "model", "agent", "judge_failed", "empty_answer", 600, 99]),
        )
    )
    target = draw(st.sampled_from(objects_in(data)))
    key = draw(
        st.sampled_from(
            [*target, "event_id", "cause_id", "failure_id", "details", "boundary", "failure_kind", "x"]
        )
    )
    target[key] = value
    return data


class TestProperties:
    @settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
    @given(original=failure_reports())
    def test_json_round_trip_is_exact(self, original: FailureReport) -> None:
        restored = round_trip(original)

        assert restored == original
        assert restored.model_dump_json() == original.model_dump_json()

    @settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
    @given(original=failure_reports())
    def test_python_round_trip_is_exact(self, original: FailureReport) -> None:
        assert FailureReport.model_validate(original.model_dump()) == original

    @settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
    @given(data=_damaged_reports())
    def test_validate_returns_or_raises_validation_error(self, data: Any) -> None:
        """From Python data and from its JSON text alike."""
        with contextlib.suppress(ValidationError):
            FailureReport.model_validate(data)
        with contextlib.suppress(ValidationError):
            FailureReport.model_validate_json(json.dumps(data))
