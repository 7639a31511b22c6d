"""The failure header and the terminal stream event's field: the bound, escaping, decoders that never
raise, kinds from peers on other versions, round trips."""

from __future__ import annotations

import json
import logging
import types
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy
from starlette.datastructures import Headers

from gym_failures.failure_records import FailureEvent, FailureReport
from gym_failures.failure_transport import UNREGISTERED_KIND_PREFIX, FailureHeader, FailureReportRow
from tests.strategies import failure_reports, json_values, objects_in

NAME = FailureHeader.NAME
OMITTED_VALUE = '{"omitted": true}'
CANARY = "sk-CANARY-42"


def _event(event_id: str, **fields: Any) -> FailureEvent:
    data: dict[str, Any] = {"event_id": event_id, "boundary": "model", "failure_kind": "model_server_error"}
    data.update(fields)
    return FailureEvent.model_validate(data)


def _chain() -> FailureReport:
    cause = _event(
        "cause-1", boundary="sandbox", failure_kind="provider_oom_killed", failure_reason="exit 137"
    )
    failure = _event("failure-1", cause_id="cause-1", http_status=502, failure_reason="tool run failed")
    return FailureReport(events={"cause-1": cause, "failure-1": failure}, failure_id="failure-1")


def _sized_report(size: int) -> FailureReport:
    """A report whose compact JSON is exactly `size` bytes; ASCII reasons, so escaping adds nothing."""
    ids = [f"event-{index}" for index in range(4)]
    base = FailureReport(events={i: _event(i) for i in ids}, failure_id=ids[0])
    missing = size - len(base.model_dump_json())
    events = {}
    for event_id in ids:
        # Every reason is present on the wire (as ""), so each character added is one byte more.
        take = min(missing, 2000)
        events[event_id] = _event(event_id, failure_reason="r" * take)
        missing -= take
    assert missing == 0, "size out of reach of four reasons"
    report = FailureReport(events=events, failure_id=ids[0])
    assert len(report.model_dump_json()) == size
    return report


def _header_size(report: FailureReport) -> int:
    """The size of the header value `encode` should send, computed without the code under test."""
    text = json.dumps(report.model_dump(mode="json"), ensure_ascii=True, separators=(",", ":"))
    return len(text.replace("\x7f", "\\u007f"))


def _stream_size(report: FailureReport) -> int:
    text = json.dumps(report.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8"))


def _wire(report: FailureReport) -> dict[str, Any]:
    wire: dict[str, Any] = json.loads(report.model_dump_json())
    return wire


def _decode_header(wire: Any) -> FailureReport | None:
    return FailureHeader.decode({NAME: json.dumps(wire)})


def _decode_stream(wire: Any) -> FailureReport | None:
    # A stream event arrives as text and is parsed before its field is read.
    return FailureHeader.decode_stream_event(json.loads(json.dumps({FailureHeader.STREAM_FIELD: wire})))


def _decode_row(wire: dict[str, Any]) -> FailureReport:
    row = {
        FailureReportRow.EVENTS: wire["events"],
        FailureReportRow.FAILURE_ID: wire.get("failure_id"),
        FailureReportRow.OMITTED: wire.get("omitted", False),
    }
    return FailureReportRow.report(json.loads(json.dumps(row)))


DECODE_PATHS: list[Any] = [
    pytest.param(_decode_header, id="header"),
    pytest.param(_decode_stream, id="stream"),
    pytest.param(_decode_row, id="row"),
]


# --- names and encoding ---------------------------------------------------------------------------


def test_names_and_bound_are_as_documented() -> None:
    assert FailureHeader.NAME == "X-NG-Failure-Report"
    assert FailureHeader.MAX_BYTES == 4096
    assert FailureHeader.STREAM_FIELD == "nemo_gym_failure_report"


def test_empty_report_sends_no_header() -> None:
    assert FailureHeader.encode(FailureReport()) == {}


def test_report_with_only_omitted_is_still_sent() -> None:
    """A hop below lost events; the hops above must learn it even though no event is left."""
    decoded = FailureHeader.decode(FailureHeader.encode(FailureReport(omitted=True)))

    assert decoded == FailureReport(omitted=True)


def test_encode_gives_one_header_holding_the_report() -> None:
    report = _chain()

    headers = FailureHeader.encode(report)

    assert list(headers) == [NAME]
    assert FailureReport.model_validate_json(headers[NAME]) == report


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("line one\r\nline two", id="crlf"),
        pytest.param("line one\nline two", id="lf"),
        pytest.param("tab\tand nul\x00", id="control"),
        pytest.param("naïve café", id="latin-1"),
        pytest.param("模型超时", id="cjk"),
        pytest.param("emoji 🚀", id="astral"),
        pytest.param("line\u2028separator", id="unicode-line-separator"),
        pytest.param("del\x7fbyte", id="del"),
    ],
)
def test_header_value_is_printable_ascii_and_keeps_the_text(text: str) -> None:
    """Field values allow visible ASCII only (RFC 9110; h11 refuses DEL), so everything else is escaped."""
    report = FailureReport(events={"e": _event("e", failure_reason=text)}, failure_id="e")

    value = FailureHeader.encode(report)[NAME]

    assert all(" " <= char <= "~" for char in value)
    assert FailureHeader.decode({NAME: value}) == report


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(report=failure_reports())
def test_header_value_is_always_bounded_printable_ascii(report: FailureReport) -> None:
    for value in FailureHeader.encode(report).values():
        assert len(value) <= FailureHeader.MAX_BYTES
        assert all(" " <= char <= "~" for char in value)


# --- the bound ------------------------------------------------------------------------------------


def test_report_exactly_at_the_bound_is_sent_whole() -> None:
    report = _sized_report(FailureHeader.MAX_BYTES)

    value = FailureHeader.encode(report)[NAME]

    assert len(value) == FailureHeader.MAX_BYTES
    assert FailureHeader.decode({NAME: value}) == report


def test_report_one_byte_over_the_bound_is_sent_as_omitted() -> None:
    headers = FailureHeader.encode(_sized_report(FailureHeader.MAX_BYTES + 1))

    assert headers == {NAME: OMITTED_VALUE}
    assert FailureHeader.decode(headers) == FailureReport(omitted=True)


def test_bound_applies_to_the_escaped_value() -> None:
    """1500 "é" are 3000 bytes of UTF-8 JSON, but 9000 once escaped to ASCII for the header."""
    report = FailureReport(events={"e": _event("e", failure_reason="é" * 1500)})
    assert len(report.model_dump_json().encode()) < FailureHeader.MAX_BYTES

    assert FailureHeader.encode(report) == {NAME: OMITTED_VALUE}


def test_value_over_the_bound_is_read_as_omitted() -> None:
    """No conforming peer sends one; reading it would cost what the bound exists to avoid."""
    value = _sized_report(FailureHeader.MAX_BYTES + 1).model_dump_json()

    assert FailureHeader.decode({NAME: value}) == FailureReport(omitted=True)


# --- decode: mappings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["X-NG-Failure-Report", "x-ng-failure-report", "X-Ng-Failure-Report", "X-NG-FAILURE-REPORT"]
)
def test_decode_reads_a_plain_dict_whatever_the_case(name: str) -> None:
    report = _chain()

    assert FailureHeader.decode({"content-type": "text/plain", name: report.model_dump_json()}) == report


HEADER_MAPPINGS: list[Any] = [
    pytest.param(lambda items: CIMultiDictProxy(CIMultiDict(items)), id="aiohttp-CIMultiDictProxy"),
    pytest.param(httpx.Headers, id="httpx-Headers"),
    pytest.param(lambda items: Headers(headers=items), id="starlette-Headers"),
    pytest.param(lambda items: types.MappingProxyType({k.lower(): v for k, v in items.items()}), id="proxy"),
]


@pytest.mark.parametrize("make", HEADER_MAPPINGS)
def test_decode_reads_header_mappings(make: Callable[[dict[str, str]], Mapping[str, str]]) -> None:
    report = _chain()

    headers = make({"Content-Type": "text/plain", NAME: report.model_dump_json()})

    assert FailureHeader.decode(headers) == report


@pytest.mark.parametrize("headers", [None, {}, {"content-type": "application/json"}])
def test_decode_without_the_header_is_none(headers: Mapping[str, str] | None) -> None:
    assert FailureHeader.decode(headers) is None


# --- decode: invalid values -----------------------------------------------------------------------


def _one_event(fields: dict[str, Any] | None = None, *, key: str = "a", failure_id: str | None = None) -> str:
    """A header value holding one model event keyed `key`, with `fields` on top, valid or not."""
    body: dict[str, Any] = {"boundary": "model", "failure_kind": "model_server_error", **(fields or {})}
    wire: dict[str, Any] = {"events": {key: body}}
    if failure_id is not None:
        wire["failure_id"] = failure_id
    return json.dumps(wire)


_CYCLE = {
    "events": {
        "a": {"boundary": "model", "failure_kind": "model_server_error", "cause_id": "b"},
        "b": {"boundary": "model", "failure_kind": "model_server_error", "cause_id": "a"},
    }
}

INVALID_VALUES: list[Any] = [
    pytest.param("{not json", id="bad-json"),
    pytest.param("", id="empty"),
    pytest.param("null", id="null"),
    pytest.param("[]", id="list"),
    pytest.param('"a string"', id="string"),
    pytest.param("42", id="number"),
    pytest.param('{"events":[]}', id="events-list"),
    pytest.param('{"events":{"a":1}}', id="event-number"),
    pytest.param('{"events":{},"extra":1}', id="extra-field"),
    pytest.param('{"events":{},"omitted":"maybe"}', id="omitted-not-bool"),
    pytest.param(_one_event(failure_id="b"), id="failure-id-names-no-event"),
    pytest.param(json.dumps(_CYCLE), id="cycle"),
    pytest.param(_one_event({"cause_id": "a"}), id="self-cause"),
    pytest.param(_one_event({"cause_id": "gone"}), id="dangling-cause"),
    pytest.param(_one_event({"event_id": "b"}), id="id-differs-from-key"),
    pytest.param(_one_event({"http_status": 600}), id="status-out-of-range"),
    pytest.param(_one_event({"failure_reason": "r" * 2001}), id="long-reason"),
    pytest.param(_one_event(key="i" * 129), id="long-id"),
    pytest.param(_one_event({"boundary": "moon"}), id="unknown-boundary"),
    pytest.param(_one_event({"boundary": "agent", "details": {}}), id="details-without-a-schema"),
    pytest.param(_one_event({"details": {"exit_code": 1}}), id="wrong-details-schema"),
    pytest.param(_one_event().replace('"a"', '"\\ud800"'), id="lone-surrogate"),
    pytest.param("[" * 2000 + "]" * 2000, id="deep-nesting"),
]


@pytest.mark.parametrize("value", INVALID_VALUES)
def test_invalid_value_is_read_as_omitted(value: str) -> None:
    assert FailureHeader.decode({NAME: value}) == FailureReport(omitted=True)


@pytest.mark.parametrize("value", [42, 4.2, ["{}"], {"events": {}}, object()])
def test_value_that_is_not_a_string_is_read_as_omitted(value: Any) -> None:
    assert FailureHeader.decode({NAME: value}) == FailureReport(omitted=True)


class _BrokenHeaders(Mapping[str, str]):
    def __getitem__(self, key: str) -> str:
        raise RuntimeError("broken")

    def __iter__(self) -> Any:
        raise RuntimeError("broken")

    def __len__(self) -> int:
        return 1


def test_mapping_that_raises_is_read_as_omitted() -> None:
    assert FailureHeader.decode(_BrokenHeaders()) == FailureReport(omitted=True)


@st.composite
def _small_wires(draw: st.DrawFn) -> dict[str, Any]:
    """A valid report's wire form with short texts, so that damage to it is not hidden by the bound."""
    ids = draw(st.lists(st.text(min_size=1, max_size=6), unique=True, max_size=4))
    events: dict[str, Any] = {}
    for index, event_id in enumerate(ids):
        boundary = draw(st.sampled_from(["model", "sandbox", "agent", "collection"]))
        body: dict[str, Any] = {
            "boundary": boundary,
            "failure_kind": draw(st.sampled_from(["model_server_error", "agent_limit", "judge:odd"])),
            "failure_reason": draw(st.text(max_size=10)),
        }
        if index and draw(st.booleans()):
            body["cause_id"] = draw(st.sampled_from(ids[:index]))
        if draw(st.booleans()):
            body["http_status"] = draw(st.integers(100, 599))
        if draw(st.booleans()):
            body["stage"] = draw(st.sampled_from(["admission", "agent", "verification"]))
        if boundary == "sandbox" and draw(st.booleans()):
            body["details"] = {"exit_code": draw(st.integers(-1, 255)), "provider": "daytona"}
        if boundary == "model" and draw(st.booleans()):
            body["details"] = {"request_upload_complete": draw(st.booleans())}
        if draw(st.booleans()):
            body["foreign_error"] = {
                "exception_type": "openai.APIError",
                "message": draw(st.text(max_size=8)),
            }
        events[event_id] = body
    wire: dict[str, Any] = {"events": events}
    if draw(st.booleans()) and ids:
        wire["failure_id"] = draw(st.sampled_from(ids))
    if draw(st.booleans()):
        wire["omitted"] = draw(st.booleans())
    return wire


@st.composite
def _damaged_wires(draw: st.DrawFn) -> Any:
    """A valid wire form with one value anywhere in it replaced or added, or any JSON at all; the new
    value is sometimes one valid elsewhere (an id, a kind, a boundary), to reach the cross-field rules."""
    if draw(st.integers(0, 4)) == 0:
        return draw(json_values())
    wire = draw(_small_wires())
    replacement = draw(
        st.one_of(
            json_values(),
            st.sampled_from([*wire["events"], "sandbox", "new_kind", "Not A Kind", "empty_answer", 600]),
        )
    )
    target = draw(st.sampled_from(objects_in(wire)))
    key = draw(st.sampled_from([*target, "event_id", "cause_id", "failure_id", "details", "failure_kind"]))
    target[key] = replacement
    return wire


@given(wire=_small_wires())
def test_small_wires_are_valid(wire: dict[str, Any]) -> None:
    """The damage below starts from valid reports, so that it reaches every rule."""
    assert _decode_header(wire) == FailureReport.model_validate(wire)


@settings(max_examples=300)
@given(value=st.text())
def test_decode_never_raises_on_any_text(value: str) -> None:
    assert isinstance(FailureHeader.decode({NAME: value}), FailureReport)


@settings(max_examples=100)
@given(value=st.binary())
def test_decode_never_raises_on_any_bytes(value: bytes) -> None:
    assert isinstance(FailureHeader.decode({NAME: value}), FailureReport)  # type: ignore[dict-item]


@settings(max_examples=300)
@given(wire=_damaged_wires())
def test_decode_never_raises_on_any_json(wire: Any) -> None:
    decoded = FailureHeader.decode({NAME: json.dumps(wire)})

    assert isinstance(decoded, FailureReport)
    event("omitted" if decoded.omitted else "read")


@settings(max_examples=300)
@given(wire=_damaged_wires())
def test_decode_stream_event_never_raises_on_any_json(wire: Any) -> None:
    decoded = _decode_stream(wire)

    assert wire is None or isinstance(decoded, FailureReport)


# --- kinds from peers on other versions -----------------------------------------------------------


@pytest.mark.parametrize("decode", DECODE_PATHS)
def test_unregistered_kind_from_a_peer_is_kept_under_its_namespace(
    decode: Callable[[Any], FailureReport | None],
) -> None:
    wire = _wire(_chain())
    wire["events"]["cause-1"]["failure_kind"] = "provider_gpu_lost"

    decoded = decode(wire)

    assert decoded is not None
    assert not decoded.omitted
    assert decoded.events["cause-1"].failure_kind == UNREGISTERED_KIND_PREFIX + "provider_gpu_lost"
    assert decoded.events["failure-1"] == _chain().events["failure-1"]


@pytest.mark.parametrize("decode", DECODE_PATHS)
@pytest.mark.parametrize("kind", ["Not A Kind", "", "provider-gpu-lost", "a:b:c"])
def test_kind_that_is_not_a_name_still_makes_the_value_invalid(
    decode: Callable[[Any], FailureReport | None], kind: str
) -> None:
    wire = _wire(_chain())
    wire["events"]["cause-1"]["failure_kind"] = kind

    assert decode(wire) == FailureReport(omitted=True)


@pytest.mark.parametrize("decode", DECODE_PATHS)
def test_unregistered_kind_does_not_excuse_another_fault(
    decode: Callable[[Any], FailureReport | None],
) -> None:
    wire = _wire(_chain())
    wire["events"]["cause-1"]["failure_kind"] = "provider_gpu_lost"
    wire["events"]["cause-1"]["http_status"] = 99

    assert decode(wire) == FailureReport(omitted=True)


# --- round trips ----------------------------------------------------------------------------------


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(report=failure_reports())
def test_header_round_trip_is_exact_under_the_bound(report: FailureReport) -> None:
    decoded = FailureHeader.decode(FailureHeader.encode(report))

    if not report.events and not report.omitted:
        assert decoded is None
    elif _header_size(report) <= FailureHeader.MAX_BYTES:
        event("under the bound")
        assert decoded == report
    else:
        event("over the bound")
        assert decoded == FailureReport(omitted=True)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(report=failure_reports())
def test_stream_round_trip_is_exact_under_the_bound(report: FailureReport) -> None:
    value = FailureHeader.stream_value(report)

    if not report.events and not report.omitted:
        assert value is None
    elif _stream_size(report) <= FailureHeader.MAX_BYTES:
        event("under the bound")
        assert _decode_stream(value) == report
    else:
        event("over the bound")
        assert value == {"omitted": True}
        assert _decode_stream(value) == FailureReport(omitted=True)


def test_stream_value_exactly_at_the_bound_is_sent_whole() -> None:
    report = _sized_report(FailureHeader.MAX_BYTES)

    value = FailureHeader.stream_value(report)

    assert value == report.model_dump(mode="json")
    assert _decode_stream(value) == report


def test_stream_value_one_byte_over_the_bound_is_sent_as_omitted() -> None:
    assert FailureHeader.stream_value(_sized_report(FailureHeader.MAX_BYTES + 1)) == {"omitted": True}


def test_stream_event_over_the_bound_is_read_as_omitted() -> None:
    wire = _wire(_sized_report(FailureHeader.MAX_BYTES + 1))

    assert _decode_stream(wire) == FailureReport(omitted=True)


@pytest.mark.parametrize(
    "payload", [None, {}, {"type": "response.completed"}, ["not", "a", "mapping"], "text"]
)
def test_stream_event_without_the_field_is_none(payload: Any) -> None:
    assert FailureHeader.decode_stream_event(payload) is None


def test_stream_field_of_the_wrong_shape_is_read_as_omitted() -> None:
    assert FailureHeader.decode_stream_event({FailureHeader.STREAM_FIELD: "{}"}) == FailureReport(
        omitted=True
    )


def test_stream_value_is_json_ready() -> None:
    value = FailureHeader.stream_value(_chain())

    assert json.loads(json.dumps(value)) == value


# --- logging --------------------------------------------------------------------------------------

CANARY_VALUES: list[Any] = [
    pytest.param(_one_event({"failure_kind": "Bad Kind"}, key=CANARY), id="event-id"),
    pytest.param(_one_event({CANARY: 1}), id="unknown-field"),
    pytest.param(_one_event({"failure_reason": CANARY, "cause_id": "gone"}), id="reason"),
    pytest.param(_one_event({"http_status": CANARY}), id="wrong-type"),
    pytest.param('{"' + CANARY + '": [', id="bad-json"),
]


@pytest.mark.parametrize("value", CANARY_VALUES)
def test_invalid_value_is_logged_without_its_content(value: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    assert FailureHeader.decode({NAME: value}) == FailureReport(omitted=True)

    assert caplog.records, "an invalid value is logged"
    assert CANARY not in caplog.text


def test_invalid_stream_event_is_logged_without_its_content(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wire = {"events": {CANARY: {"boundary": "model", "failure_kind": "Bad Kind", "failure_reason": CANARY}}}

    assert _decode_stream(wire) == FailureReport(omitted=True)

    assert caplog.records
    assert CANARY not in caplog.text


def test_invalid_log_names_the_failing_field(caplog: pytest.LogCaptureFixture) -> None:
    """Content is left out, but the schema's own names are kept, so the log still says what broke."""
    value = _one_event({"http_status": 600}, key=CANARY)

    FailureHeader.decode({NAME: value})

    assert "events.*.http_status" in caplog.text


def test_a_non_ascii_value_over_the_byte_bound_is_omitted() -> None:
    """The bound is bytes: 2,100 characters of two-byte UTF-8 are over 4,096 bytes."""
    value = '{"events": {}, "note": "' + "é" * 2100 + '"}'
    assert len(value) <= FailureHeader.MAX_BYTES < len(value.encode())
    report = FailureHeader.decode({FailureHeader.NAME: value})
    assert report == FailureReport(omitted=True)


def test_a_header_holding_undecodable_bytes_is_omitted_not_raised() -> None:
    """aiohttp hands undecodable header bytes over as surrogate escapes."""
    report = FailureHeader.decode({FailureHeader.NAME: '{"omitted":\udcff}'})
    assert report == FailureReport(omitted=True)
    long = FailureHeader.decode({FailureHeader.NAME: '{"omitted": true, "x": "' + "\udcff" * 5000 + '"}'})
    assert long == FailureReport(omitted=True)


# Hypothesis leaves lone surrogates out of text unless asked: aiohttp hands undecodable header bytes
# over as surrogate escapes, and a peer's text can hold any code point.
ANY_CODE_POINT = st.characters(exclude_categories=())


@given(value=st.text(ANY_CODE_POINT))
def test_decode_never_raises_on_text_with_lone_surrogates(value: str) -> None:
    assert isinstance(FailureHeader.decode({NAME: value}), FailureReport)


@pytest.mark.parametrize("value", ["\ud800", '{"omitted": true, "x": "\udcff"}', "\udcff" * 5000])
def test_a_lone_surrogate_in_a_header_is_read_as_omitted(value: str) -> None:
    assert FailureHeader.decode({NAME: value}) == FailureReport(omitted=True)
