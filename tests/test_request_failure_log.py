"""The per-request failure log: its scope, its bound, the observe functions and the reply's report."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gym_failures import AgentFailure, ModelFailure, SandboxFailure
from gym_failures.failure_records import FailureEvent, FailureReport, validate_failure_event_map
from gym_failures.failure_transport import (
    FailureHeader,
    ModelOperationObservation,
    RequestFailureLog,
    observe_failure,
    observe_model_operation,
    observe_reply,
    reply_failure_report,
    report_for_current_request,
)
from gym_failures.failures import NgFailureEvent

MAX = RequestFailureLog.MAX_EVENTS


def _event(event_id: str, cause_id: str | None = None) -> FailureEvent:
    return FailureEvent(
        event_id=event_id, boundary="model", failure_kind="model_server_error", cause_id=cause_id
    )


def _independent(prefix: str, count: int, *, omitted: bool = False) -> FailureReport:
    """`count` events without causes."""
    events = {f"{prefix}{index}": _event(f"{prefix}{index}") for index in range(count)}
    return FailureReport(events=events, omitted=omitted)


def _chained(prefix: str, count: int) -> FailureReport:
    """`count` events, each caused by the one before."""
    events: dict[str, FailureEvent] = {}
    for index in range(count):
        event_id = f"{prefix}{index}"
        events[event_id] = _event(event_id, f"{prefix}{index - 1}" if index else None)
    return FailureReport(events=events, failure_id=f"{prefix}{count - 1}")


def _raised_chain() -> AgentFailure:
    """An agent failure caused by a model failure caused by a sandbox failure, as raised."""
    try:
        try:
            try:
                raise SandboxFailure(failure_kind="provider_oom_killed", failure_reason="exit 137")
            except SandboxFailure as oom:
                raise ModelFailure(failure_kind="model_server_error", http_status=502) from oom
        except ModelFailure as model:
            raise AgentFailure(failure_kind="agent_request_failed") from model
    except AgentFailure as failure:
        return failure


def _chain_ids(failure: NgFailureEvent) -> list[str]:
    ids = []
    current: BaseException | None = failure
    while isinstance(current, NgFailureEvent):
        ids.append(current.event_id)
        current = current.__cause__
    return ids


# --- scope ----------------------------------------------------------------------------------------


def test_no_log_outside_a_request() -> None:
    assert RequestFailureLog.current() is None


def test_capture_makes_a_new_log_current_and_ends_it() -> None:
    with RequestFailureLog.capture() as log:
        assert RequestFailureLog.current() is log
        assert log.report == FailureReport()

    assert RequestFailureLog.current() is None


def test_nested_capture_restores_the_previous_log() -> None:
    with RequestFailureLog.capture() as outer:
        with RequestFailureLog.capture() as inner:
            assert inner is not outer
            assert RequestFailureLog.current() is inner
        assert RequestFailureLog.current() is outer


def test_capture_restores_the_previous_log_when_the_request_raises() -> None:
    with RequestFailureLog.capture() as outer:
        with pytest.raises(RuntimeError), RequestFailureLog.capture():
            raise RuntimeError("handler failed")
        assert RequestFailureLog.current() is outer


async def test_concurrent_requests_each_see_only_their_own_log() -> None:
    """One request's failures never appear in another's reply, however their awaits interleave."""

    async def request(number: int) -> tuple[set[str], FailureReport]:
        with RequestFailureLog.capture():
            own: set[str] = set()
            for attempt in range(number % 4 + 1):
                failure = ModelFailure(failure_kind="model_server_error", attempt_id=f"{number}-{attempt}")
                own.add(failure.event_id)
                observe_failure(failure)
                await asyncio.sleep(0)
            return own, report_for_current_request(None)

    results = await asyncio.gather(*(request(number) for number in range(100)))

    for own, report in results:
        assert set(report.events) == own


async def test_tasks_started_inside_a_request_record_into_its_log() -> None:
    """A request that fans out (`gather` copies the context) still gets every sub-call's failures."""

    async def sub_call(number: int) -> str:
        await asyncio.sleep(0)
        failure = ModelFailure(failure_kind="model_server_error", attempt_id=str(number))
        observe_failure(failure)
        return failure.event_id

    with RequestFailureLog.capture() as log:
        ids = await asyncio.gather(*(sub_call(number) for number in range(10)))

    assert set(log.report.events) == set(ids)


# --- add and its bound ----------------------------------------------------------------------------


def test_report_that_fits_exactly_is_kept() -> None:
    log = RequestFailureLog()
    log.add(_independent("a", MAX - 4))

    log.add(_chained("b", 4))

    assert len(log.report.events) == MAX
    assert log.dropped_events == 0
    assert not log.report.omitted


def test_report_that_would_pass_the_bound_is_dropped_whole() -> None:
    log = RequestFailureLog()
    log.add(_independent("a", MAX - 4))

    log.add(_chained("b", 5))

    assert set(log.report.events) == set(_independent("a", MAX - 4).events)
    assert log.dropped_events == 5
    assert log.report.omitted


def test_every_later_report_is_counted_once_the_log_is_full() -> None:
    log = RequestFailureLog()
    log.add(_independent("a", MAX))

    log.add(_independent("b", 3))
    log.add(_chained("c", 2))

    assert log.dropped_events == 5
    assert len(log.report.events) == MAX


def test_events_already_in_the_log_are_not_added_or_counted_again() -> None:
    log = RequestFailureLog()
    log.add(_independent("a", MAX - 1))

    # Sixty-three known events and one new one: the log reaches its bound, nothing is dropped.
    log.add(_independent("a", MAX))

    assert len(log.report.events) == MAX
    assert log.dropped_events == 0


def test_known_events_of_a_dropped_report_are_not_counted() -> None:
    log = RequestFailureLog()
    log.add(_independent("a", MAX))

    log.add(FailureReport(events={**_independent("a", 2).events, **_independent("b", 3).events}))

    assert log.dropped_events == 3


def test_log_never_has_a_failure_id() -> None:
    log = RequestFailureLog()

    log.add(_chained("a", 3))

    assert log.report.failure_id is None
    assert set(log.report.events) == {"a0", "a1", "a2"}


@pytest.mark.parametrize("count", [0, 2])
def test_omitted_report_marks_the_log_omitted(count: int) -> None:
    """A hop below already lost events, whether or not any are left."""
    log = RequestFailureLog()

    log.add(_independent("a", count, omitted=True))

    assert log.report.omitted
    assert len(log.report.events) == count


@st.composite
def _log_reports(draw: st.DrawFn) -> FailureReport:
    """A valid report drawn from a small pool of ids, so that reports overlap; only ids, causes and
    `omitted` matter to the log."""
    ids = draw(st.lists(st.sampled_from([f"e{index}" for index in range(80)]), unique=True, max_size=24))
    events = {}
    for index, event_id in enumerate(ids):
        cause = draw(st.one_of(st.none(), st.sampled_from(ids[:index]))) if index else None
        events[event_id] = _event(event_id, cause)
    return FailureReport(events=events, omitted=draw(st.booleans()))


@settings(max_examples=200)
@given(reports=st.lists(_log_reports(), max_size=8))
def test_every_kept_event_keeps_its_causes(reports: list[FailureReport]) -> None:
    """Reports are kept or dropped whole, so the log stays a valid event map within its bound."""
    log = RequestFailureLog()
    kept: set[str] = set()
    dropped = 0
    for report in reports:
        log.add(report)
        new = set(report.events) - kept
        if len(kept) + len(new) > MAX:
            dropped += len(new)
        else:
            kept |= new

    validate_failure_event_map(log.report.events)
    assert set(log.report.events) == kept
    assert log.dropped_events == dropped
    assert log.report.failure_id is None
    assert log.report.omitted == (dropped > 0 or any(report.omitted for report in reports))


# --- observe_failure ------------------------------------------------------------------------------


def test_observe_failure_records_the_whole_chain_without_a_failure_id() -> None:
    failure = _raised_chain()

    with RequestFailureLog.capture() as log:
        observe_failure(failure)

    assert set(log.report.events) == set(_chain_ids(failure))
    assert log.report.failure_id is None
    assert log.report.events[failure.event_id].cause_id == failure.cause_id


def test_observe_failure_of_a_wrapper_records_the_gym_failure_under_it() -> None:
    failure = _raised_chain()
    wrapper = RuntimeError("retry gave up")
    wrapper.__cause__ = failure

    with RequestFailureLog.capture() as log:
        observe_failure(wrapper)

    assert set(log.report.events) == set(_chain_ids(failure))


def test_observe_failure_of_a_foreign_exception_records_nothing() -> None:
    with RequestFailureLog.capture() as log:
        observe_failure(ValueError("not a Gym failure"))

    assert log.report == FailureReport()


def test_observe_failure_of_what_is_not_an_exception_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RequestFailureLog.capture() as log:
        observe_failure(42)  # type: ignore[arg-type]

    assert log.report == FailureReport()
    assert "could not observe a failure" in caplog.text


# --- observe_reply --------------------------------------------------------------------------------


def test_observe_reply_records_the_forwarded_report_as_observations() -> None:
    forwarded = _chained("r", 3)

    with RequestFailureLog.capture() as log:
        observe_reply(FailureHeader.encode(forwarded))

    assert log.report.events == forwarded.events
    assert log.report.failure_id is None


@pytest.mark.parametrize("headers", [None, {}, {"content-type": "application/json"}])
def test_observe_reply_without_a_report_records_nothing(headers: dict[str, str] | None) -> None:
    with RequestFailureLog.capture() as log:
        observe_reply(headers)

    assert log.report == FailureReport()


def test_observe_reply_of_an_invalid_header_marks_the_log_omitted() -> None:
    with RequestFailureLog.capture() as log:
        observe_reply({FailureHeader.NAME: "{not json"})

    assert log.report == FailureReport(omitted=True)


# --- observe_model_operation ----------------------------------------------------------------------


def test_observe_model_operation_records_the_terminal_outcome() -> None:
    with RequestFailureLog.capture() as log:
        observe_model_operation(
            "op-1", "failed", "op-1.3", failure_id="e-3", http_attempts=3, transport_failures=1
        )

    assert log.model_operations == {
        "op-1": ModelOperationObservation(
            operation_id="op-1",
            outcome="failed",
            final_attempt_id="op-1.3",
            failure_id="e-3",
            http_attempts=3,
            transport_failures=1,
        )
    }


def test_observe_model_operation_keeps_the_latest_outcome_per_operation() -> None:
    with RequestFailureLog.capture() as log:
        observe_model_operation("op-1", "failed", "op-1.1", failure_id="e-1")
        observe_model_operation("op-1", "completed", "op-1.2")

    assert log.model_operations["op-1"].outcome == "completed"


INVALID_OPERATIONS: list[Any] = [
    pytest.param({"operation_id": ""}, id="empty-operation-id"),
    pytest.param({"operation_id": "o" * 129}, id="long-operation-id"),
    pytest.param({"outcome": "retrying"}, id="unknown-outcome"),
    pytest.param({"transport_failures": True}, id="transport-failures-bool"),
    pytest.param({"transport_failures": "3"}, id="transport-failures-text"),
    pytest.param({"transport_failures": -1}, id="transport-failures-negative"),
    pytest.param({"http_attempts": 2.0}, id="http-attempts-float"),
    pytest.param({"retry_wait_s": float("nan")}, id="retry-wait-nan"),
    pytest.param({"outcome": "completed", "failure_id": "e-1"}, id="completed-with-failure-id"),
]


@pytest.mark.parametrize("changes", INVALID_OPERATIONS)
def test_invalid_model_operation_is_dropped_and_logged(
    changes: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    arguments: dict[str, Any] = {"operation_id": "op-1", "outcome": "failed", "final_attempt_id": None}
    arguments.update(changes)

    with RequestFailureLog.capture() as log:
        observe_model_operation(**arguments)

    assert log.model_operations == {}
    assert "model operation observation" in caplog.text


def test_model_operations_are_bounded() -> None:
    log = RequestFailureLog()
    bound = RequestFailureLog._MAX_MODEL_OPERATIONS

    for number in range(bound + 3):
        log.add_model_operation(ModelOperationObservation(operation_id=f"op-{number}", outcome="completed"))

    assert len(log.model_operations) == bound
    assert log.dropped_model_operations == 3


@pytest.mark.parametrize("value", [True, "3", -1, 1.0])
def test_transport_failures_is_a_strict_non_negative_int(value: Any) -> None:
    with pytest.raises(ValidationError):
        ModelOperationObservation(operation_id="op-1", outcome="failed", transport_failures=value)


def test_transport_failures_accepts_zero_and_up() -> None:
    observation = ModelOperationObservation(operation_id="op-1", outcome="failed", transport_failures=0)

    assert observation.transport_failures == 0


def test_operation_id_is_not_empty() -> None:
    with pytest.raises(ValidationError):
        ModelOperationObservation(operation_id="", outcome="completed")


# --- outside a request ----------------------------------------------------------------------------


def test_observe_functions_are_no_ops_outside_a_request() -> None:
    observe_failure(_raised_chain())
    observe_reply(FailureHeader.encode(_chained("r", 2)))
    observe_model_operation("op-1", "completed", None)

    assert RequestFailureLog.current() is None
    with RequestFailureLog.capture() as log:
        pass
    assert log.report == FailureReport()
    assert log.model_operations == {}


def test_invalid_observations_outside_a_request_do_not_raise_or_log(caplog: pytest.LogCaptureFixture) -> None:
    """Outside a request nothing is read at all, so nothing can go wrong."""
    observe_reply({FailureHeader.NAME: "{not json"})
    observe_model_operation("", "failed", None, transport_failures=True)

    assert caplog.records == []


# --- the reply's report ---------------------------------------------------------------------------


def test_reply_report_on_success_is_the_log() -> None:
    with RequestFailureLog.capture() as log:
        observe_failure(ModelFailure(failure_kind="model_server_error"))

        report = log.reply_report(None)

    assert report == log.report
    assert report.failure_id is None


def test_reply_report_of_a_gym_failure_is_its_chain_and_the_log() -> None:
    failure = _raised_chain()
    attempt = ModelFailure(failure_kind="model_server_error", attempt_id="1")

    with RequestFailureLog.capture() as log:
        observe_failure(attempt)
        report = log.reply_report(failure)

    assert report.failure_id == failure.event_id
    assert set(report.events) == {*_chain_ids(failure), attempt.event_id}
    validate_failure_event_map(report.events)


def test_reply_report_keeps_origin_ids_and_causes() -> None:
    failure = _raised_chain()
    model = failure.__cause__
    assert isinstance(model, ModelFailure)

    with RequestFailureLog.capture() as log:
        report = log.reply_report(failure)

    assert report.events[failure.event_id].cause_id == model.event_id
    assert report.events[model.event_id].cause_id == model.cause_id
    assert report.events[model.event_id] == model.to_event()


def test_reply_report_of_a_foreign_exception_is_the_log_alone() -> None:
    attempt = ModelFailure(failure_kind="model_server_error")

    with RequestFailureLog.capture() as log:
        observe_failure(attempt)
        report = log.reply_report(KeyError("missing"))

    assert set(report.events) == {attempt.event_id}
    assert report.failure_id is None


def test_reply_failure_report_is_the_failures_chain() -> None:
    failure = _raised_chain()

    report = reply_failure_report(failure)

    assert report is not None
    assert report.failure_id == failure.event_id
    assert set(report.events) == set(_chain_ids(failure))


def test_reply_failure_report_without_events_is_none() -> None:
    assert reply_failure_report(RuntimeError("not a Gym failure")) is None


def test_report_for_current_request_merges_the_log() -> None:
    failure = _raised_chain()
    attempt = ModelFailure(failure_kind="model_server_error")

    with RequestFailureLog.capture():
        observe_failure(attempt)
        report = report_for_current_request(failure)

    assert report.failure_id == failure.event_id
    assert attempt.event_id in report.events


def test_report_for_current_request_outside_a_request_is_the_chain_alone() -> None:
    failure = _raised_chain()

    assert report_for_current_request(failure) == failure.failure_report()


@pytest.mark.parametrize("error", [None, RuntimeError("not a Gym failure")])
def test_report_for_current_request_outside_a_request_without_a_failure_is_empty(
    error: BaseException | None,
) -> None:
    assert report_for_current_request(error) == FailureReport()


def test_threads_sharing_a_log_lose_no_event() -> None:
    """`asyncio.to_thread` and thread pools share the log object with worker threads."""
    import threading

    log = RequestFailureLog()
    failures = [ModelFailure(failure_kind="model_server_error") for _ in range(60)]

    def add(part: list[NgFailureEvent]) -> None:
        for failure in part:
            log.add(failure.failure_report().model_copy(update={"failure_id": None}))

    threads = [threading.Thread(target=add, args=(failures[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(log.report.events), log.dropped_events) == (60, 0)
