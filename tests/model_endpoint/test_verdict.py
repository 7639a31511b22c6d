"""The recovery verdict on journals built by hand: each finding, each at its bound, the client's
record, and the readers of a verdict file and of a client's record (property tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_failures.cli import main
from gym_failures.failure_transport import FailureReportRow, RequestFailureLog, observe_failure
from gym_failures.failures import ModelFailure
from gym_failures.model_endpoint import FINDINGS, Attempt, client_record, judge, verdict_document
from gym_failures.model_endpoint._verdict import CLOCK_SLACK_S, NO_BACKOFF_S, READ_TIMEOUT_S, STORM_ATTEMPTS


def attempt(
    index: int, start: float, *, end: float | None = None, request: str = "r1", **fields: Any
) -> Attempt:
    base: dict[str, Any] = {"route": "/v1/responses", "status": 200, "outcome": "ok", "stream": False}
    return Attempt(
        index=index,
        request=request,
        started_s=start,
        ended_s=start if end is None else end,
        **{**base, **fields},
    )


def refused(index: int, start: float, **fields: Any) -> Attempt:
    base = {
        "status": 429,
        "outcome": "failed",
        "fault": "quota_429",
        "event_id": f"ev{index}",
        "retry_after_s": 1.0,
    }
    return attempt(index, start, **{**base, **fields})


def findings(*attempts: Attempt, client: Any = None) -> list[str]:
    return [f.finding for f in judge(attempts, None if client is None else client_record(client)).findings]


def test_waiting_the_retry_after_is_recovered_and_less_is_a_failure_at_the_bound() -> None:
    assert findings(refused(0, 0.0), attempt(1, 1.0)) == []
    assert findings(refused(0, 0.0), attempt(1, 1.0 - CLOCK_SLACK_S)) == []
    verdict = judge([refused(0, 0.0), attempt(1, 1.0 - CLOCK_SLACK_S - 0.001)])
    assert [f.finding for f in verdict.findings] == ["retry_after_ignored"]
    assert verdict.findings[0].event_ids == ["ev0"]
    assert verdict.findings[0].attempts == [0, 1]
    assert verdict.findings[0].requests == ["r1"]
    assert not verdict.passed


def test_the_wait_counts_from_the_failed_status_line_else_the_replys_end() -> None:
    assert findings(refused(0, 0.0, end=5.0), attempt(1, 5.5)) == ["retry_after_ignored"]
    # An SDK streaming a request acts on the status line, before the body's last bytes.
    assert findings(refused(0, 0.0, answered_s=0.0, end=0.2), attempt(1, 1.0)) == []
    assert findings(refused(0, 0.0, answered_s=0.0, end=0.2), attempt(1, 0.9)) == ["retry_after_ignored"]
    # A broken reply is known only at its end.
    cut = attempt(0, 0.0, answered_s=0.0, end=2.0, outcome="dropped", fault="drop_connection", status=200)
    assert findings(cut, attempt(1, 2.0)) == ["no_backoff"]


def test_a_non_retryable_refusal_sent_again() -> None:
    bad = refused(0, 0.0, status=400, fault="context_window", retry_after_s=None)
    assert findings(bad, attempt(1, 10.0)) == ["retried_non_retryable"]
    for status in (408, 409, 429, 500, 529):
        assert "retried_non_retryable" not in findings(refused(0, 0.0, status=status), attempt(1, 10.0))


def test_no_backoff_at_its_bound() -> None:
    down = refused(0, 0.0, status=500, fault="server_500", retry_after_s=None)
    assert findings(down, attempt(1, NO_BACKOFF_S)) == []
    assert findings(down, attempt(1, NO_BACKOFF_S - 0.001)) == ["no_backoff"]
    assert judge([down, attempt(1, 0.0)]).passed  # a warning


def test_a_retry_storm_past_its_bound() -> None:
    def run(count: int) -> list[Attempt]:
        return [refused(i, i * 2.0) for i in range(count - 1)] + [attempt(count - 1, count * 2.0)]

    assert "retry_storm" not in findings(*run(STORM_ATTEMPTS))
    storm = judge(run(STORM_ATTEMPTS + 1))
    assert [f.finding for f in storm.findings] == ["retry_storm"]
    assert len(storm.findings[0].event_ids) == STORM_ATTEMPTS


def test_giving_up_on_a_retryable_failure_is_a_warning() -> None:
    verdict = judge([refused(0, 0.0)])
    assert [(f.finding, f.severity) for f in verdict.findings] == [("gave_up", "warning")]
    assert verdict.passed
    assert findings(refused(0, 0.0, status=401, fault=None)) == []  # nothing to retry


def test_a_cut_without_a_retry_is_accepted_from_the_servers_side() -> None:
    cut = attempt(0, 0.0, stream=True, fault="cut_stream", outcome="cut", event_id="cut0")
    failed = attempt(0, 0.0, stream=True, fault="stream_failed", outcome="failed_stream", event_id="f0")
    assert findings(cut) == ["cut_stream_accepted"]
    assert findings(failed) == ["failed_stream_accepted"]
    assert findings(cut, attempt(1, 2.0)) == []
    assert "guessed" in judge([cut]).findings[0].message


def test_with_the_clients_record_a_cut_is_noticed_only_by_its_event_id() -> None:
    cut = attempt(0, 0.0, stream=True, fault="cut_stream", outcome="cut", event_id="cut0")
    retried = [cut, attempt(1, 2.0)]
    assert findings(*retried, client=["cut0"]) == []
    # Retried, but the client's record does not hold the cut: not noticed, whatever the retry says.
    assert findings(*retried, client=["other"]) == ["cut_stream_accepted"]
    # Noticed and not retried: the client gave up on it, knowingly.
    assert findings(cut, client=["cut0"]) == ["gave_up"]


def test_a_record_cut_short_falls_back_to_the_retry() -> None:
    cut = attempt(0, 0.0, stream=True, fault="cut_stream", outcome="cut", event_id="cut0")
    row: dict[str, Any] = {
        FailureReportRow.EVENTS: {},
        FailureReportRow.FAILURE_ID: None,
        FailureReportRow.OMITTED: True,
    }
    assert findings(cut, attempt(1, 2.0), client=[row]) == []
    assert findings(cut, client=[row]) == ["cut_stream_accepted"]


def test_the_clients_record_from_a_log_a_failure_rows_and_ids() -> None:
    with RequestFailureLog.capture() as log:
        observe_failure(ModelFailure(failure_kind="transport_peer_drop", failure_reason="cut", event_id="a"))
    failure = ModelFailure(failure_kind="model_server_error", failure_reason="x", event_id="b")
    row = FailureReportRow.fields(failure.failure_report())
    record = client_record(
        log, ModelFailure(failure_kind="model_server_error", failure_reason="y", event_id="c"), [row], "d"
    )
    assert record.event_ids == {"a", "b", "c", "d"}
    assert not record.omitted
    with pytest.raises(TypeError, match="not a client record"):
        client_record(3)


def test_the_text_names_findings_requests_and_events() -> None:
    text = judge([refused(0, 0.0), attempt(1, 0.1)]).text()
    assert text.startswith("NOT recovered: 2 attempts of 1 requests (quota_429 x1)")
    assert "failure: retry_after_ignored" in text
    assert "request r1; event ev0" in text


def test_every_finding_has_a_severity() -> None:
    assert set(FINDINGS.values()) == {"failure", "warning"}
    warnings = [name for name, severity in FINDINGS.items() if severity == "warning"]
    assert warnings == ["no_backoff", "gave_up", "malformed_chunk_ignored", "no_read_timeout"]


# --- gym-failures verdict -----------------------------------------------------------------------


def _document(*attempts: Attempt) -> dict[str, Any]:
    return verdict_document(judge(attempts), attempts)


def test_the_command_prints_the_verdict_and_exits_1_on_a_failing_finding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_document(refused(0, 0.0), attempt(1, 0.1))), encoding="utf-8")
    assert main(["verdict", str(bad)]) == 1
    assert "retry_after_ignored" in capsys.readouterr().out
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_document(refused(0, 0.0), attempt(1, 1.5))), encoding="utf-8")
    assert main(["verdict", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True


def test_the_command_judges_again_with_the_clients_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = attempt(0, 0.0, stream=True, fault="cut_stream", outcome="cut", event_id="cut0")
    source = tmp_path / "verdict.json"
    source.write_text(json.dumps(_document(cut, attempt(1, 2.0))), encoding="utf-8")
    rows = tmp_path / "rows.jsonl"
    failure = ModelFailure(failure_kind="transport_peer_drop", failure_reason="cut", event_id="cut0")
    rows.write_text(json.dumps({"x": 1, **FailureReportRow.fields(failure.failure_report())}) + "\n", "utf-8")
    assert main(["verdict", str(source), "--client", str(rows)]) == 0
    other = tmp_path / "other.json"
    other.write_text(json.dumps(["someone-else"]), "utf-8")
    assert main(["verdict", str(source), "--client", str(other)]) == 1
    assert "is not in the client's record" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json", "not JSON"),
        ("[]", "no journal"),
        ('{"journal": [{"index": -1}]}', "not a verdict file"),
        ('{"journal": 3}', "no journal"),
    ],
)
def test_a_file_that_is_not_a_verdict_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, says: str
) -> None:
    path = tmp_path / "v.json"
    path.write_text(content, encoding="utf-8")
    assert main(["verdict", str(path)]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert len(err.strip().splitlines()) == 1


def test_an_endpoint_that_cannot_be_reached_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verdict", "http://127.0.0.1:1"]) == 2
    assert "cannot read the journal" in capsys.readouterr().err


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(
    journal=st.lists(
        st.dictionaries(st.sampled_from(list(Attempt.model_fields)), JSON, max_size=8), max_size=4
    )
)
def test_any_json_journal_is_judged_or_refused_in_one_line(journal: list[dict[str, Any]]) -> None:
    import contextlib
    import io
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "v.json"
        path.write_text(json.dumps({"journal": journal}), encoding="utf-8")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = main(["verdict", str(path)])
    assert status in (0, 1, 2)
    assert (status == 2) == bool(err.getvalue())
    assert "Traceback" not in err.getvalue()


@given(value=JSON)
def test_any_json_client_record_is_read_or_refused(value: Any) -> None:
    import contextlib
    import io
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        source, client = Path(directory) / "v.json", Path(directory) / "c.json"
        source.write_text(json.dumps(_document(attempt(0, 0.0))), encoding="utf-8")
        client.write_text(json.dumps(value), encoding="utf-8")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = main(["verdict", str(source), "--client", str(client)])
    assert status in (0, 2)
    assert "Traceback" not in err.getvalue()


def test_a_reply_the_client_left_is_its_own_timeout_and_retryable() -> None:
    left = attempt(0, 0.0, end=5.0, status=499, outcome="disconnected", fault="slow", event_id="s0")
    assert findings(left, attempt(1, 6.0)) == []
    assert findings(left) == ["gave_up"]


def test_a_malformed_chunk_taken_as_an_answer_is_a_warning() -> None:
    bad = attempt(0, 0.0, stream=True, fault="malformed_chunk", outcome="malformed", event_id="m0")
    assert findings(bad) == ["malformed_chunk_ignored"]
    assert findings(bad, attempt(1, 1.0)) == []
    assert findings(bad, attempt(1, 1.0), client=["other"]) == []  # no record can hold it
    assert judge([bad]).passed


def test_no_read_timeout_at_its_bound() -> None:
    def waited(delay: float) -> Attempt:
        return attempt(0, 0.0, end=delay, stream=True, fault="stall", delay_s=delay, event_id="w0")

    assert findings(waited(READ_TIMEOUT_S - 0.5)) == []
    assert findings(waited(READ_TIMEOUT_S)) == ["no_read_timeout"]
    assert [f.finding for f in judge([waited(2.0)], read_timeout_s=2.0).findings] == ["no_read_timeout"]
    left = attempt(0, 0.0, end=5.0, status=499, outcome="disconnected", fault="stall", delay_s=60.0)
    assert "no_read_timeout" not in findings(left)
