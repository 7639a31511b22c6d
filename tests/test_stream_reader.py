"""`StreamFailureReportReader` reads the report of a terminal SSE event, whatever the chunking."""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Iterable
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_failures.failure_records import FailureReport
from gym_failures.failure_transport import FailureHeader, RequestFailureLog, StreamFailureReportReader
from gym_failures.failures import ModelFailure
from tests.sse_samples import (
    ANTHROPIC_TERMINALS,
    FIELD,
    RESPONSES_TERMINALS,
    anthropic_stream,
    chunks_of,
    event,
    model_failure_report,
    responses_stream,
    with_line_ending,
)
from tests.strategies import failure_reports

MAX = StreamFailureReportReader._MAX_LINE_BYTES
ENDINGS = [b"\n", b"\r\n", b"\r"]
REPORT = model_failure_report()


class SmallReader(StreamFailureReportReader):
    """A reader whose line bound is small enough for generated streams to cross it."""

    _MAX_LINE_BYTES: ClassVar[int] = 160
    _HEAD_BYTES: ClassVar[int] = 48


class FarReader(SmallReader):
    """A reader that reads one line back before searching for an event's name from afar."""

    _WALK_STEPS: ClassVar[int] = 1


class HoldingReader(SmallReader):
    """A reader that holds chunks of generated streams and reads them a few at a time."""

    _BATCH: ClassVar[int] = 96


class FarHoldingReader(HoldingReader):
    _WALK_STEPS: ClassVar[int] = 1


READERS = [StreamFailureReportReader, SmallReader, FarReader, HoldingReader, FarHoldingReader]


def read(
    chunks: Iterable[bytes], reader_type: type[StreamFailureReportReader] = StreamFailureReportReader
) -> FailureReport | None:
    reader = reader_type()
    for chunk in chunks:
        reader.feed(chunk)
    return reader.finish()


def one_byte_at_a_time(stream: bytes) -> list[bytes]:
    return [stream[i : i + 1] for i in range(len(stream))]


def reader_by_lines(
    stream: bytes, reader_type: type[StreamFailureReportReader] = StreamFailureReportReader
) -> StreamFailureReportReader:
    """The reference: the stream split into lines as per the SSE spec, each read with `_read_line`."""
    reader = reader_type()
    stream = stream.removeprefix(b"\xef\xbb\xbf")
    for line in re.split(rb"\r\n|\r|\n", stream)[:-1]:  # the last piece is unfinished
        reader._read_line(line)
    return reader


def short_report(event_id: str = "ev1", reason: str = "overloaded") -> FailureReport:
    return ModelFailure(
        failure_kind="model_server_error", failure_reason=reason, event_id=event_id
    ).failure_report()


def terminal_line(data: dict[str, Any], size: int) -> bytes:
    """`data: <data>` padded inside its JSON to exactly `size` bytes."""
    bare = b"data: " + json.dumps({"pad": "", **data}, separators=(",", ":")).encode()
    return b"data: " + json.dumps({"pad": "x" * (size - len(bare)), **data}, separators=(",", ":")).encode()


# --- chunk boundaries ------------------------------------------------------------------------------


_PING = event("ping", {"type": "ping"}, compact=False)


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(
            responses_stream(short_report(), terminal="error", deltas=(), preamble=False), id="responses"
        ),
        pytest.param(
            _PING + anthropic_stream(short_report(), terminal="error", deltas=(), preamble=False),
            id="anthropic",
        ),
    ],
)
def test_every_pair_of_cuts_gives_the_same_report(stream: bytes) -> None:
    """Small streams (the last events of a stream), since every pair of cuts is read."""
    expected = short_report()
    assert read([stream]) == expected
    for first, second in itertools.combinations(range(1, len(stream)), 2):
        chunks = (stream[:first], stream[first:second], stream[second:])
        assert read(chunks) == expected, (first, second)


@pytest.mark.parametrize("ending", ENDINGS, ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize(
    "stream",
    [
        *(pytest.param(responses_stream(REPORT, terminal=t), id=t) for t in RESPONSES_TERMINALS),
        *(
            pytest.param(anthropic_stream(REPORT, terminal=t), id=f"anthropic-{t}")
            for t in ANTHROPIC_TERMINALS
        ),
    ],
)
def test_one_byte_at_a_time_and_every_line_ending_give_the_same_report(stream: bytes, ending: bytes) -> None:
    stream = with_line_ending(stream, ending)
    assert read([stream]) == REPORT
    assert read(one_byte_at_a_time(stream)) == REPORT
    assert read(stream[i : i + 7] for i in range(0, len(stream), 7)) == REPORT


@pytest.mark.parametrize("ending", [b"\r\n", b"\r"], ids=["crlf", "cr"])
def test_a_cr_ending_a_chunk_ends_the_line(ending: bytes) -> None:
    """As per the SSE spec a CR ends a line; an LF opening the next chunk completes the same ending."""
    stream = with_line_ending(responses_stream(REPORT, terminal="response.failed"), ending)
    data_end = stream.rindex(b"}\r") + 2
    reader = StreamFailureReportReader()
    reader.feed(stream[:data_end])
    assert reader.report == REPORT
    reader.feed(stream[data_end:])
    assert reader.finish() == REPORT
    for cut in (match.end() for match in re.finditer(rb"\r", stream)):
        assert read([stream[:cut], stream[cut:]]) == REPORT


def test_a_crlf_split_across_chunks_is_one_ending_not_a_blank_line() -> None:
    """Were the LF read as an empty line, it would close the event and lose its `error` name."""
    stream = (
        b"event: error\r\n: keep-alive\r\n" + b'data: {"' + FIELD.encode() + b'": {"omitted": true}}\r\n\r\n'
    )
    for cut in (match.end() for match in re.finditer(rb"\r", stream)):
        assert read([stream[:cut], stream[cut:]]) == FailureReport(omitted=True)


def test_a_byte_order_mark_opening_the_stream_is_ignored() -> None:
    stream = b"\xef\xbb\xbf" + responses_stream(REPORT, terminal="error", preamble=False, deltas=())
    assert read([stream]) == REPORT
    assert read(one_byte_at_a_time(stream)) == REPORT


# --- which events are evidence ---------------------------------------------------------------------


@pytest.mark.parametrize("terminal", RESPONSES_TERMINALS)
def test_a_responses_terminal_event_without_the_field_gives_none(terminal: Any) -> None:
    assert read([responses_stream(terminal=terminal)]) is None


@pytest.mark.parametrize("terminal", ANTHROPIC_TERMINALS)
def test_an_anthropic_terminal_event_without_the_field_gives_none(terminal: Any) -> None:
    assert read([anthropic_stream(terminal=terminal)]) is None


def test_the_field_in_a_delta_event_is_not_evidence() -> None:
    value = FailureHeader.stream_value(REPORT)
    delta = {"type": "response.output_text.delta", "sequence_number": 3, "delta": "Hi", FIELD: value}
    stream = responses_stream() + event("response.output_text.delta", delta)
    assert read([stream]) is None
    anthropic_delta = {"type": "content_block_delta", "index": 0, "delta": {"text": "Hi"}, FIELD: value}
    ping = {"type": "ping", FIELD: value}
    stream = anthropic_stream() + event("content_block_delta", anthropic_delta) + event("ping", ping)
    assert read([stream]) is None


def test_the_field_in_the_text_of_a_delta_is_not_evidence() -> None:
    text = f'{{"type": "error", "{FIELD}": {json.dumps(FailureHeader.stream_value(REPORT))}}}'
    stream = responses_stream(deltas=("Here is a report: ", text)) + anthropic_stream(deltas=(text,))
    assert FIELD.encode() in stream
    assert read([stream]) is None


@pytest.mark.parametrize(
    ("name", "data_type", "evidence"),
    [
        ("response.completed", "response.completed", True),
        ("message_stop", "message_stop", True),
        ("error", None, True),
        (None, "response.incomplete", True),
        (None, None, False),
        ("response.output_text.delta", None, False),
        (None, "response.output_text.delta", False),
        ("response.output_text.delta", "response.completed", False),
        ("response.completed", "response.output_text.delta", False),
        ("", "error", True),
    ],
)
def test_an_event_is_terminal_when_every_type_it_states_is(
    name: str | None, data_type: str | None, evidence: bool
) -> None:
    data: dict[str, Any] = {} if data_type is None else {"type": data_type}
    data[FIELD] = FailureHeader.stream_value(REPORT)
    stream = responses_stream() + event(name, data)
    assert read([stream]) == (REPORT if evidence else None)
    assert read(one_byte_at_a_time(stream)) == (REPORT if evidence else None)


def test_an_event_line_after_the_data_line_is_not_waited_for() -> None:
    stream = b'data: {"' + FIELD.encode() + b'": {"omitted": true}}\nevent: error\n\n'
    assert read([stream]) is None


def test_the_name_of_an_event_is_found_across_many_lines_and_chunks() -> None:
    """An event's name may be far back: comments and other fields between it and the data line."""
    report_line = b'data: {"' + FIELD.encode() + b'": {"omitted": true}}\n'
    for filler in (b": keep-alive\n" * 50, b"id: 7\n" * 50 + b"retry: 10\n", b":\r" * 3000):
        for name, expected in ((b"error", FailureReport(omitted=True)), (b"ping", None)):
            stream = b"event: " + name + b"\n" + filler + report_line + b"\n"
            assert read([stream]) == expected
            assert read(stream[i : i + 64] for i in range(0, len(stream), 64)) == expected
            assert read([stream[:9], stream[9:]]) == expected


@pytest.mark.parametrize("ending", ENDINGS, ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("comments", [1, 40])
def test_a_blank_line_ends_the_name_of_an_event(ending: bytes, comments: int) -> None:
    stream = b"event: error\n\n" + (b": keep-alive\n" * comments) + b'data: {"' + FIELD.encode() + b'": {}}\n'
    stream = with_line_ending(stream, ending)
    assert read([stream]) is None
    assert read(one_byte_at_a_time(stream)) is None
    assert read([stream[:20], stream[20:]]) is None


@pytest.mark.parametrize("comments", [1, 40])
def test_event_inside_another_line_is_not_a_name(comments: int) -> None:
    stream = (
        b"event: ping\n: the event: error\n"
        + b":\n" * comments
        + b'data: {"'
        + FIELD.encode()
        + b'": {"omitted": true}}\n\n'
    )
    for cut in range(len(stream)):
        assert read([stream[:cut], stream[cut:]]) is None, cut


def test_a_nested_field_is_not_the_report() -> None:
    data = {
        "type": "response.completed",
        "response": {"metadata": {FIELD: FailureHeader.stream_value(REPORT)}},
    }
    assert read([responses_stream() + event("response.completed", data)]) is None


# --- bad input -------------------------------------------------------------------------------------


def test_invalid_json_in_a_terminal_event_is_reported_as_omitted() -> None:
    stream = responses_stream(REPORT, terminal="response.failed")
    cut_json = stream[: stream.rindex(b"}}")] + b"\n\n"
    assert read([cut_json]) == FailureReport(omitted=True)


def test_an_invalid_report_in_a_terminal_event_is_reported_as_omitted() -> None:
    bad = {
        "events": {"a": {"boundary": "model", "failure_kind": "model_server_error", "cause_id": "nowhere"}}
    }
    assert read([responses_stream(value=bad)]) == FailureReport(omitted=True)
    assert read([anthropic_stream(value="not a report")]) == FailureReport(omitted=True)


def test_unreadable_data_is_ignored_only_when_its_event_is_known_not_terminal() -> None:
    key = b'"' + FIELD.encode() + b'": '
    cases = [
        (b'data: {"type":"response.output_text.delta",' + key + b"{\n\n", None),
        (b'data: {"type":"response.completed",' + key + b"{\n\n", FailureReport(omitted=True)),
        (b"event: ping\ndata: {" + key + b"{\n\n", None),
        (b"data: {" + key + b"{\n\n", FailureReport(omitted=True)),
    ]
    for stream, expected in cases:
        assert read([stream]) == expected, stream


def test_invalid_utf8_is_decoded_with_replacement() -> None:
    stream = responses_stream(REPORT).replace(b"connection reset", b"connection \xffreset")
    stream = stream.replace(b"Hello", b"He\xc3llo")
    report = read([stream])
    assert report is not None
    assert [event.failure_reason for event in report.events.values()] == [
        "upstream closed the connection",
        "connection \ufffdreset",
    ]


def test_an_unknown_kind_is_kept_as_unregistered() -> None:
    value = {"events": {"e1": {"boundary": "model", "failure_kind": "brand_new_kind"}}, "failure_id": "e1"}
    report = read(one_byte_at_a_time(anthropic_stream(value=value, terminal="error")))
    assert report is not None
    assert report.events["e1"].failure_kind == "unregistered:brand_new_kind"
    assert report.failure_id == "e1"


def test_an_unfinished_last_line_is_not_evidence_but_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    stream = responses_stream(REPORT, terminal="error")
    unfinished = stream[: stream.rindex(b"}") + 1]
    with caplog.at_level(logging.WARNING, logger="gym_failures.failure_transport"):
        assert read([unfinished]) is None
    assert "ended inside a line holding" in caplog.text
    assert read(one_byte_at_a_time(unfinished)) is None


def test_a_data_line_is_evidence_without_the_blank_line_that_dispatches_it() -> None:
    stream = responses_stream(REPORT, terminal="error").removesuffix(b"\n")
    assert read([stream]) == REPORT


def test_an_unfinished_line_keeps_the_report_read_before_it() -> None:
    first = short_report("first")
    stream = anthropic_stream(first, terminal="error") + responses_stream(REPORT, terminal="error")
    assert read([stream[:-3]]) == first


def test_several_terminal_reports_merge_and_the_first_failure_id_wins() -> None:
    first, second = short_report("first"), short_report("second")
    stream = responses_stream(first, terminal="response.failed") + responses_stream(second, terminal="error")
    merged = read([stream])
    assert merged is not None
    assert merged.failure_id == "first"
    assert set(merged.events) == {"first", "second"}
    assert not merged.omitted


def test_an_omitted_report_keeps_the_merged_report_omitted() -> None:
    stream = responses_stream(value={"omitted": True}) + anthropic_stream(REPORT)
    merged = read([stream])
    assert merged == FailureReport(events=REPORT.events, failure_id=REPORT.failure_id, omitted=True)


# --- bounds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1 << 16, 1000, 3 * MAX])
def test_a_terminal_line_at_the_bound_is_read_and_one_byte_over_is_omitted(chunk_size: int) -> None:
    data = {"type": "response.completed", FIELD: FailureHeader.stream_value(REPORT)}
    for size, expected in ((MAX, REPORT), (MAX + 1, FailureReport(omitted=True))):
        line = terminal_line(data, size)
        assert len(line) == size
        stream = responses_stream() + b"event: response.completed\n" + line + b"\n\n"
        assert read(stream[i : i + chunk_size] for i in range(0, len(stream), chunk_size)) == expected


def test_a_terminal_line_at_the_bound_is_read_when_a_chunk_ends_before_its_ending() -> None:
    line = terminal_line({"type": "error", FIELD: FailureHeader.stream_value(REPORT)}, MAX)
    assert read([line[:1000], line[1000:], b"\n"]) == REPORT
    line = terminal_line({"type": "error", FIELD: FailureHeader.stream_value(REPORT)}, MAX + 1)
    assert read([line[:1000], line[1000:], b"\n"]) == FailureReport(omitted=True)


@pytest.mark.parametrize("chunk_size", [4096, 1 << 16])
def test_a_key_arriving_after_a_line_went_over_the_bound_is_reported_as_omitted(chunk_size: int) -> None:
    pad = b"z" * MAX
    line = b'data: {"pad": "' + pad + b'", "' + FIELD.encode() + b'": {}, "more": "' + pad + b'"}\n\n'
    assert read(line[i : i + chunk_size] for i in range(0, len(line), chunk_size)) == FailureReport(
        omitted=True
    )
    without_key = line.replace(FIELD.encode(), b"other")
    assert read(without_key[i : i + chunk_size] for i in range(0, len(line), chunk_size)) is None


def test_a_long_line_whose_key_arrives_a_byte_at_a_time_is_reported_as_omitted() -> None:
    """The colon that makes the name a key may arrive chunks after the name."""
    line = b'data: {"pad": "' + b"z" * MAX + b'", "' + FIELD.encode() + b'"      : {}}\n\n'
    key_at = line.index(FIELD.encode()) - 1
    chunks = [line[:key_at], *one_byte_at_a_time(line[key_at:])]
    assert read(chunks) == FailureReport(omitted=True)


def test_a_long_line_with_the_key_in_a_non_terminal_event_is_ignored() -> None:
    data = {"type": "response.output_text.delta", FIELD: FailureHeader.stream_value(REPORT)}
    stream = b"event: response.output_text.delta\n" + terminal_line(data, 2 * MAX) + b"\n\n"
    assert read(stream[i : i + 50_000] for i in range(0, len(stream), 50_000)) is None


@pytest.mark.parametrize("chunk_size", [1 << 16, 2 * MAX, 1 << 23])
def test_a_long_line_without_the_key_costs_no_memory_beyond_the_bound(chunk_size: int) -> None:
    """Chunks smaller and larger than the bound: a chunk held whole keeps no more of its last line."""
    delta = {"type": "response.output_text.delta", "delta": "y" * (3 * MAX)}
    stream = event("response.output_text.delta", delta) + responses_stream(REPORT, terminal="error")
    stream = b": ping\n\n" + stream  # lines that end before the long one, in its chunk
    reader = StreamFailureReportReader()
    reader.feed(b": keep-alive\n")  # past the stream's start: the next chunks may be held
    for i in range(0, len(stream), chunk_size):
        reader.feed(stream[i : i + chunk_size])
        assert len(reader._pending) <= MAX
    assert reader.finish() == REPORT


def test_a_long_unnamed_line_holding_the_key_is_reported_as_omitted() -> None:
    """Over the bound the data cannot be read, so only a known non-terminal type could rule it out."""
    line = b'data: {"response": {"pad": "' + b"z" * MAX + b'"}, "' + FIELD.encode() + b'": {}}\n\n'
    assert read(line[i : i + 4096] for i in range(0, len(line), 4096)) == FailureReport(omitted=True)


# --- generated streams -----------------------------------------------------------------------------

_KEY = b'"' + FIELD.encode() + b'":'
_NAMES = ["error", "message_stop", "response.completed", "response.output_text.delta", "ping", ""]


@st.composite
def sse_lines(draw: st.DrawFn, index: int) -> bytes:
    """One SSE line among those a stream mixes: names, comments, data with and without the key."""
    value = FailureHeader.stream_value(short_report(f"e{index}"))
    data: dict[str, Any] = {}
    if draw(st.booleans()):
        data["type"] = draw(st.sampled_from([*_NAMES, None, 3]))
    data[FIELD] = value
    kind = draw(
        st.sampled_from(["blank", "event", "bare-event", "comment", "id", "data", "data", "broken", "long"])
    )
    if kind == "blank":
        return b""
    if kind == "event":
        return b"event: " + draw(st.sampled_from(_NAMES)).encode() + b" " * draw(st.sampled_from([0, 0, 200]))
    if kind == "bare-event":
        return b"event"
    if kind == "comment":
        return b": " + draw(st.sampled_from([b"keep-alive", _KEY, b"event: error"]))
    if kind == "id":
        return b"id: " + str(index).encode()
    text = json.dumps(data, separators=(",", ":") if draw(st.booleans()) else None).encode()
    if kind == "broken":
        return b"data: " + text[: draw(st.integers(0, len(text)))]
    if kind == "long":
        pad = b'"pad": "' + b"p" * draw(st.integers(0, 300)) + b'"'
        if draw(st.booleans()):
            return b"data:" + text[:-1] + b", " + pad + b"}"
        return b"data: {" + pad + b", " + text[1:]
    return b"data: " + text


@st.composite
def sse_streams(draw: st.DrawFn) -> bytes:
    lines = [draw(sse_lines(index)) for index in range(draw(st.integers(0, 14)))]
    endings = [draw(st.sampled_from(ENDINGS)) for _ in lines]
    body = b"".join(line + ending for line, ending in zip(lines, endings, strict=True))
    bom = b"\xef\xbb\xbf" if draw(st.booleans()) else b""
    return bom + body + draw(st.sampled_from([b"", b"data: {", b"event: error"]))


def _cuts(stream: bytes) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, len(stream)), max_size=12)


@given(st.data())
@settings(max_examples=200)
def test_any_chunking_reads_a_stream_as_its_lines_do(data: st.DataObject) -> None:
    """The chunk scan, its back-walk for names and its long-line bookkeeping match reading line by line."""
    reader_type = data.draw(st.sampled_from(READERS))
    stream = data.draw(sse_streams())
    expected = reader_by_lines(stream, reader_type).report
    assert read(one_byte_at_a_time(stream), reader_type) == expected
    reader = reader_type()
    read_up_to = 0
    for chunk in chunks_of(stream, data.draw(_cuts(stream))):
        reader.feed(chunk)
        read_up_to += len(chunk)
        by_lines = reader_by_lines(stream[:read_up_to], reader_type)
        # A report as soon as its line ends, held chunks or not (a relay observes it at once); and
        # the open event's name once no chunk is held, so a wrong name is seen without a report.
        assert reader.report == by_lines.report
        if not reader._held:
            assert reader._event == by_lines._event
    assert reader.finish() == expected


_FRAGMENTS = [
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"event: error\n",
    b"data: ",
    _KEY,
    FIELD.encode()[:9],
    b"{",
    b"\xff\xfe",
]


@given(
    st.lists(st.one_of(st.binary(max_size=40), st.sampled_from(_FRAGMENTS)), max_size=40),
    st.lists(st.integers(0, 2000), max_size=10),
)
def test_arbitrary_bytes_never_raise_and_keep_memory_bounded(pieces: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(pieces)
    for reader_type in READERS:
        reader = reader_type()
        for chunk in chunks_of(stream, [cut for cut in cuts if cut <= len(stream)]):
            reader.feed(chunk)
            assert len(reader._pending) <= reader_type._MAX_LINE_BYTES
        reader.finish()


@given(failure_reports(), st.lists(st.integers(0, 4000), max_size=6), st.booleans())
def test_any_report_round_trips_through_a_stream(
    report: FailureReport, cuts: list[int], ascii_only: bool
) -> None:
    value = FailureHeader.stream_value(report)
    expected = FailureHeader.decode_stream_event({FIELD: value})
    data = {"type": "response.completed", FIELD: value}
    stream = (
        responses_stream()
        + b"event: response.completed\ndata: "
        + json.dumps(data, ensure_ascii=ascii_only).encode()
        + b"\n\n"
    )
    assert read(chunks_of(stream, [cut for cut in cuts if cut <= len(stream)])) == expected


# --- text captures ---------------------------------------------------------------------------------


def test_feed_text_reads_as_feed_does_on_the_encoded_text() -> None:
    stream = responses_stream(REPORT, deltas=("Grüße", " 🌍", " 你好"), terminal="response.incomplete")
    text = stream.decode()
    reader = StreamFailureReportReader()
    reader.feed_text(text)
    assert reader.finish() == read([stream]) == REPORT


def test_feed_text_reads_a_capture_longer_than_one_slice() -> None:
    slice_chars = StreamFailureReportReader._TEXT_SLICE
    deltas = ["ü" * 1000] * (3 * slice_chars // 1000)
    text = responses_stream(REPORT, deltas=deltas, terminal="error").decode()
    assert len(text) > 2 * slice_chars
    reader = StreamFailureReportReader()
    reader.feed_text(text)
    assert reader.finish() == REPORT


def test_feed_text_reads_a_lone_surrogate_as_the_replacement_character() -> None:
    text = responses_stream(REPORT).decode().replace("connection reset", "connection \ud800reset")
    reader = StreamFailureReportReader()
    reader.feed_text(text)
    report = reader.finish()
    assert report is not None
    assert "connection \ufffdreset" in [event.failure_reason for event in report.events.values()]
    assert report == read([text.replace("\ud800", "\ufffd").encode()])


@given(
    st.text(alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=200),
    st.sampled_from(RESPONSES_TERMINALS),
)
def test_feed_text_never_raises_and_matches_feed(delta: str, terminal: Any) -> None:
    text = responses_stream(REPORT, deltas=(delta,), terminal=terminal).decode() + delta
    reader = StreamFailureReportReader()
    reader.feed_text(text)
    assert reader.finish() == read([re.sub("[\ud800-\udfff]", "\ufffd", text).encode()])


# --- lifecycle and observation ---------------------------------------------------------------------


def test_feed_after_finish_raises_and_finish_returns_the_same_report() -> None:
    reader = StreamFailureReportReader()
    reader.feed(anthropic_stream(REPORT))
    assert reader.finish() == REPORT
    assert reader.finish() == REPORT
    with pytest.raises(ValueError, match="after finish"):
        reader.feed(b"data: {}\n")


def test_observe_adds_the_report_to_the_request_log_as_observations() -> None:
    reader = StreamFailureReportReader()
    reader.feed(responses_stream(REPORT, terminal="response.failed"))
    reader.finish()
    with RequestFailureLog.capture() as log:
        reader.observe()
    assert log.report.events == REPORT.events
    assert log.report.failure_id is None


def test_observe_without_a_report_adds_nothing() -> None:
    reader = StreamFailureReportReader()
    reader.feed(responses_stream())
    reader.finish()
    with RequestFailureLog.capture() as log:
        reader.observe()
    assert log.report == FailureReport()


def test_observe_outside_a_request_does_nothing() -> None:
    reader = StreamFailureReportReader()
    reader.feed(responses_stream(REPORT))
    reader.finish()
    assert RequestFailureLog.current() is None
    reader.observe()
