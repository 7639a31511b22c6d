"""The recovery verdict on journals built by hand, call by call: each finding at its bounds, the
careful-vs-careless pairs (every "recovered" claim has a careless twin that fails), the client's
record (what an agent failed with, what a success was built on, what was only seen), the command,
and the readers of a verdict file and of a client's record (property tests).

The grouping bases themselves are tested in test_calls.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gym_failures.cli import main
from gym_failures.failure_records import FailureReport
from gym_failures.failure_transport import FailureReportRow, RequestFailureLog, observe_failure
from gym_failures.failures import ModelFailure, NgFailureEvent
from gym_failures.model_endpoint import FINDINGS, Attempt, Verdict, client_record, judge, verdict_document
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


BROKEN = {
    "cut": ("cut_stream", "cut_stream_accepted"),
    "failed_stream": ("stream_failed", "failed_stream_accepted"),
    "malformed": ("malformed_chunk", "malformed_chunk_ignored"),
}


def broken(index: int, start: float, outcome: str = "cut", **fields: Any) -> Attempt:
    """A stream that broke: cut, ended in its failure event, or held an event that is not JSON."""
    fault = BROKEN[outcome][0]
    return attempt(index, start, stream=True, fault=fault, outcome=outcome, event_id=f"cut{index}", **fields)


def of(call_attempt: int, call_id: str = "c1") -> dict[str, Any]:
    """The call headers an attempt sent: attempt `call_attempt` of call `call_id`."""
    return {"call_id": call_id, "call_attempt": call_attempt}


def verdict(*attempts: Attempt, client: Any = None, **options: Any) -> Verdict:
    return judge(attempts, None if client is None else client_record(client), **options)


def findings(*attempts: Attempt, client: Any = None, **options: Any) -> list[str]:
    return [f.finding for f in verdict(*attempts, client=client, **options).findings]


def severities(*attempts: Attempt, client: Any = None, **options: Any) -> list[tuple[str, str]]:
    return [(f.finding, f.severity) for f in verdict(*attempts, client=client, **options).findings]


def failure(event_id: str, kind: str = "transport_peer_drop") -> ModelFailure:
    return ModelFailure(failure_kind=kind, failure_reason="broke", event_id=event_id)


def raised_from(event_id: str, cause: NgFailureEvent) -> ModelFailure:
    """A failure raised from `cause` (`raise ... from cause`): its report holds the chain."""
    outer = ModelFailure(failure_kind="model_server_error", failure_reason="failed", event_id=event_id)
    outer.__cause__ = cause
    return outer


def failure_row(error: NgFailureEvent) -> dict[str, Any]:
    """A collector's failure row: the agent failed, and its report names `error`'s chain."""
    envelope = {"failure_kind": "model_server_error", "failure_reason": "failed", "terminal": True}
    return {"failure": envelope, **FailureReportRow.fields(error.failure_report())}


def success_row(built_on: NgFailureEvent | None = None, *seen: NgFailureEvent) -> dict[str, Any]:
    """A collector's success row; `built_on` is its report's `failure_id` (the success was built on a
    call that ended in it), `seen` failures it recovered from."""
    report = FailureReport() if built_on is None else built_on.failure_report()
    for other in seen:
        report = report.merged(other.failure_report().model_copy(update={"failure_id": None}))
    return {"result": {"reward": 1.0}, **FailureReportRow.fields(report)}


# --- timing, between consecutive attempts of one call ----------------------------------------------------


def test_waiting_the_retry_after_is_recovered_and_less_is_a_failure_at_the_bound() -> None:
    assert findings(refused(0, 0.0, **of(1)), attempt(1, 1.0, **of(2))) == []
    assert findings(refused(0, 0.0, **of(1)), attempt(1, 1.0 - CLOCK_SLACK_S, **of(2))) == []
    judged = verdict(refused(0, 0.0, **of(1)), attempt(1, 1.0 - CLOCK_SLACK_S - 0.001, **of(2)))
    assert [(f.finding, f.severity) for f in judged.findings] == [("retry_after_ignored", "failure")]
    assert judged.findings[0].event_ids == ["ev0"]
    assert judged.findings[0].attempts == [0, 1]
    assert judged.findings[0].calls == judged.findings[0].requests == ["id:c1"]
    assert not judged.passed


def test_the_wait_counts_from_the_failed_status_line_else_the_replys_end() -> None:
    assert findings(refused(0, 0.0, end=5.0, **of(1)), attempt(1, 5.5, **of(2))) == ["retry_after_ignored"]
    # An SDK streaming a request acts on the status line, before the body's last bytes.
    early = refused(0, 0.0, answered_s=0.0, end=0.2, **of(1))
    assert findings(early, attempt(1, 1.0, **of(2))) == []
    assert findings(early, attempt(1, 0.9, **of(2))) == ["retry_after_ignored"]
    # A broken reply is known only at its end.
    cut = attempt(0, 0.0, answered_s=0.0, end=2.0, outcome="dropped", fault="drop_connection", **of(1))
    assert findings(cut, attempt(1, 2.0, **of(2))) == ["no_backoff"]


def test_an_attempt_sent_before_the_failure_was_known_is_not_a_reaction_to_it() -> None:
    hedged = [refused(0, 0.0, answered_s=0.5, end=0.6, **of(1)), attempt(1, 0.4, **of(2))]
    assert findings(*hedged) == []
    # From the moment it could know, a retry is judged.
    assert findings(refused(0, 0.0, answered_s=0.5, **of(1)), attempt(1, 0.5, **of(2))) == [
        "retry_after_ignored"
    ]


def test_timing_findings_are_judged_within_a_call_never_across_calls() -> None:
    # Another rollout's first call 0.000 s after a 429 is no retry of it (the NeMo Gym report).
    other_call = [refused(0, 0.0, **of(1, "a")), attempt(1, 0.0, **of(1, "b")), attempt(2, 1.0, **of(2, "a"))]
    assert findings(*other_call) == []
    sdk = [
        refused(0, 0.0, sdk_retry_count=0),
        attempt(1, 0.0, sdk_retry_count=0),
        attempt(2, 1.0, sdk_retry_count=1),
    ]
    assert findings(*sdk) == []


def test_on_a_guessed_call_a_timing_finding_is_a_warning_that_says_so() -> None:
    guessed = verdict(refused(0, 0.0), attempt(1, 0.1))
    severities_seen = [(f.finding, f.severity) for f in guessed.findings]
    assert ("retry_after_ignored", "warning") in severities_seen
    timing = next(f for f in guessed.findings if f.finding == "retry_after_ignored")
    assert "grouping guessed: the client sent no call identity" in timing.message
    # Nor does the guess resolve the 429: the later attempt may be another rollout's call.
    assert ("recovery_unproven", "failure") in severities_seen
    assert not guessed.passed
    # The same journal with the SDKs' retry count, or a call id: a failure.
    for first, second in [({"sdk_retry_count": 0}, {"sdk_retry_count": 1}), (of(1), of(2))]:
        sure = verdict(refused(0, 0.0, **first), attempt(1, 0.1, **second))
        assert [(f.finding, f.severity) for f in sure.findings] == [("retry_after_ignored", "failure")]
        assert "guessed" not in sure.findings[0].message


def test_a_non_retryable_refusal_sent_again_unchanged_in_its_call() -> None:
    bad = refused(0, 0.0, status=400, fault="context_window", retry_after_s=None, **of(1))
    assert severities(bad, attempt(1, 10.0, **of(2))) == [("retried_non_retryable", "failure")]
    # A call that shortened its prompt and tried again did what it should.
    assert findings(bad, attempt(1, 10.0, request="r2", **of(2))) == []
    for status in (408, 409, 429, 500, 529):
        retried = findings(refused(0, 0.0, status=status, **of(1)), attempt(1, 10.0, **of(2)))
        assert "retried_non_retryable" not in retried
    guessed_bad = refused(0, 0.0, status=400, fault="context_window", retry_after_s=None)
    assert severities(guessed_bad, attempt(1, 10.0)) == [("retried_non_retryable", "warning")]


def test_no_backoff_at_its_bound() -> None:
    down = refused(0, 0.0, status=500, fault="server_500", retry_after_s=None, **of(1))
    assert findings(down, attempt(1, NO_BACKOFF_S, **of(2))) == []
    assert severities(down, attempt(1, NO_BACKOFF_S - 0.001, **of(2))) == [("no_backoff", "warning")]
    assert verdict(down, attempt(1, 0.0, **of(2))).passed


def test_a_retry_storm_past_its_bound_only_on_a_call_it_is_sure_of() -> None:
    def run(count: int, identity: str) -> list[Attempt]:
        def ids(n: int) -> dict[str, Any]:
            return of(n + 1) if identity == "call_id" else {"sdk_retry_count": n} if identity == "sdk" else {}

        return [refused(i, i * 2.0, **ids(i)) for i in range(count - 1)] + [
            attempt(count - 1, count * 2.0, **ids(count - 1))
        ]

    for identity in ("call_id", "sdk"):
        assert "retry_storm" not in findings(*run(STORM_ATTEMPTS, identity))
        storm = verdict(*run(STORM_ATTEMPTS + 1, identity))
        assert [f.finding for f in storm.findings] == ["retry_storm"]
        assert len(storm.findings[0].event_ids) == STORM_ATTEMPTS
        assert storm.calls == 1
    guessed = verdict(*run(STORM_ATTEMPTS + 5, "guess"))
    assert guessed.calls_by_basis["guess"] == 1
    # No storm from a guess; each 429 it could not prove recovered is said.
    assert {f.finding for f in guessed.findings} == {"recovery_unproven"}


# --- outcomes: a call's last attempt ---------------------------------------------------------------------


def test_giving_up_with_attempts_left_fails_and_allow_give_up_makes_it_a_warning() -> None:
    alone = verdict(refused(0, 0.0))
    assert [(f.finding, f.severity) for f in alone.findings] == [("gave_up", "failure")]
    assert not alone.passed
    assert "after 1 attempt of 3" in alone.findings[0].message
    allowed = verdict(refused(0, 0.0), allow_give_up=True)
    assert [(f.finding, f.severity) for f in allowed.findings] == [("gave_up", "warning")]
    assert allowed.passed
    # At the bound: fewer attempts than `max_attempts` gave up; as many did not.
    two = [refused(0, 0.0, **of(1)), refused(1, 1.0, **of(2))]
    assert findings(*two) == ["gave_up"]
    # No give-up at the budget; but the journal alone cannot tell whether the agent then failed with
    # the 429 or answered anyway: unhandled, until the agent's failure names it.
    assert findings(*two, max_attempts=2) == ["failure_unhandled"]
    three = [*two, refused(2, 2.0, **of(3))]
    assert findings(*three) == ["failure_unhandled"]
    named = ModelFailure(failure_kind="provider_quota_exhausted", failure_reason="429", event_id="ev2")
    assert verdict(*three, client=named).passed  # the other 429s are only unmatched (warnings)
    # The client's own numbering counts: attempt 3 of its call, whatever the journal kept.
    assert findings(refused(0, 0.0, **of(3))) == ["failure_unhandled"]
    assert findings(refused(0, 0.0, sdk_retry_count=2)) == ["failure_unhandled"]
    # Nothing to retry: a refusal for what the request is (and no fault: nothing to handle).
    assert findings(refused(0, 0.0, status=401, fault=None)) == []
    # A refusal for what the request is: the agent's to act on (a shorter prompt), no retry owed.
    assert findings(refused(0, 0.0, status=400, fault="context_window", retry_after_s=None)) == []


@pytest.mark.parametrize("outcome", sorted(BROKEN))
def test_a_call_that_ended_in_a_broken_stream_fails_from_the_journal_alone_and_says_so(outcome: str) -> None:
    judged = verdict(broken(0, 0.0, outcome, **of(1)))
    assert [(f.finding, f.severity) for f in judged.findings] == [(BROKEN[outcome][1], "failure")]
    assert judged.findings[0].event_ids == ["cut0"]
    assert "judged from the journal alone" in judged.findings[0].message
    assert "the client's record would show whether the agent failed with it" in judged.findings[0].message


@pytest.mark.parametrize(
    "first",
    [
        broken(0, 0.0, "cut", **of(1)),
        broken(0, 0.0, "failed_stream", **of(1)),
        broken(0, 0.0, "malformed", **of(1)),
        refused(0, 0.0, **of(1)),
        attempt(0, 0.0, outcome="dropped", fault="drop_connection", event_id="cut0", **of(1)),
        attempt(0, 0.0, end=5.0, status=499, outcome="disconnected", fault="slow", event_id="cut0", **of(1)),
    ],
    ids=["cut", "failed_stream", "malformed", "429", "dropped", "disconnected"],
)
def test_a_fault_then_a_success_of_the_same_call_is_recovered_with_and_without_the_record(
    first: Attempt,
) -> None:
    retried = [first, attempt(1, 6.0, **of(2))]
    assert findings(*retried) == []
    assert findings(*retried, client=[first.event_id]) == []  # seen, and the call recovered
    assert findings(*retried, client=[success_row(None, failure(str(first.event_id)))]) == []
    # Careless twin: the same fault, and the next attempt is another call (the next turn).
    careless = [first, attempt(1, 6.0, request="r2", **of(1, "c2"))]
    assert not verdict(*careless).passed
    assert not verdict(*careless, client=[first.event_id]).passed


def test_a_cut_joined_into_the_answer_fails_with_and_without_the_record() -> None:
    """The careless streaming agent: the half stream is its answer, its success row names the cut
    (`failure_id`: the answer was built on a call that ended in it), and the next turn follows."""
    journal = [broken(0, 0.0), attempt(1, 2.0, request="r2")]
    assert severities(*journal) == [("cut_stream_accepted", "failure")]
    with_record = verdict(*journal, client=[success_row(failure("cut0"))])
    assert [(f.finding, f.severity) for f in with_record.findings] == [("cut_stream_accepted", "failure")]
    assert "a success built on it" in with_record.findings[0].message
    # Even when the journal says the call recovered: the client says its answer was built on the cut.
    recovered = [broken(0, 0.0, **of(1)), attempt(1, 2.0, **of(2))]
    assert findings(*recovered) == []
    assert findings(*recovered, client=[success_row(failure("cut0"))]) == ["cut_stream_accepted"]


def test_seen_is_not_handled_only_the_agents_own_failure_resolves_a_broken_stream() -> None:
    cut = broken(0, 0.0, **of(1))
    with RequestFailureLog.capture() as log:
        observe_failure(failure("cut0"))
    for seen in (["cut0"], log, log.report, [success_row(None, failure("cut0"))]):
        judged = verdict(cut, client=seen)
        assert [(f.finding, f.severity) for f in judged.findings] == [("cut_stream_accepted", "failure")]
        assert "seen is not handled" in judged.findings[0].message
    # The agent failed with it: handled, but a retry could have recovered it (attempts left).
    for failed_with in ([failure_row(failure("cut0"))], failure("cut0")):
        assert severities(cut, client=failed_with) == [("gave_up", "failure")]
        assert verdict(cut, client=failed_with, allow_give_up=True).passed
    # Its failure raised from the cut names it through its chain.
    assert findings(cut, client=[failure_row(raised_from("own", failure("cut0")))]) == ["gave_up"]
    # Failed with it after its last attempt: nothing left to find.
    three = [broken(0, 0.0, **of(1)), broken(1, 1.0, **of(2)), broken(2, 2.0, **of(3))]
    judged = verdict(*three, client=[failure_row(failure("cut2"))])
    assert judged.failures == []
    assert {f.finding for f in judged.findings} == {"unmatched_fault"}  # the first two cuts left no trace
    assert [f.finding for f in verdict(*three, client=["cut2"]).failures] == ["cut_stream_accepted"]


def test_giving_up_on_a_429_fails_even_when_the_agent_answers_with_its_failure() -> None:
    """The agent that never retries a 429 and answers 500: its failure names the 429, and it could
    have waited and asked again."""
    alone = [refused(0, 0.0)]
    assert severities(*alone, client=[failure_row(failure("ev0", "provider_quota_exhausted"))]) == [
        ("gave_up", "failure")
    ]
    assert verdict(*alone, client=[failure_row(failure("ev0"))], allow_give_up=True).passed
    # Careful twin: waited the Retry-After within the call and answered.
    assert verdict(refused(0, 0.0, **of(1)), attempt(1, 1.0, **of(2))).passed


def test_a_success_built_on_a_fault_is_a_failure_whatever_the_journal_says() -> None:
    built_on = success_row(raised_from("outer", failure("ev0", "provider_quota_exhausted")))
    recovered = [refused(0, 0.0, **of(1)), attempt(1, 1.5, **of(2))]
    assert findings(*recovered) == []
    judged = verdict(*recovered, client=[built_on])
    assert [(f.finding, f.severity) for f in judged.findings] == [("failure_accepted", "failure")]
    assert "a success was built on a call that ended in this fault" in judged.findings[0].message
    # A call that ended in the 429: the finding is the success built on it, not a give-up.
    assert findings(refused(0, 0.0), client=[built_on]) == ["failure_accepted"]
    assert findings(refused(0, 0.0), client=[built_on], allow_give_up=True) == ["failure_accepted"]


def test_a_fault_the_clients_rows_hold_no_trace_of_is_a_warning() -> None:
    recovered = [refused(0, 0.0, **of(1)), attempt(1, 1.5, **of(2))]
    judged = verdict(*recovered, client=["another-event"])
    assert [(f.finding, f.severity) for f in judged.findings] == [("unmatched_fault", "warning")]
    assert "hold no trace of it" in judged.findings[0].message
    assert judged.passed
    # Its attempt id (`<call id>.<attempt>`) is a trace too.
    traced = ModelFailure(failure_kind="provider_quota_exhausted", failure_reason="x", attempt_id="c1.1")
    assert findings(*recovered, client=[traced]) == []
    other_attempt = ModelFailure(
        failure_kind="provider_quota_exhausted", failure_reason="x", attempt_id="c1.2"
    )
    assert findings(*recovered, client=[other_attempt]) == ["unmatched_fault"]
    # A record cut short proves no absence; no record, no such finding.
    assert findings(*recovered, client=[FailureReport(omitted=True)]) == []
    assert findings(*recovered) == []
    # A fault that answered (a slow reply) leaves nothing to record.
    assert findings(attempt(0, 0.0, fault="slow", delay_s=1.0, event_id="s0"), client=["x"]) == []


def test_a_record_cut_short_resolves_nothing_and_proves_no_absence() -> None:
    short = FailureReport(omitted=True)
    judged = verdict(broken(0, 0.0, **of(1)), client=[short])
    assert [(f.finding, f.severity) for f in judged.findings] == [("cut_stream_accepted", "failure")]
    assert "the record was cut short" in judged.findings[0].message
    # The retry of the same call still recovers it, and no fault is called untraced.
    assert findings(broken(0, 0.0, **of(1)), attempt(1, 1.0, **of(2)), client=[short]) == []


def test_a_reply_the_client_left_is_its_own_timeout_and_retryable() -> None:
    left = attempt(0, 0.0, end=5.0, status=499, outcome="disconnected", fault="slow", event_id="s0")
    assert findings(left.model_copy(update=of(1)), attempt(1, 6.0, **of(2))) == []
    assert findings(left) == ["gave_up"]
    # On a guess, a later attempt with the same body proves no retry.
    assert findings(left, attempt(1, 6.0)) == ["recovery_unproven"]


def test_a_reply_the_client_left_with_no_fault_is_its_own_choice() -> None:
    """A `break` out of a stream, or its own timeout on a reply nobody slowed: no give-up."""
    left = attempt(0, 0.0, end=0.2, status=200, outcome="disconnected", stream=True)
    assert findings(left) == []
    assert findings(left.model_copy(update=of(1))) == []


def test_no_read_timeout_at_its_bound() -> None:
    def waited(delay: float) -> Attempt:
        return attempt(0, 0.0, end=delay, stream=True, fault="stall", delay_s=delay, event_id="w0")

    assert findings(waited(READ_TIMEOUT_S - 0.5)) == []
    assert findings(waited(READ_TIMEOUT_S)) == ["no_read_timeout"]
    assert [f.finding for f in judge([waited(2.0)], read_timeout_s=2.0).findings] == ["no_read_timeout"]
    left = attempt(0, 0.0, end=5.0, status=499, outcome="disconnected", fault="stall", delay_s=60.0)
    assert "no_read_timeout" not in findings(left)


def test_the_text_names_calls_their_basis_findings_and_events() -> None:
    text = verdict(refused(0, 0.0, **of(1)), attempt(1, 0.1, **of(2))).text()
    assert text.startswith("NOT recovered: 2 attempts of 1 call; quota_429 x1; from the server's journal")
    assert "failure: retry_after_ignored" in text
    assert "[call id:c1; event ev0]" in text
    guessed = verdict(refused(0, 0.0), attempt(1, 1.5), attempt(2, 3.0, **of(1))).text()
    assert guessed.startswith(
        "NOT recovered: 3 attempts of 2 calls (1 grouped by guess: the client sent no call identity); "
        "quota_429 x1"
    )
    assert "failure: recovery_unproven" in guessed


def test_every_finding_has_a_default_severity() -> None:
    assert set(FINDINGS.values()) == {"failure", "warning"}
    warnings = [name for name, severity in FINDINGS.items() if severity == "warning"]
    assert warnings == ["no_backoff", "no_read_timeout", "unmatched_fault"]


# --- the client's record -----------------------------------------------------------------------------


def test_the_clients_record_sorts_ids_into_failed_accepted_and_seen() -> None:
    with RequestFailureLog.capture() as log:
        observe_failure(ModelFailure(failure_kind="transport_peer_drop", failure_reason="cut", event_id="a"))
    raised = raised_from("e", failure("f"))
    nemo_failure = {
        "_ng_failure_class": "model_server_error",
        "_ng_failure_terminal": True,
        **FailureReportRow.fields(failure("n").failure_report()),
    }
    record = client_record(
        log,  # seen
        [failure_row(failure("b"))],  # failed
        [success_row(failure("c"), failure("c-recovered"))],  # accepted: c; c-recovered only seen
        raised,  # failed: e and its cause f
        failure("g").failure_report(),  # a bare report: seen
        "d",  # seen
        [nemo_failure],  # a NeMo Gym failure row: failed
        {**failure_row(failure("p")), "_ng_no_persist": True},  # never to be saved: seen only
        {**failure_row(failure("q")), "result": {"reward": 1}},  # both outcomes: seen only
        {**FailureReportRow.fields(failure("r").failure_report()), "failure": "text"},  # a bad value
        FailureReportRow.fields(failure("s").failure_report()),  # no outcome: seen only
    )
    assert record.failed_ids == {"b", "e", "f", "n"}
    assert record.accepted_ids == {"c"}
    assert record.seen_ids == {"a", "b", "c", "c-recovered", "d", "e", "f", "g", "n", "p", "q", "r", "s"}
    assert record.event_ids == record.seen_ids
    assert not record.omitted
    with pytest.raises(TypeError, match="not a client record"):
        client_record(3)


def test_a_success_rows_failure_id_brings_its_cause_chain() -> None:
    record = client_record(success_row(raised_from("top", failure("cut0"))))
    assert record.accepted_ids == {"top", "cut0"}
    assert record.failed_ids == frozenset()


def test_a_record_cut_short_says_so() -> None:
    row: dict[str, Any] = {
        FailureReportRow.EVENTS: {},
        FailureReportRow.FAILURE_ID: None,
        FailureReportRow.OMITTED: True,
    }
    assert client_record([row]).omitted
    assert client_record({FailureReportRow.EVENTS: 3}).omitted  # an unreadable saved report


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
ROW_KEYS = st.sampled_from(
    [
        "failure",
        "result",
        "reward",
        "response",
        "attempt",
        "_ng_failure_class",
        "_ng_failure_terminal",
        "_ng_no_persist",
        FailureReportRow.EVENTS,
        FailureReportRow.FAILURE_ID,
        FailureReportRow.OMITTED,
    ]
)
REPORTS = st.sampled_from(
    [
        FailureReportRow.fields(failure("x").failure_report()),
        FailureReportRow.fields(failure("y").failure_report().model_copy(update={"failure_id": None})),
        {},
    ]
)


@given(base=REPORTS, row=st.dictionaries(ROW_KEYS | st.text(max_size=6), JSON, max_size=6))
def test_any_row_is_evidence_or_none_and_never_raises(base: dict[str, Any], row: dict[str, Any]) -> None:
    record = client_record({**base, **row})
    assert record.failed_ids <= record.seen_ids
    assert record.accepted_ids <= record.seen_ids
    assert not record.failed_ids & record.accepted_ids


@given(value=JSON)
def test_any_json_is_a_client_record_or_a_type_error(value: Any) -> None:
    try:
        record = client_record(value)
    except TypeError:
        # Only a value that holds a bare number or true/false (no row is refused).
        assert not isinstance(value, dict)
        return
    assert record.failed_ids <= record.seen_ids


# --- more evidence never flips a verdict to a pass ------------------------------------------------------

KINDS = ["ok", "429", "500", "400", "cut", "failed_stream", "malformed", "dropped", "disconnected", "slow"]


@st.composite
def journals(draw: st.DrawFn) -> list[Attempt]:
    made: list[Attempt] = []
    start = 0.0
    for index in range(draw(st.integers(1, 7))):
        start += draw(st.sampled_from([0.0, 0.01, 0.5, 2.0]))
        end = start + draw(st.sampled_from([0.0, 0.1, 3.0]))
        kind = draw(st.sampled_from(KINDS))
        identity = draw(st.sampled_from(["guess", "sdk", "call"]))
        fields: dict[str, Any] = {"request": draw(st.sampled_from(["r1", "r2"])), "end": end}
        if identity == "sdk":
            fields["sdk_retry_count"] = draw(st.integers(0, 3))
        elif identity == "call":
            fields.update(of(draw(st.integers(1, 4)), draw(st.sampled_from(["a", "b"]))))
        if kind == "ok":
            made.append(attempt(index, start, **fields))
        elif kind in ("429", "500", "400"):
            wait = 1.0 if kind == "429" else None
            status, fault = {
                "429": (429, "quota_429"),
                "500": (500, "server_500"),
                "400": (400, "context_window"),
            }[kind]
            made.append(refused(index, start, status=status, fault=fault, retry_after_s=wait, **fields))
        elif kind in BROKEN:
            made.append(broken(index, start, kind, **fields))
        elif kind == "slow":
            made.append(attempt(index, start, fault="slow", delay_s=40.0, event_id=f"cut{index}", **fields))
        else:
            status = 499 if kind == "disconnected" else 200
            made.append(
                attempt(
                    index, start, status=status, outcome=kind, fault="x", event_id=f"cut{index}", **fields
                )
            )
    return made


def _failing(judged: Verdict) -> set[int]:
    return {f.attempts[0] for f in judged.failures}


@given(journal=journals(), data=st.data())
def test_more_evidence_never_turns_a_finding_into_a_pass_but_the_agents_own_failure(
    journal: list[Attempt], data: st.DataObject
) -> None:
    ids = sorted({a.event_id for a in journal if a.event_id is not None} | {"unrelated"})
    seen = data.draw(st.lists(st.sampled_from(ids), max_size=4))
    accepted = data.draw(st.lists(st.sampled_from(ids), max_size=2))
    failed_with = data.draw(st.lists(st.sampled_from(ids), max_size=2))
    alone = judge(journal)
    without_failures = judge(journal, client_record(seen, [success_row(failure(i)) for i in accepted]))
    assert _failing(alone) <= _failing(without_failures)
    assert alone.passed or not without_failures.passed
    record = client_record(
        seen, [success_row(failure(i)) for i in accepted], [failure_row(failure(i)) for i in failed_with]
    )
    judged = judge(journal, record)
    by_index = {a.index: a for a in journal}
    for index in _failing(alone) - _failing(judged):
        # Only the agent's own failure naming the fault resolves a finding.
        assert by_index[index].event_id in record.failed_ids


# --- gym-failures verdict -----------------------------------------------------------------------------


def _document(*attempts: Attempt) -> dict[str, Any]:
    return verdict_document(judge(attempts), attempts)


def test_the_command_prints_the_verdict_and_exits_1_on_a_failing_finding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(_document(refused(0, 0.0, **of(1)), attempt(1, 0.1, **of(2)))), encoding="utf-8"
    )
    assert main(["verdict", str(bad)]) == 1
    assert "retry_after_ignored" in capsys.readouterr().out
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps(_document(refused(0, 0.0, **of(1)), attempt(1, 1.5, **of(2)))), encoding="utf-8"
    )
    assert main(["verdict", str(good), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["passed"] is True
    assert (printed["calls"], printed["requests"], printed["calls_by_basis"]["call_id"]) == (1, 1, 1)


def test_the_command_allows_a_give_up_and_takes_the_attempts_a_call_may_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "verdict.json"
    source.write_text(json.dumps(_document(refused(0, 0.0))), encoding="utf-8")
    assert main(["verdict", str(source)]) == 1
    assert "failure: gave_up" in capsys.readouterr().out
    assert main(["verdict", str(source), "--allow-give-up"]) == 0
    assert "warning: gave_up" in capsys.readouterr().out
    # At the budget no give-up, but the journal alone cannot say the agent failed with the 429.
    assert main(["verdict", str(source), "--max-attempts", "1"]) == 1
    assert "failure: failure_unhandled" in capsys.readouterr().out
    assert main(["verdict", str(source), "--max-attempts", "0"]) == 2


def test_the_command_judges_again_with_the_clients_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "verdict.json"
    source.write_text(json.dumps(_document(broken(0, 0.0, **of(1)))), encoding="utf-8")
    assert main(["verdict", str(source)]) == 1
    assert "judged from the journal alone" in capsys.readouterr().out

    def rows(*values: dict[str, Any]) -> str:
        path = tmp_path / f"rows-{len(list(tmp_path.iterdir()))}.jsonl"
        path.write_text("".join(json.dumps({"x": 1, **value}) + "\n" for value in values), "utf-8")
        return str(path)

    failed_with = rows(failure_row(failure("cut0")))
    assert main(["verdict", str(source), "--client", failed_with]) == 1  # failed with it: gave up
    assert "failure: gave_up" in capsys.readouterr().out
    assert main(["verdict", str(source), "--client", failed_with, "--allow-give-up"]) == 0
    capsys.readouterr()
    assert main(["verdict", str(source), "--client", rows(success_row(failure("cut0")))]) == 1
    assert "a success built on it" in capsys.readouterr().out
    seen_only = tmp_path / "seen.json"
    seen_only.write_text(json.dumps(["cut0"]), "utf-8")
    assert main(["verdict", str(source), "--client", str(seen_only), "--allow-give-up"]) == 1
    assert "seen is not handled" in capsys.readouterr().out


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


# --- found by review: a guessed join never resolves a broken stream; a log's own failure is accepted --


def test_a_guessed_join_never_resolves_a_cut_another_rollout_of_the_same_prompt_cannot_hide_it() -> None:
    """No call identity: a cut stream, then another attempt with the same body (another rollout of
    the prompt, or the retry: nothing tells). The cut stays a failing finding; with a call id the
    same journal is a retry that recovered."""
    cut = attempt(0, 0.0, end=1.0, outcome="cut", fault="cut_stream", event_id="evc", stream=True)
    later = attempt(1, 2.0, stream=True)
    verdict = judge([cut, later])
    assert [(f.finding, f.severity) for f in verdict.findings] == [("cut_stream_accepted", "failure")]
    assert "no call identity" in verdict.findings[0].message
    named = [
        cut.model_copy(update={"call_id": "c1", "call_attempt": 1}),
        later.model_copy(update={"call_id": "c1", "call_attempt": 2}),
    ]
    assert judge(named).passed
    # The agent's own failure naming the cut resolves it, guessed or not.
    assert judge(
        [cut, later],
        client_record(ModelFailure(failure_kind="transport_peer_drop", failure_reason="cut", event_id="evc")),
    ).passed


def test_a_log_whose_reply_names_the_calls_429_as_its_own_fails_the_verdict() -> None:
    """The careless agent catches the 429 its SDK's retries ran out on and answers anyway: its log's
    own report names the 429; the verdict with that log fails, however many attempts the call made."""
    calls = [refused(n, float(n), retry_after_s=0.0, call_id="c1", call_attempt=n + 1) for n in range(3)]
    # The journal alone: the SDK raised after its last attempt, and whether the agent failed with it
    # or answered anyway, only the client's record can say.
    assert [f.finding for f in judge(calls).findings] == ["failure_unhandled"]
    from gym_failures.failure_transport import observe_model_operation

    with RequestFailureLog.capture() as log:
        for n in range(3):  # the hook observed each attempt's 429
            quota = ModelFailure(
                failure_kind="provider_quota_exhausted", failure_reason="429", event_id=f"ev{n}"
            )
            observe_failure(quota)
        observe_model_operation("c1", "failed", "c1.3", failure_id="ev2", http_attempts=3)
    verdict = judge(calls, client_record(log))
    assert [f.finding for f in verdict.findings] == ["failure_accepted"]
    assert not verdict.passed
