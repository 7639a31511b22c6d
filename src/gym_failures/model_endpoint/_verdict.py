"""The recovery verdict: what a client did after each fault the endpoint injected, from the journal of
every attempt and, where the client runs gym-failures, from its own record of what happened.

The unit is the logical call (`gym_failures.model_endpoint._calls`: grouped by the call id the client
sends, else the SDKs' retry count, else a guess that says so), and a call's outcome is its LAST
attempt. A fault followed by a successful later attempt of the same call is recovered.

Findings (`FINDINGS` gives each its default severity; a finding carries its own), each naming the
calls, attempts and event ids behind it:

    retry_after_ignored     failure  a retry came sooner than the Retry-After the failure asked for
    retried_non_retryable   failure  a request refused for what it is (400, 401, 403, 404, 413, 422, a
                                     context window) was sent again unchanged, in the same call
    retry_storm             failure  one call was attempted more than `storm_attempts` times
    cut_stream_accepted     failure  a call ended in a stream cut before its terminal event, and no
                                     failure of the agent names it
    failed_stream_accepted  failure  a call ended in a stream's failure event, and no failure of the
                                     agent names it
    malformed_chunk_ignored failure  a call ended in a stream with an event that is not JSON, and no
                                     failure of the agent names it
    failure_accepted        failure  the client's record holds a success built on a call that ended
                                     in this fault (its row's `failure_id` names it), or its log
                                     ends the call in it and no failure of the agent names it
    failure_unhandled       failure  a call spent its attempts on a failure a retry can recover from,
                                     and no failure of the agent names it (from the journal alone:
                                     the client's record would tell)
    recovery_unproven       failure  on a guessed call, a failed attempt was followed by one with the
                                     same body: its retry or another rollout's call, nobody can tell
    gave_up                 failure  a call ended in a failure a retry can recover from, with fewer
                                     than `max_attempts` attempts (a warning with `allow_give_up`)
    no_backoff              warning  a retry after a failure without Retry-After came at once (under
                                     `NO_BACKOFF_S`)
    no_read_timeout         warning  the client waited out a `slow`, `stall` or `slow_first_token` of
                                     at least `read_timeout_s` (default 30 s) to its end
    unmatched_fault         warning  the client's record holds no trace of a fault that failed an
                                     attempt (its event id, or the attempt's `<call id>.<attempt>`)

Seen is not handled. The one piece of evidence that resolves a call that ended in a fault is the
agent's own failure naming it (`ClientRecord.failed_ids`: handling by failing; a call that could
still have been retried is then `gave_up`). Evidence of having SEEN a fault (its id in a log, in a
success row, anywhere) never resolves anything. So the journal alone never passes a call that ended
in an injected fault: it cannot know whether the agent failed with it or answered anyway, and says
so (`failure_unhandled`, or a stream's finding). More evidence may add findings (`failure_accepted`,
`unmatched_fault`, a stream finding from `accepted_ids`); it turns a finding into a pass only by that
one piece of evidence, the agent's failure naming the fault. Nor does a guess: a later attempt with
the same body never resolves a failed attempt of a guessed call (`recovery_unproven`), since another
rollout of the same prompt sends that body too.

Decisions:
- Timing findings (`retry_after_ignored`, `no_backoff`, `retried_non_retryable`) are judged only
  between consecutive attempts of one call, and only when the later one arrived after the client
  could know of the failure (an attempt that overlaps the failure is not a reaction to it). On a
  guessed call they are warnings, and say the grouping was guessed. `retry_storm` is raised only on
  calls grouped by call id or SDK retry count, never on a guess. An SDK retry that several open
  calls with its body awaited (`Call.alternatives`) is judged against each: a timing finding is a
  warning when the retry would have none as the retry of one of the others, a failure when it is
  too soon (or a resend) whichever call it retried.
- A reply the client left (`disconnected`) with no fault injected is the client's choice (a `break`,
  its own timeout on a slow reply): no give-up.
- Waits are measured on the server, from the moment the client could know of the failure (a failed
  status: its status line; a broken reply: its end) to the next attempt's arrival. A client that
  waited W seconds after learning of it arrives at least W later, so the check has only
  `CLOCK_SLACK_S` of slack and never depends on the machine's speed: a slow machine makes gaps
  longer, never shorter.
- Retryable: 408, 409, 429 and every 5xx (the official SDKs' rule), a dropped connection, a cut,
  failed or malformed stream, and a reply the client left before its end (its own timeout). Every
  other 4xx is non-retryable. `max_attempts` defaults to 3, the SDKs' 1 + 2 retries.
- `retried_non_retryable` needs the same body: a call that shortened a prompt over the context window
  and tried again did what it should.
- `unmatched_fault` is only for faults that failed an attempt (a slow or empty reply that answered
  leaves nothing for a client to record), and only with a record that was not cut short (`omitted`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gym_failures.model_endpoint._calls import Call, by_basis, failed, group_calls, known_s, retryable
from gym_failures.model_endpoint._journal import Attempt

__all__ = [
    "CLOCK_SLACK_S",
    "FINDINGS",
    "MAX_CALL_ATTEMPTS",
    "NO_BACKOFF_S",
    "READ_TIMEOUT_S",
    "STORM_ATTEMPTS",
    "ClientRecord",
    "Finding",
    "Verdict",
    "client_record",
    "judge",
    "verdict_document",
]

Severity = Literal["failure", "warning"]

FINDINGS: Mapping[str, Severity] = {
    "retry_after_ignored": "failure",
    "retried_non_retryable": "failure",
    "retry_storm": "failure",
    "cut_stream_accepted": "failure",
    "failed_stream_accepted": "failure",
    "malformed_chunk_ignored": "failure",
    "failure_accepted": "failure",
    "failure_unhandled": "failure",
    "recovery_unproven": "failure",
    "gave_up": "failure",
    "no_backoff": "warning",
    "no_read_timeout": "warning",
    "unmatched_fault": "warning",
}
"""Every finding, with its default severity: a `failure` fails the verdict, a `warning` does not.
A finding may carry another (`gave_up` with `allow_give_up`, a timing finding on a guessed call)."""

CLOCK_SLACK_S = 0.005
NO_BACKOFF_S = 0.05
STORM_ATTEMPTS = 10
READ_TIMEOUT_S = 30.0
MAX_CALL_ATTEMPTS = 3
"""The attempts a call may make before giving up is its due: the official SDKs' 1 + 2 retries."""

_STREAM_FINDINGS = {
    "cut": ("cut_stream_accepted", "the stream was cut before its terminal event"),
    "failed_stream": ("failed_stream_accepted", "the stream ended in its failure event"),
    "malformed": ("malformed_chunk_ignored", "a stream event was not JSON"),
}
_GUESSED = "; grouping guessed: the client sent no call identity"
_AMBIGUOUS = "; which call this retried is a guess: several calls with its body awaited a retry"


class Finding(BaseModel):
    """One thing the client did wrong (or questionably) after a fault."""

    model_config = ConfigDict(frozen=True)

    finding: str
    severity: Severity
    message: str
    requests: list[str] = Field(default_factory=list)
    """The keys of the calls behind the finding (the name kept from when the unit was a request)."""
    calls: list[str] = Field(default_factory=list)
    """The keys of the calls behind the finding (`Call.key`)."""
    attempts: list[int] = Field(default_factory=list)
    event_ids: list[str] = Field(default_factory=list)


class Verdict(BaseModel):
    """The verdict on a client's recovery: `passed` when no finding is a failure."""

    model_config = ConfigDict(frozen=True)

    passed: bool
    attempts: int
    requests: int
    """How many logical calls (the same as `calls`; the name kept from when the unit was a request)."""
    calls: int = 0
    calls_by_basis: dict[str, int] = Field(default_factory=dict)
    """How many calls each basis grouped: `call_id`, `sdk`, `guess`."""
    faults: dict[str, int] = Field(default_factory=dict)
    """How many attempts got each fault."""
    client_record: bool
    """Whether the client's own record was used."""
    findings: list[Finding] = Field(default_factory=list)

    @property
    def failures(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.severity == "failure"]

    def text(self) -> str:
        """The verdict as a person reads it: one line, then one line per finding."""
        faults = ", ".join(f"{name} x{count}" for name, count in sorted(self.faults.items())) or "no fault"
        basis = "the client's record and the journal" if self.client_record else "the server's journal"
        head = "recovered" if self.passed else "NOT recovered"
        calls = f"{_count(self.attempts, 'attempt')} of {_count(self.calls, 'call')}"
        guessed = self.calls_by_basis.get("guess", 0)
        if guessed:
            calls += f" ({guessed} grouped by guess: the client sent no call identity)"
        lines = [f"{head}: {calls}; {faults}; from {basis}"]
        for finding in self.findings:
            named = [f"call {', '.join(finding.calls or finding.requests)}"]
            if finding.event_ids:
                named.append(f"event {', '.join(finding.event_ids)}")
            lines.append(f"  {finding.severity}: {finding.finding}: {finding.message} [{'; '.join(named)}]")
        return "\n".join(lines)


class ClientRecord(BaseModel):
    """What a client's own record says of the faults (`client_record` reads it):

    `failed_ids`: the event ids an agent's failure names (handled by failing); `accepted_ids`: the
    event ids a success was built on (a success row's `failure_id` and its cause chain); `ended_ids`:
    the event ids a log ends a call in (its own report's `failure_id` and chain: whether the agent
    then answered or raised, a log does not say); `seen_ids`: every event id of every source, the
    others' included; `attempt_ids`: the attempt ids its events name (`<call id>.<attempt>`);
    `omitted`: the record was cut short, so an absence proves nothing.
    """

    model_config = ConfigDict(frozen=True)

    failed_ids: frozenset[str] = frozenset()
    accepted_ids: frozenset[str] = frozenset()
    ended_ids: frozenset[str] = frozenset()
    seen_ids: frozenset[str] = frozenset()
    attempt_ids: frozenset[str] = frozenset()
    omitted: bool = False

    @property
    def event_ids(self) -> frozenset[str]:
        """Every event id the record holds: `seen_ids`, under its earlier name."""
        return self.seen_ids


def client_record(*sources: object) -> ClientRecord:
    """The client's record from `sources`, each one of these or an iterable of them:

    - a row (a mapping; NeMo Gym's rows too, read through `gym_failures.rows.normalized`): a FAILURE
      row (`failure`, no `result`) names every event of its saved report as the agent's failure; a
      SUCCESS row (`result`, no `failure`) whose report has a `failure_id` was built on that failure
      and its cause chain; any other id of a row is only seen. A row is read, never trusted: a bad
      value is no evidence, and no row raises;
    - an `NgFailureEvent` (a failure the agent raised): every event of its chain, failed;
    - a `RequestFailureLog`: seen, and the call its own report's failure ends (`ended_ids`);
    - a `FailureReport`, an event id (a string): seen only.

    Anything else is a `TypeError`."""
    from gym_failures.failure_records import FailureReport
    from gym_failures.failure_transport import FailureReportRow, RequestFailureLog
    from gym_failures.failures import NgFailureEvent
    from gym_failures.rows import is_rollout_row, normalized

    ids: dict[str, set[str]] = {name: set() for name in ("failed", "accepted", "ended", "seen", "attempt")}
    omitted = False

    def seen(report: FailureReport) -> list[str]:
        nonlocal omitted
        omitted = omitted or report.omitted
        for event_id, event in report.events.items():
            ids["seen"].add(event_id)
            if event.attempt_id is not None:
                ids["attempt"].add(event.attempt_id)
        return list(report.events)

    def row(source: Mapping[Any, Any]) -> None:
        if not all(isinstance(key, str) for key in source):
            return  # not a JSON object: no evidence
        read = normalized(source)
        report = FailureReportRow.report(read)
        named = seen(report)
        if not is_rollout_row(read):
            return
        if isinstance(read.get("failure"), Mapping) and "result" not in read:
            ids["failed"].update(named)
        elif isinstance(read.get("result"), Mapping) and "failure" not in read:
            ids["accepted"].update(_chain(report, report.failure_id))

    def add(source: object, depth: int) -> None:
        if isinstance(source, NgFailureEvent):
            ids["failed"].update(seen(source.failure_report()))
        elif isinstance(source, RequestFailureLog):
            seen(source.report)
            # The log's own failure: a call that ended in it (answered from, or raised: not said).
            own = source.own_report()
            ids["ended"].update(_chain(own, own.failure_id))
            operations = source.model_operations.values()
            ids["attempt"].update(op.final_attempt_id for op in operations if op.final_attempt_id is not None)
        elif isinstance(source, FailureReport):
            seen(source)
        elif isinstance(source, str):
            ids["seen"].add(source)
        elif isinstance(source, Mapping):
            row(source)
        elif isinstance(source, Iterable) and depth < 4:
            for item in source:
                add(item, depth + 1)
        elif source is not None:
            raise TypeError(f"not a client record: {type(source).__name__}")

    for source in sources:
        add(source, 0)
    return ClientRecord(**{f"{name}_ids": frozenset(values) for name, values in ids.items()}, omitted=omitted)


def _chain(report: Any, failure_id: str | None) -> list[str]:
    """`failure_id` and its cause chain within `report` (a `FailureReport`)."""
    chain: list[str] = []
    while failure_id is not None and failure_id in report.events and failure_id not in chain:
        chain.append(failure_id)
        failure_id = report.events[failure_id].cause_id
    return chain


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _finding(
    name: str,
    message: str,
    call: Call,
    attempts: Sequence[Attempt],
    severity: Severity | None = None,
    *,
    every_event: bool = False,
) -> Finding:
    """A finding on `attempts` of `call`; its event ids are the first attempt's (the failed one), or
    every attempt's with `every_event` (a storm)."""
    named = attempts if every_event else attempts[:1]
    return Finding(
        finding=name,
        severity=FINDINGS[name] if severity is None else severity,
        message=message,
        requests=[call.key],
        calls=[call.key],
        attempts=[a.index for a in attempts],
        event_ids=[a.event_id for a in named if a.event_id is not None],
    )


def judge(
    attempts: Iterable[Attempt],
    client: ClientRecord | None = None,
    *,
    storm_attempts: int = STORM_ATTEMPTS,
    read_timeout_s: float = READ_TIMEOUT_S,
    max_attempts: int = MAX_CALL_ATTEMPTS,
    allow_give_up: bool = False,
) -> Verdict:
    """The verdict on the attempts of a journal, with the client's record when there is one.

    `storm_attempts` and `read_timeout_s` are the bounds of `retry_storm` and `no_read_timeout`;
    a call that ends in a retryable failure with fewer than `max_attempts` attempts `gave_up`, a
    failure unless `allow_give_up` (a test that expects the give-up) makes it a warning."""
    attempts = list(attempts)
    calls = group_calls(attempts)
    faults = Counter(a.fault for a in attempts if a.fault is not None)
    findings: list[Finding] = []
    for call in calls:
        findings.extend(_call_findings(call, client, storm_attempts, read_timeout_s))
        findings.extend(_outcome_findings(call, client, max_attempts, allow_give_up))
    findings.sort(key=lambda f: (f.severity != "failure", f.attempts[:1], f.finding))
    return Verdict(
        passed=not any(f.severity == "failure" for f in findings),
        attempts=len(attempts),
        requests=len(calls),
        calls=len(calls),
        calls_by_basis=by_basis(calls),
        faults=dict(faults),
        client_record=client is not None,
        findings=findings,
    )


def _call_findings(
    call: Call, client: ClientRecord | None, storm_attempts: int, read_timeout_s: float
) -> Iterable[Finding]:
    """What the client did along the call: a storm, a wait with no read timeout, retries that came
    too soon or should not have come, and faults its record holds no trace of."""
    tries = call.attempts
    if call.basis != "guess" and len(tries) > storm_attempts:
        yield _finding(
            "retry_storm",
            f"call {call.key} was attempted {len(tries)} times (more than {storm_attempts}; "
            f"grouped by {'call id' if call.basis == 'call_id' else 'SDK retry count'})",
            call,
            tries,
            every_event=True,
        )
    for attempt in tries:
        if attempt.outcome == "ok" and attempt.delay_s is not None and attempt.delay_s >= read_timeout_s:
            yield _finding(
                "no_read_timeout",
                f"attempt {attempt.index} ({attempt.fault}) was waited out to its end, "
                f"{attempt.delay_s:g} s: no read timeout under {read_timeout_s:g} s",
                call,
                [attempt],
            )
        if client is not None and not client.omitted and _unmatched(attempt, client):
            yield _finding(
                "unmatched_fault",
                f"attempt {attempt.index} ({attempt.route}, {attempt.fault}) failed, and the client's "
                "rows hold no trace of it (neither its event id nor its attempt id)",
                call,
                [attempt],
            )
    for attempt, following in itertools.pairwise(tries):
        if failed(attempt):
            yield from _retry_findings(call, attempt, following)


def _unmatched(attempt: Attempt, client: ClientRecord) -> bool:
    if attempt.fault is None or attempt.event_id is None or not failed(attempt):
        return False
    if attempt.event_id in client.seen_ids:
        return False
    if attempt.call_id is not None and attempt.call_attempt is not None:
        return f"{attempt.call_id}.{attempt.call_attempt}" not in client.attempt_ids
    return True


def _retry_findings(call: Call, attempt: Attempt, following: Attempt) -> Iterable[Finding]:
    """What the client did after the failed `attempt` with the next attempt of its call: retried
    too soon, or retried what it must not."""
    found = _timing(attempt, following)
    if found is None:
        return
    name, message = found
    severity: Severity | None = None
    if call.basis == "guess":
        severity, message = "warning", message + _GUESSED
    elif any(_timing(other, following) is None for other in call.alternatives.get(following.index, ())):
        severity, message = "warning", message + _AMBIGUOUS
    yield _finding(name, message, call, [attempt, following], severity)


def _timing(attempt: Attempt, following: Attempt) -> tuple[str, str] | None:
    """The timing finding (its name and message) of `following` as the next attempt after the
    failed `attempt`, if it earns one: too soon after a Retry-After or without backoff, or a resend of
    what must not be sent again."""
    gap = following.started_s - known_s(attempt)
    if gap < -CLOCK_SLACK_S:
        return None  # sent before the client could know of the failure: not a reaction to it
    if not retryable(attempt):
        if following.request != attempt.request:
            return None
        return "retried_non_retryable", (
            f"attempt {attempt.index} was refused with {attempt.status} "
            f"({attempt.fault or 'not a fault'}), and attempt {following.index} sent it again unchanged"
        )
    if attempt.retry_after_s is not None:
        if gap + CLOCK_SLACK_S >= attempt.retry_after_s:
            return None
        return "retry_after_ignored", (
            f"attempt {attempt.index} asked for a wait of {attempt.retry_after_s:g} s "
            f"(Retry-After); attempt {following.index} came {max(gap, 0.0):.3f} s later"
        )
    if gap >= NO_BACKOFF_S:
        return None
    return "no_backoff", (
        f"attempt {following.index} came {max(gap, 0.0):.3f} s after attempt {attempt.index} failed "
        f"({attempt.fault or attempt.status}): no backoff"
    )


def _outcome_findings(
    call: Call, client: ClientRecord | None, max_attempts: int, allow_give_up: bool
) -> Iterable[Finding]:
    """How the call ended: a success built on one of its faults (the client's record says so), a
    failed attempt a guess cannot resolve, a give-up with attempts left, or an end in a fault no
    failure of the agent names."""
    accepted: AbstractSet[str] = frozenset() if client is None else client.accepted_ids
    flagged = False
    for attempt in call.attempts:
        if attempt.fault is not None and attempt.event_id is not None and attempt.event_id in accepted:
            flagged = flagged or attempt is call.last
            yield _accepted(call, attempt, "the client's record holds a success built on it (its failure_id)")
    if call.basis == "guess":
        yield from _unproven(call, client, accepted)
    last = call.last
    if flagged or not failed(last) or (last.outcome == "disconnected" and last.fault is None):
        return  # a client that left a reply nobody broke chose to (a `break`, its own timeout)
    handled = client is not None and last.event_id is not None and last.event_id in client.failed_ids
    if last.outcome in _STREAM_FINDINGS and not handled:
        yield _unhandled(call, last, client)
        return
    count = call.attempt_count
    if retryable(last) and count < max_attempts:
        what = f"{last.fault or last.status}{', which the agent failed with' if handled else ''}"
        yield _finding(
            "gave_up",
            f"call {call.key} ended in attempt {last.index} ({last.route}, {what}), a failure a retry "
            f"can recover from, after {_count(count, 'attempt')} of {max_attempts}: no retry followed",
            call,
            [last],
            "warning" if allow_give_up else None,
        )
    elif not handled and last.fault is not None and retryable(last):
        # Retries spent: failing with it is the one handling. A refusal for what the request is (a
        # context window, an MCP tool error) is the agent's to act on: a shorter prompt, the model
        # reading the tool's error.
        yield _unhandled(call, last, client)


def _unproven(call: Call, client: ClientRecord | None, accepted: AbstractSet[str]) -> Iterable[Finding]:
    """A guessed call's failed attempts before its last: a later attempt with the same body may be its
    retry or another rollout's first call, so only a failure of the agent that names one resolves it."""
    for attempt in call.attempts[:-1]:
        named = client is not None and attempt.event_id is not None and attempt.event_id in client.failed_ids
        if named or attempt.event_id in accepted or attempt.fault is None or not retryable(attempt):
            continue
        how = (
            "a later attempt with the same body may be its retry or another rollout's call: the client "
            "sent no call identity, so only a failure of the agent that names it resolves it"
        )
        if attempt.outcome in _STREAM_FINDINGS:
            yield _accepted(call, attempt, how, took=False)
        else:
            yield _finding(
                "recovery_unproven",
                f"journal attempt {attempt.index} ({attempt.route}, {attempt.fault}) failed, and {how} "
                "(send `X-Gym-Call-Id`: `logical_call()`, `observe_attempts`)",
                call,
                [attempt],
            )


def _unhandled(call: Call, last: Attempt, client: ClientRecord | None) -> Finding:
    """The finding of a call that ended in `last`'s fault, which no failure of the agent names."""
    if client is None:
        how = "judged from the journal alone: the client's record would show whether the agent failed with it"
    elif last.event_id is not None and last.event_id in client.ended_ids:
        how = (
            f"the client's log ends its call in event {last.event_id}, and no failure of the agent names "
            "it: if the agent raised it, pass that failure as the client's record (`client=`)"
        )
    elif last.event_id is not None and last.event_id in client.seen_ids:
        how = (
            f"event {last.event_id} is in the client's record, but no failure of the agent names it: "
            "seen is not handled"
        )
    else:
        how = "no failure of the agent in the client's record names it"
    if client is not None and client.omitted:
        how += "; the record was cut short"
    if last.outcome in _STREAM_FINDINGS:
        return _accepted(call, last, how, took=client is not None)
    ended = client is not None and last.event_id is not None and last.event_id in client.ended_ids
    return _finding(
        "failure_accepted" if ended else "failure_unhandled",
        f"call {call.key} ended in attempt {last.index} ({last.route}, {last.fault or last.status}), "
        f"and nothing says the agent failed with it ({how})",
        call,
        [last],
    )


def _accepted(call: Call, attempt: Attempt, how: str, *, took: bool = True) -> Finding:
    """The finding of a call whose answer was built on the faulted `attempt` (`took`: the client's
    record says so; else no later attempt of its call is known and nothing says the agent failed)."""
    if attempt.outcome in _STREAM_FINDINGS:
        name, what = _STREAM_FINDINGS[attempt.outcome]
        if attempt.outcome == "malformed" and not attempt.stream:
            what = "the reply's body was not JSON"
        verdict = "the client took it as an answer" if took else "no attempt of its call followed"
        message = f"{what}, and {verdict}"
    else:
        name, message = "failure_accepted", "a success was built on a call that ended in this fault"
    return _finding(
        name,
        f"journal attempt {attempt.index} ({attempt.route}, {attempt.fault}): {message} ({how})",
        call,
        [attempt],
    )


def verdict_document(verdict: Verdict, attempts: Sequence[Attempt], dropped: int = 0) -> dict[str, Any]:
    """What `--verdict-file` and the control route write: the verdict and the journal it read."""
    return {
        "verdict": verdict.model_dump(mode="json"),
        "journal": [a.model_dump(mode="json") for a in attempts],
        "journal_dropped": dropped,
    }
