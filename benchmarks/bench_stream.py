"""The stream reader's scan against a bare `bytes.find` and against parsing every event with orjson.

A Responses API stream of 400,000 `response.output_text.delta` events and one terminal
`response.completed` event carrying a failure report, fed in 64 KiB, 4 KiB (closer to what a socket
hands a relay) and 1 KiB chunks. In every round each scan runs once, in an order that rotates between
rounds (`benchmarks._timing.compare_samples`); a ratio is the median of the rounds' ratios (each
taken back to back in one round), with their range:

- floor: `chunk.find(b"nemo_gym_failure_report")` on each chunk, nothing else;
- reader: `StreamFailureReportReader.feed` on each chunk, then `finish`;
- orjson (64 KiB chunks): split each chunk into lines (keeping the unfinished one) and
  `orjson.loads` every data line, what a relay that parses events to find the report would do at least.

The reader also runs on the same stream with CRLF line endings (as sse-starlette sends by default) in
64 KiB chunks, against its own floor. The terminal event's response carries no output text: a real
one repeats the whole text, which for a stream this long is over the reader's 1 MiB line bound.

Run with `make bench` or `python -m benchmarks.bench_stream`; no figure is asserted.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Callable

import orjson

from benchmarks._timing import compare_samples, markdown_table
from gym_failures.failure_records import FailureReport
from gym_failures.failure_transport import FailureHeader, StreamFailureReportReader
from gym_failures.failures import ModelFailure

EVENTS = 400_000
CHUNK = 1 << 16
SIZES = {"64 KiB": 1 << 16, "4 KiB": 1 << 12, "1 KiB": 1 << 10}
FLOOR_TARGETS = {"64 KiB": 0.85, "4 KiB": 0.6}
ROUNDS = 11
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


def _chunked(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


def _ratio(baseline: list[float], subject: list[float]) -> tuple[float, float, float]:
    """The median of the rounds' `baseline / subject` ratios, and their least and greatest."""
    ratios = [base / sub for base, sub in zip(baseline, subject, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def main() -> dict[str, float]:
    report = _report()
    stream = build_stream(report)
    crlf = build_stream(report, b"\r\n")
    chunked = {label: _chunked(stream, size) for label, size in SIZES.items()}
    chunks, crlf_chunks = chunked["64 KiB"], _chunked(crlf, CHUNK)
    if any(reader(pieces) != report for pieces in [*chunked.values(), crlf_chunks]):
        raise AssertionError("the reader did not read the terminal report")
    if parse_every_event(chunks) != EVENTS + 2:
        raise AssertionError("the orjson baseline did not parse every event")

    subjects: dict[str, Callable[[], object]] = {}
    for label, pieces in chunked.items():
        subjects[f"floor {label}"] = functools.partial(floor, pieces)
        subjects[f"reader {label}"] = functools.partial(reader, pieces)
    subjects["orjson"] = lambda: parse_every_event(chunks)
    subjects["floor_crlf"] = lambda: floor(crlf_chunks)
    subjects["reader_crlf"] = lambda: reader(crlf_chunks)
    ns = compare_samples(subjects, rounds=ROUNDS)
    median = {name: statistics.median(values) for name, values in ns.items()}
    mb, mb_crlf = len(stream) / 1e6, len(crlf) / 1e6
    figures: dict[str, float] = {"stream_mb": mb}
    rows = []
    for label in SIZES:
        ratio, low, high = _ratio(ns[f"floor {label}"], ns[f"reader {label}"])
        key = label.replace(" ", "").lower()
        figures[f"floor_{key}_mb_s"] = mb / median[f"floor {label}"] * 1e9
        figures[f"reader_{key}_mb_s"] = mb / median[f"reader {label}"] * 1e9
        figures[f"reader_over_floor_{key}"] = ratio
        target = FLOOR_TARGETS.get(label)
        verdict = (
            "" if target is None else f"≥ {target:g} of floor: " + ("met" if ratio >= target else "missed")
        )
        rows.append(
            (
                f"floor: `chunk.find(field)`, {label} chunks",
                f"{figures[f'floor_{key}_mb_s']:,.0f}",
                "1.00",
                "",
            )
        )
        rows.append(
            (
                f"`StreamFailureReportReader.feed`, {label} chunks",
                f"{figures[f'reader_{key}_mb_s']:,.0f}",
                f"{ratio:.2f} of floor ({low:.2f} to {high:.2f})",
                verdict,
            )
        )
    figures["reader_over_floor"] = figures["reader_over_floor_64kib"]
    orjson_ratio, orjson_low, orjson_high = _ratio(ns["orjson"], ns["reader 64 KiB"])
    figures["orjson_mb_s"] = mb / median["orjson"] * 1e9
    figures["reader_over_orjson"] = orjson_ratio
    crlf_ratio, crlf_low, crlf_high = _ratio(ns["floor_crlf"], ns["reader_crlf"])
    figures["floor_crlf_mb_s"] = mb_crlf / median["floor_crlf"] * 1e9
    figures["reader_crlf_mb_s"] = mb_crlf / median["reader_crlf"] * 1e9
    figures["reader_crlf_over_floor"] = crlf_ratio
    met_orjson = "met" if orjson_ratio >= ORJSON_TARGET else "missed"
    rows += [
        (
            "orjson: split lines, `orjson.loads` each data line, 64 KiB chunks",
            f"{figures['orjson_mb_s']:,.0f}",
            f"reader {orjson_ratio:.0f}x faster ({orjson_low:.0f}x to {orjson_high:.0f}x)",
            f"≥ {ORJSON_TARGET:g}x: {met_orjson}",
        ),
        (
            f"floor, CRLF endings ({mb_crlf:.1f} MB), 64 KiB chunks",
            f"{figures['floor_crlf_mb_s']:,.0f}",
            "1.00",
            "",
        ),
        (
            "`StreamFailureReportReader.feed`, CRLF endings, 64 KiB chunks",
            f"{figures['reader_crlf_mb_s']:,.0f}",
            f"{crlf_ratio:.2f} of floor ({crlf_low:.2f} to {crlf_high:.2f})",
            "",
        ),
    ]
    print(
        f"{mb:.1f} MB Responses stream ({EVENTS:,} delta events, one terminal event) in "
        f"{', '.join(SIZES)} chunks; medians of {ROUNDS} alternating rounds (range of the rounds).\n"
    )
    print(markdown_table(("scan", "MB/s", "ratio", "target"), rows))
    return figures


if __name__ == "__main__":
    main()
