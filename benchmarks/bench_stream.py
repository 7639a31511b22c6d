"""The stream reader's scan against a bare `bytes.find` and against parsing every event with orjson.

A Responses API stream of 400,000 `response.output_text.delta` events and one terminal
`response.completed` event carrying a failure report, fed in 64 KiB chunks. In every round each scan
runs once, in an order that rotates between rounds (`benchmarks._timing.compare`), and each figure
is the median of its rounds:

- floor: `chunk.find(b"nemo_gym_failure_report")` on each chunk, nothing else;
- reader: `StreamFailureReportReader.feed` on each chunk, then `finish`;
- orjson: split each chunk into lines (keeping the unfinished one) and `orjson.loads` every data line,
  what a relay that parses events to find the report would do at least.

The reader also runs on the same stream with CRLF line endings (as sse-starlette sends by default),
against its own floor. The terminal event's response carries no output text: a real one repeats the
whole text, which for a stream this long is over the reader's 1 MiB line bound.

Run with `make bench` or `python -m benchmarks.bench_stream`; no figure is asserted.
"""

from __future__ import annotations

import json

import orjson

from benchmarks._timing import compare, markdown_table
from gym_failures.failure_records import FailureReport
from gym_failures.failure_transport import FailureHeader, StreamFailureReportReader
from gym_failures.failures import ModelFailure

EVENTS = 400_000
CHUNK = 1 << 16
ROUNDS = 11
FLOOR_TARGET = 0.75
ORJSON_TARGET = 20.0
FIELD = FailureHeader.STREAM_FIELD.encode()
_WORDS = [" the", " model", " streams", " tokens", ",", " and", " a", " relay", " reads", " them", "."]


def _report() -> FailureReport:
    try:
        try:
            raise ModelFailure(failure_kind="model_server_error", failure_reason="connection reset")
        except ModelFailure as cause:
            raise ModelFailure(failure_kind="model_server_error", failure_reason="upstream 502") from cause
    except ModelFailure as failure:
        return failure.failure_report()


def build_stream(report: FailureReport, ending: bytes = b"\n") -> bytes:
    item_id = "msg_68b0c2f5a9d88193"
    response = {"id": "resp_68b0c2f4e21c8190", "object": "response", "status": "in_progress", "output": []}
    created = {"type": "response.created", "sequence_number": 0, "response": response}
    parts = [
        b"event: response.created\ndata: " + json.dumps(created, separators=(",", ":")).encode() + b"\n\n"
    ]
    for seq in range(1, EVENTS + 1):
        delta = {
            "type": "response.output_text.delta",
            "sequence_number": seq,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "delta": _WORDS[seq % len(_WORDS)],
        }
        data = json.dumps(delta, separators=(",", ":")).encode()
        parts.append(b"event: response.output_text.delta\ndata: " + data + b"\n\n")
    completed = {
        "type": "response.completed",
        "sequence_number": EVENTS + 1,
        "response": {**response, "status": "completed"},
        FailureHeader.STREAM_FIELD: FailureHeader.stream_value(report),
    }
    data = json.dumps(completed, separators=(",", ":")).encode()
    parts.append(b"event: response.completed\ndata: " + data + b"\n\n")
    stream = b"".join(parts)
    return stream if ending == b"\n" else stream.replace(b"\n", ending)


def floor(chunks: list[bytes]) -> None:
    for chunk in chunks:
        chunk.find(FIELD)


def reader(chunks: list[bytes]) -> FailureReport | None:
    stream_reader = StreamFailureReportReader()
    for chunk in chunks:
        stream_reader.feed(chunk)
    return stream_reader.finish()


def parse_every_event(chunks: list[bytes]) -> int:
    parsed = 0
    tail = b""
    for chunk in chunks:
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        for line in lines:
            if line.startswith(b"data: "):
                orjson.loads(line[6:])
                parsed += 1
    return parsed


def main() -> dict[str, float]:
    report = _report()
    stream = build_stream(report)
    crlf = build_stream(report, b"\r\n")
    chunks = [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]
    crlf_chunks = [crlf[i : i + CHUNK] for i in range(0, len(crlf), CHUNK)]
    if reader(chunks) != report or reader(crlf_chunks) != report:
        raise AssertionError("the reader did not read the terminal report")
    if parse_every_event(chunks) != EVENTS + 2:
        raise AssertionError("the orjson baseline did not parse every event")

    ns = compare(
        {
            "floor": lambda: floor(chunks),
            "reader": lambda: reader(chunks),
            "orjson": lambda: parse_every_event(chunks),
            "floor_crlf": lambda: floor(crlf_chunks),
            "reader_crlf": lambda: reader(crlf_chunks),
        },
        rounds=ROUNDS,
    )
    mb, mb_crlf = len(stream) / 1e6, len(crlf) / 1e6
    figures = {
        "stream_mb": mb,
        "floor_mb_s": mb / ns["floor"] * 1e9,
        "reader_mb_s": mb / ns["reader"] * 1e9,
        "orjson_mb_s": mb / ns["orjson"] * 1e9,
        "reader_over_floor": ns["floor"] / ns["reader"],
        "reader_over_orjson": ns["orjson"] / ns["reader"],
        "floor_crlf_mb_s": mb_crlf / ns["floor_crlf"] * 1e9,
        "reader_crlf_mb_s": mb_crlf / ns["reader_crlf"] * 1e9,
        "reader_crlf_over_floor": ns["floor_crlf"] / ns["reader_crlf"],
    }
    met = "met" if figures["reader_over_floor"] >= FLOOR_TARGET else "missed"
    met_orjson = "met" if figures["reader_over_orjson"] >= ORJSON_TARGET else "missed"
    rows = [
        ("floor: `chunk.find(field)`", f"{figures['floor_mb_s']:,.0f}", "1.00", ""),
        (
            "`StreamFailureReportReader.feed`",
            f"{figures['reader_mb_s']:,.0f}",
            f"{figures['reader_over_floor']:.2f} of floor",
            f"≥ {FLOOR_TARGET:g} of floor: {met}",
        ),
        (
            "orjson: split lines, `orjson.loads` each data line",
            f"{figures['orjson_mb_s']:,.0f}",
            f"reader {figures['reader_over_orjson']:.0f}x faster",
            f"≥ {ORJSON_TARGET:g}x: {met_orjson}",
        ),
        (f"floor, CRLF endings ({mb_crlf:.1f} MB)", f"{figures['floor_crlf_mb_s']:,.0f}", "1.00", ""),
        (
            "`StreamFailureReportReader.feed`, CRLF endings",
            f"{figures['reader_crlf_mb_s']:,.0f}",
            f"{figures['reader_crlf_over_floor']:.2f} of floor",
            "",
        ),
    ]
    print(
        f"{mb:.1f} MB Responses stream ({EVENTS:,} delta events, one terminal event) in "
        f"{CHUNK // 1024} KiB chunks; median of {ROUNDS} alternating rounds.\n"
    )
    print(markdown_table(("scan", "MB/s", "ratio", "target"), rows))
    return figures


if __name__ == "__main__":
    main()
