"""Fuzz targets: every public decoder and reader, fed anything, answers with its documented result.

Run briefly in `make test` (hypothesis's default budget) and for long in `make fuzz`
(`HYPOTHESIS_PROFILE=fuzz`, see tests/conftest.py). Text strategies here draw from every code point,
lone surrogates included (hypothesis leaves them out unless asked). Every crash a run found is kept
below as an `@example`, so it stays fixed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gym_failures.client._reply import retry_after_s
from gym_failures.failure_records import FailureReport
from gym_failures.failure_transport import FailureHeader, FailureReportRow, StreamFailureReportReader
from gym_failures.failures import MAX_RETRY_AFTER_S, ModelFailure
from gym_failures.redaction import redact, request_secrets
from gym_failures.reporting.explain import explain_row
from gym_failures.rows import normalized, read_rows
from tests.strategies import json_values

ANY_TEXT = st.text(st.characters(exclude_categories=()))
NAME = FailureHeader.NAME


@given(value=ANY_TEXT | st.binary())
@example(value="\ud800")  # UnicodeEncodeError before the issue 14 fixes
@example(value='{"omitted": true, "x": "\udcff"}')
def test_header_decode_answers_a_report(value: str | bytes) -> None:
    assert isinstance(FailureHeader.decode({NAME: value}), FailureReport)  # type: ignore[dict-item]


@given(payload=json_values())
def test_stream_event_decode_answers_a_report_or_none(payload: Any) -> None:
    report = FailureHeader.decode_stream_event({FailureHeader.STREAM_FIELD: payload})
    assert report is None or isinstance(report, FailureReport)


@given(chunks=st.lists(st.binary(max_size=300), max_size=20))
@example(chunks=[b'event: response.failed\ndata: {"nemo_gym_failure_report": {"omitted": "\xff"}}\n\n'])
def test_stream_reader_reads_any_bytes(chunks: list[bytes]) -> None:
    reader = StreamFailureReportReader()
    for chunk in chunks:
        reader.feed(chunk)
    report = reader.finish()
    assert report is None or isinstance(report, FailureReport)


@given(events=json_values(), failure_id=json_values(), omitted=json_values())
def test_saved_row_report_answers_a_report(events: Any, failure_id: Any, omitted: Any) -> None:
    row = {FailureReportRow.EVENTS: events, FailureReportRow.FAILURE_ID: failure_id}
    row[FailureReportRow.OMITTED] = omitted
    assert isinstance(FailureReportRow.report(row), FailureReport)


@given(row=st.dictionaries(st.text(max_size=20), json_values(), max_size=8))
@example(row={"reward": 10**400, "result": {}})  # OverflowError before the issue 14 fixes
@example(row={"id": "bad-\ud800", "failure": {"failure_reason": "\udcff"}})
def test_a_row_normalizes_and_explains(row: dict[str, Any]) -> None:
    explain_row(normalized(row))


@given(lines=st.lists(ANY_TEXT | st.binary(), max_size=10))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_read_rows_reads_any_file(tmp_path: Path, lines: list[str | bytes]) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(
        b"\n".join(
            line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass") for line in lines
        )
    )
    for row in read_rows(path):
        assert isinstance(row, dict)
        json.dumps(row, ensure_ascii=True)


@given(text=ANY_TEXT, known=st.lists(ANY_TEXT, max_size=3))
def test_redact_answers_text(text: str, known: list[str]) -> None:
    assert isinstance(redact(text, known), str)


@given(
    headers=st.lists(st.tuples(st.binary(max_size=30), st.binary(max_size=60)), max_size=6), query=st.binary()
)
def test_request_secrets_read_any_request(headers: list[tuple[bytes, bytes]], query: bytes) -> None:
    assert all(isinstance(secret, str) for secret in request_secrets(headers, query))


@given(value=ANY_TEXT)
@example(value="9" * 400)
@example(value="Fri, 31 Dec 99999999999999999999 23:59:59 GMT")  # OverflowError before the fixes
def test_retry_after_is_bounded(value: str) -> None:
    wait = retry_after_s({"Retry-After": value})
    assert wait is None or 0.0 <= wait <= MAX_RETRY_AFTER_S


@given(reason=ANY_TEXT, operation=ANY_TEXT)
@example(reason=b"\xff".decode("utf-8", "surrogateescape"), operation="x")  # ValidationError before
def test_a_failure_made_from_any_text_is_sent_and_read_back(reason: str, operation: str) -> None:
    failure = ModelFailure(failure_kind="model_server_error", failure_reason=reason, operation=operation)
    value = FailureHeader.encode(failure.failure_report())[NAME]
    assert value.isascii()
    assert len(value) <= FailureHeader.MAX_BYTES
    decoded = FailureHeader.decode({NAME: value})
    assert decoded is not None
    assert decoded.omitted or decoded == failure.failure_report()
