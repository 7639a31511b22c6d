"""Whether a stream ended with its terminal event, in all three APIs' forms; the failure of a cut one."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_failures.asgi import relay_stream
from gym_failures.client import stream_failure
from gym_failures.failure_transport import FailureHeader, RequestFailureLog, StreamFailureReportReader
from gym_failures.failures import ModelFailure
from gym_failures.model_endpoint import ModelCall, Turn
from gym_failures.model_endpoint._apis import failed_stream_events, read_call, stream_reply

VLLM_STREAM = (Path(__file__).parent / "fixtures" / "vllm_chat_completions_stream.txt").read_bytes()


def _call(api: str) -> ModelCall:
    body: dict[str, object] = {"model": "m", "stream": True, "max_tokens": 16}
    if api == "responses":
        body["input"] = "hello"
    else:
        body["messages"] = [{"role": "user", "content": "hello"}]
    return read_call(api, body, {})  # type: ignore[arg-type]


def _stream(api: str, ending: str, text: str = "the answer is four") -> bytes:
    """A stream the endpoint writes for `api`: whole, cut before its end, or ending in a failure."""
    reply = stream_reply(_call(api), Turn(text=text))
    if ending == "whole":
        return b"".join(reply.events + reply.terminal({}))
    if ending == "cut":
        return b"".join(reply.events)
    failure = ModelFailure(failure_kind="model_server_error", failure_reason="worker crashed")
    field = {FailureHeader.STREAM_FIELD: failure.failure_report().model_dump(mode="json")}
    return b"".join(reply.events + failed_stream_events(_call(api), len(reply.events), failure, field))


def _read(stream: bytes, cuts: list[int] | None = None) -> StreamFailureReportReader:
    reader = StreamFailureReportReader()
    start = 0
    for cut in sorted(cuts or []):
        reader.feed(stream[start:cut])
        start = cut
    reader.feed(stream[start:])
    reader.finish()
    return reader


APIS = ["responses", "chat", "messages"]


@pytest.mark.parametrize("api", APIS)
def test_a_whole_stream_had_its_terminal_event(api: str) -> None:
    reader = _read(_stream(api, "whole"))
    assert reader.terminal_seen
    assert stream_failure(reader) is None


@pytest.mark.parametrize("api", APIS)
def test_a_cut_stream_had_none_and_is_a_model_peer_drop(api: str) -> None:
    reader = _read(_stream(api, "cut"))
    assert not reader.terminal_seen
    failure = stream_failure(reader, url="http://model.test/v1/x?key=secret")
    assert isinstance(failure, ModelFailure)
    assert failure.failure_kind == "transport_peer_drop"
    assert "secret" not in failure.failure_reason
    assert failure.http_status is None  # the reply was a 200: not a failure's status


@pytest.mark.parametrize("api", APIS)
def test_a_failed_stream_is_its_reported_failure(api: str) -> None:
    reader = _read(_stream(api, "failed"))
    assert reader.terminal_seen
    failure = stream_failure(reader)
    assert failure is not None
    assert failure.failure_kind == "model_server_error"
    assert failure.event_id == reader.report.failure_id  # type: ignore[union-attr]


def test_the_recorded_vllm_stream_ends_with_done() -> None:
    assert _read(VLLM_STREAM).terminal_seen
    assert not _read(VLLM_STREAM[: VLLM_STREAM.rindex(b"data: [DONE]")]).terminal_seen


def test_a_stream_cut_inside_its_terminal_event_did_not_end_with_it() -> None:
    whole = _stream("messages", "whole")
    assert not _read(whole[:-5]).terminal_seen
    assert not _read(b"data: [DONE]").terminal_seen  # a line the stream never ended


def test_an_empty_stream_had_no_terminal_event() -> None:
    assert not _read(b"").terminal_seen


def test_a_long_terminal_event_is_known_by_its_name() -> None:
    """A `response.completed` whose data is longer than the window read back is known by its name."""
    big = b"x" * (3 * StreamFailureReportReader._WINDOW)
    head = b'event: response.completed\ndata: {"type":"response.completed","r":"'
    assert _read(head + big + b'"}\n\n', cuts=[len(head) + 10, len(head) + len(big) // 2]).terminal_seen
    other = head.replace(b"response.completed", b"response.output_text.delta")
    assert not _read(other + big + b'"}\n\n', cuts=[len(head) + 10, len(head) + len(big) // 2]).terminal_seen


@given(
    api=st.sampled_from(APIS),
    ending=st.sampled_from(["whole", "cut", "failed"]),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
)
def test_chunk_boundaries_never_change_the_answer(api: str, ending: str, cuts: list[int]) -> None:
    stream = _stream(api, ending)
    cuts = [cut for cut in cuts if cut <= len(stream)]
    assert _read(stream, cuts).terminal_seen == _read(stream).terminal_seen == (ending != "cut")


@given(
    api=st.sampled_from(APIS),
    ending=st.sampled_from(["whole", "cut", "failed"]),
    size=st.integers(min_value=1, max_value=600),
)
def test_every_chunk_size_gives_the_same_answer(api: str, ending: str, size: int) -> None:
    """Chunks of one size, as a socket hands them: the reader holds and reads them in batches."""
    stream = _stream(api, ending)
    whole = _read(stream)
    reader = _read(stream, list(range(size, len(stream), size)))
    assert reader.terminal_seen == whole.terminal_seen == (ending != "cut")
    assert reader.report == whole.report


LONG_TEXT = " ".join(f"word{index}" for index in range(3_500))


@pytest.mark.parametrize("size", [1 << 10, 1 << 12, 1 << 16, 1 << 17, 100_003])
@pytest.mark.parametrize("ending", ["whole", "cut", "failed"])
@pytest.mark.parametrize("api", APIS)
def test_a_long_stream_gives_the_same_answer_at_every_chunk_size(api: str, ending: str, size: int) -> None:
    """Streams of several batches and windows (`_BATCH`, `_WINDOW`), at the benchmark's chunk sizes."""
    stream = _stream(api, ending, LONG_TEXT)
    assert len(stream) > 2 * (StreamFailureReportReader._BATCH + StreamFailureReportReader._WINDOW)
    whole = _read(stream)
    reader = _read(stream, list(range(size, len(stream), size)))
    assert reader.terminal_seen == whole.terminal_seen == (ending != "cut")
    assert reader.report == whole.report
    assert (reader.report is None) == (ending != "failed")


@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0, max_value=2000), max_size=8))
def test_any_bytes_give_an_answer_without_raising(data: bytes, cuts: list[int]) -> None:
    reader = _read(data, [cut for cut in cuts if cut <= len(data)])
    assert reader.terminal_seen in (True, False)


async def test_relay_stream_says_through_its_reader_how_the_stream_ended() -> None:
    async def chunks(stream: bytes) -> object:
        for start in range(0, len(stream), 100):
            yield stream[start : start + 100]

    for ending, seen in (("whole", True), ("cut", False)):
        reader = StreamFailureReportReader()
        stream = _stream("chat", ending)
        with RequestFailureLog.capture():
            relayed = b"".join([chunk async for chunk in relay_stream(chunks(stream), reader=reader)])  # type: ignore[arg-type]
        assert relayed == stream
        assert reader.terminal_seen is seen


# --- Chunking never changes the answer (a review found small last chunks read as a cut stream) ------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gym_failures._stream_reader import StreamFailureReportReader as _Reader  # noqa: E402

_EVENTS = st.sampled_from(
    [
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta"}\n\n',
        b'data: {"type":"response.output_text.delta","delta":"x"}\n\n',
        b'event: response.completed\ndata: {"type":"response.completed"}\n\n',
        b'data: {"type":"response.completed","response":{}}\n\n',
        b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n',
        b"data: [DONE]\n\n",
        b": keep-alive\n\n",
    ]
)


class _SmallWindowReader(_Reader):
    """A window and batches a few events long: the last event is read back across batches, and one
    longer than the window is known by its name (`_named`)."""

    _WINDOW: ClassVar[int] = 100
    _BATCH: ClassVar[int] = 64


def _terminal_seen(chunks: list[bytes], reader_type: type[_Reader] = _Reader) -> bool:
    reader = reader_type()
    for chunk in chunks:
        reader.feed(chunk)
    reader.finish()
    return reader.terminal_seen


@given(
    events=st.lists(_EVENTS, min_size=1, max_size=10),
    cuts=st.lists(st.integers(0, 700), max_size=16),
    reader_type=st.sampled_from([_Reader, _SmallWindowReader]),
)
def test_terminal_seen_does_not_depend_on_how_the_stream_is_chunked(
    events: list[bytes], cuts: list[int], reader_type: type[_Reader]
) -> None:
    stream = b"".join(events)
    points = sorted({min(cut, len(stream)) for cut in cuts})
    chunks = [stream[start:end] for start, end in zip([0, *points], [*points, len(stream)], strict=True)]
    assert _terminal_seen(chunks, reader_type) == _terminal_seen([stream], reader_type)
