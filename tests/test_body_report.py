"""`gym_failures._body_report`: the report a failure reply's body carries, read back through NeMo Gym's
quoting and bound, and the root the summary's body reader finds in it."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gym_failures._body_report import MAX_FIELD_CHARS, body_report, encode, with_body_report
from gym_failures.failure_records import FailureBoundary, FailureEvent, FailureReport
from gym_failures.reporting._roots import body_root


def _event(event_id: str, boundary: str, cause: str | None = None, reason: str = "it failed") -> FailureEvent:
    return FailureEvent(
        event_id=event_id,
        boundary=FailureBoundary(boundary),
        failure_kind="transport_peer_drop",
        failure_reason=reason,
        cause_id=cause,
    )


CHAIN = FailureReport(
    events={
        "top": _event("top", "agent", "middle", reason='POST /run: it\'s "quoted" \\ here'),
        "middle": _event("middle", "model", "endpoint"),
        "endpoint": _event("endpoint", "model"),
        "retried": _event("retried", "model"),
    },
    failure_id="top",
)
BODY = b'{"failure_kind": "transport_peer_drop", "event_id": "top", "boundary": "agent"}'


def _nemo_gym_layer(body: bytes, server: str) -> bytes:
    """What a NeMo Gym server answers for an inner server's failed reply (`setup_exception_middleware`)."""
    return json.dumps(f"Hit an exception in {server} calling an inner server: {body!r}").encode()


def _chain(report: FailureReport) -> list[tuple[str, str, str | None]]:
    return [(event_id, event.boundary.value, event.cause_id) for event_id, event in report.events.items()]


def test_the_body_carries_the_chain_with_its_root_last() -> None:
    body = with_body_report(BODY, CHAIN)
    assert body is not None
    assert body.startswith(BODY[:-1])
    read = body_report(body.decode())
    assert read is not None
    assert read.failure_id == "top"
    assert sorted(_chain(read)) == sorted(_chain(CHAIN))
    assert read.events["top"].failure_reason == CHAIN.events["top"].failure_reason
    root = body_root(body.decode())
    assert root is not None
    assert (root.event_id, root.boundary) == ("endpoint", "model")


def test_the_chain_is_read_through_nemo_gyms_quoting() -> None:
    body = with_body_report(BODY, CHAIN)
    assert body is not None
    quoted = _nemo_gym_layer(_nemo_gym_layer(body, "SimpleModelServer"), "SimpleAgent")
    read = body_report(quoted.decode())
    assert read is not None
    assert sorted(_chain(read)) == sorted(_chain(CHAIN))
    assert read.events["top"].failure_reason == CHAIN.events["top"].failure_reason
    root = body_root(quoted.decode())
    assert root is not None
    assert root.event_id == "endpoint"


def test_a_body_cut_by_nemo_gyms_bound_keeps_the_events_before_the_cut() -> None:
    body = with_body_report(BODY, CHAIN)
    assert body is not None
    cut = body.decode()[: len(body) - 40] + "…"
    read = body_report(cut)
    assert read is not None
    assert read.omitted
    assert read.failure_id == "top"
    assert all(event.cause_id is None or event.cause_id in read.events for event in read.events.values())


def test_a_long_chain_is_fitted_keeping_its_top_and_its_root() -> None:
    events = {f"e{index}": _event(f"e{index}", "agent", f"e{index + 1}", "x" * 150) for index in range(40)}
    events["e40"] = _event("e40", "model")
    field = encode(FailureReport(events=events, failure_id="e0"))
    assert field is not None
    assert len(field) <= MAX_FIELD_CHARS
    data = json.loads(field)
    assert data["omitted"] is True
    assert data["events"][0]["event_id"] == "e0"
    assert data["events"][-1]["event_id"] == "e40"


@given(st.text(max_size=300))
def test_any_text_reads_as_a_report_or_none_never_an_error(text: str) -> None:
    body_report(text)
    body_report('{"failure_report": ' + text)
