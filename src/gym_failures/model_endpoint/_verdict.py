"""The recovery verdict: what a client did after each fault the endpoint injected, from the journal of
every attempt and, where the client runs gym-failures, from its own record of the failures it saw.

Findings (`FINDINGS`), each naming the requests, attempts and event ids behind it:

    retry_after_ignored     failure  a retry came sooner than the Retry-After the failure asked for
    retried_non_retryable   failure  a request refused for what it is (400, 401, 403, 404, 413, 422, a
                                     context window) was sent again unchanged
    retry_storm             failure  one request was attempted more than `storm_attempts` times
    cut_stream_accepted     failure  a stream cut before its terminal event went unnoticed
    failed_stream_accepted  failure  a stream that ended in its failure event went unnoticed
    no_backoff              warning  a retry after a failure without Retry-After came at once (under
                                     `NO_BACKOFF_S`)
    gave_up                 warning  a request's last attempt failed with a failure a retry can recover
                                     from, and no retry followed
    malformed_chunk_ignored warning  a stream with an event that is not JSON went unnoticed
    no_read_timeout         warning  the client waited out a `slow`, `stall` or `slow_first_token` of
                                     at least `read_timeout_s` (default 30 s) to its end

When the client's record is given (`client_event_ids`: a `RequestFailureLog` that `observe_attempts`
filled, a `FailureReport`, a collector's rows, failures, or event ids), a cut or failed stream counts
as noticed only if its event id is in that record: the endpoint names the event of every fault in its
reply (`X-Gym-Fault-Event`), and `observe_attempts` reports a cut under that id. Without a record (or
when the record was cut short, `omitted`), a cut or failed stream counts as noticed when the request
was attempted again, and the finding says it was guessed from the server's side.

Decisions:
- Waits are measured on the server, from the moment the client could know of the failure (a failed
  status: its status line; a broken reply: its end) to the next attempt's arrival. A client that
  waited W seconds after learning of it arrives at least W later, so the check has only
  `CLOCK_SLACK_S` of slack and never depends on the machine's speed: a slow machine makes gaps
  longer, never shorter.
- Retryable: 408, 409, 429 and every 5xx (the official SDKs' rule), a dropped connection, a cut,
  failed or malformed stream, and a reply the client left before its end (its own timeout). Every
  other 4xx is non-retryable.
- `retry_storm` is counted per request (attempts of the same body), default more than 10: the SDKs
  default to 2 retries, and a client past 10 is retrying without a bound.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gym_failures._http_status import is_error, is_server_error
from gym_failures.model_endpoint._journal import Attempt

__all__ = [
    "CLOCK_SLACK_S",
    "FINDINGS",
    "NO_BACKOFF_S",
    "READ_TIMEOUT_S",
    "STORM_ATTEMPTS",
    "ClientRecord",
    "Finding",
    "Verdict",
    "client_record",
    "judge",
]

Severity = Literal["failure", "warning"]

FINDINGS: Mapping[str, Severity] = {
    "retry_after_ignored": "failure",
    "retried_non_retryable": "failure",
    "retry_storm": "failure",
    "cut_stream_accepted": "failure",
    "failed_stream_accepted": "failure",
    "no_backoff": "warning",
    "gave_up": "warning",
    "malformed_chunk_ignored": "warning",
    "no_read_timeout": "warning",
}
"""Every finding, with its severity: a `failure` fails the verdict, a `warning` does not."""

CLOCK_SLACK_S = 0.005
NO_BACKOFF_S = 0.05
STORM_ATTEMPTS = 10
READ_TIMEOUT_S = 30.0

_BREAKS = ("dropped", "cut", "failed_stream", "malformed", "disconnected")


class Finding(BaseModel):
    """One thing the client did wrong (or questionably) after a fault."""

    model_config = ConfigDict(frozen=True)

    finding: str
    severity: Severity
    message: str
    requests: list[str] = Field(default_factory=list)
    attempts: list[int] = Field(default_factory=list)
    event_ids: list[str] = Field(default_factory=list)


class Verdict(BaseModel):
    """The verdict on a client's recovery: `passed` when no finding is a failure."""

    model_config = ConfigDict(frozen=True)

    passed: bool
    attempts: int
    requests: int
    faults: dict[str, int] = Field(default_factory=dict)
    """How many attempts got each fault."""
    client_record: bool
    """Whether the client's own record of the failures it saw was used."""
    findings: list[Finding] = Field(default_factory=list)

    @property
    def failures(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.severity == "failure"]

    def text(self) -> str:
        """The verdict as a person reads it: one line, then one line per finding."""
        faults = ", ".join(f"{name} x{count}" for name, count in sorted(self.faults.items())) or "no fault"
        basis = "the client's record and the journal" if self.client_record else "the server's journal"
        head = "recovered" if self.passed else "NOT recovered"
        lines = [f"{head}: {self.attempts} attempts of {self.requests} requests ({faults}); from {basis}"]
        for finding in self.findings:
            named = [f"request {', '.join(finding.requests)}"]
            if finding.event_ids:
                named.append(f"event {', '.join(finding.event_ids)}")
            lines.append(f"  {finding.severity}: {finding.finding}: {finding.message} [{'; '.join(named)}]")
        return "\n".join(lines)


class ClientRecord(BaseModel):
    """The event ids a client's own record holds, and whether that record was cut short."""

    model_config = ConfigDict(frozen=True)

    event_ids: frozenset[str] = frozenset()
    omitted: bool = False


def client_record(*sources: object) -> ClientRecord:
    """The client's record from `sources`: `RequestFailureLog`s, `FailureReport`s, failures (with
    their causes), rows (mappings holding a saved report), event ids, or iterables of these."""
    from gym_failures.failure_records import FailureReport
    from gym_failures.failure_transport import FailureReportRow, RequestFailureLog
    from gym_failures.failures import NgFailureEvent

    ids: set[str] = set()
    omitted = False

    def add(source: object, depth: int) -> None:
        nonlocal omitted
        if isinstance(source, RequestFailureLog):
            source = source.report
        if isinstance(source, NgFailureEvent):
            source = source.failure_report()
        if isinstance(source, FailureReport):
            ids.update(source.events)
            omitted = omitted or source.omitted
        elif isinstance(source, str):
            ids.add(source)
        elif isinstance(source, Mapping):
            add(FailureReportRow.report(source), depth)
        elif isinstance(source, Iterable) and depth < 4:
            for item in source:
                add(item, depth + 1)
        elif source is not None:
            raise TypeError(f"not a client record: {type(source).__name__}")

    for source in sources:
        add(source, 0)
    return ClientRecord(event_ids=frozenset(ids), omitted=omitted)


def _retryable(attempt: Attempt) -> bool:
    if attempt.outcome in _BREAKS:
        return True
    status = attempt.status
    return is_server_error(status) or status in (408, 409, 429)


def _failed(attempt: Attempt) -> bool:
    return attempt.outcome != "ok" or is_error(attempt.status)


def _finding(name: str, message: str, attempts: Sequence[Attempt]) -> Finding:
    """A finding on `attempts`; its event ids are the failed attempt's (the first), or every
    attempt's for a storm."""
    named = attempts if name == "retry_storm" else attempts[:1]
    return Finding(
        finding=name,
        severity=FINDINGS[name],
        message=message,
        requests=sorted({a.request for a in attempts}),
        attempts=[a.index for a in attempts],
        event_ids=[a.event_id for a in named if a.event_id is not None],
    )


def judge(
    attempts: Iterable[Attempt],
    client: ClientRecord | None = None,
    *,
    storm_attempts: int = STORM_ATTEMPTS,
    read_timeout_s: float = READ_TIMEOUT_S,
) -> Verdict:
    """The verdict on the attempts of a journal, with the client's record when there is one;
    `storm_attempts` and `read_timeout_s` are the bounds of `retry_storm` and `no_read_timeout`."""
    served = sorted(attempts, key=lambda a: (a.started_s, a.index))
    requests: dict[str, list[Attempt]] = defaultdict(list)
    faults: dict[str, int] = defaultdict(int)
    for attempt in served:
        requests[attempt.request].append(attempt)
        if attempt.fault is not None:
            faults[attempt.fault] += 1
    findings: list[Finding] = []
    for request, tries in requests.items():
        findings.extend(_request_findings(request, tries, client, storm_attempts, read_timeout_s))
    findings.sort(key=lambda f: (f.severity != "failure", f.attempts[:1], f.finding))
    return Verdict(
        passed=not any(f.severity == "failure" for f in findings),
        attempts=len(served),
        requests=len(requests),
        faults=dict(faults),
        client_record=client is not None,
        findings=findings,
    )


def _noticed(attempt: Attempt, later: bool, client: ClientRecord | None) -> tuple[bool, str]:
    """Whether the client noticed a broken stream, and how that is known."""
    if client is not None and attempt.event_id is not None and attempt.event_id in client.event_ids:
        return True, "in the client's record"
    if client is not None and not client.omitted:
        return False, f"event {attempt.event_id} is not in the client's record"
    basis = "the client's record was cut short; " if client is not None else "no client record; "
    if later:
        return True, basis + "guessed from the retry"
    return False, basis + "guessed from the server's side: no retry followed"


def _request_findings(
    request: str,
    tries: list[Attempt],
    client: ClientRecord | None,
    storm_attempts: int,
    read_timeout_s: float,
) -> Iterable[Finding]:
    if len(tries) > storm_attempts:
        yield _finding(
            "retry_storm",
            f"request {request} was attempted {len(tries)} times (more than {storm_attempts})",
            tries,
        )
    for position, attempt in enumerate(tries):
        following = tries[position + 1] if position + 1 < len(tries) else None
        if attempt.outcome == "ok" and attempt.delay_s is not None and attempt.delay_s >= read_timeout_s:
            yield _finding(
                "no_read_timeout",
                f"attempt {attempt.index} ({attempt.fault}) was waited out to its end, "
                f"{attempt.delay_s:g} s: no read timeout under {read_timeout_s:g} s",
                [attempt],
            )
        accepted = _accepted_stream(attempt, following is not None, client)
        if accepted is not None:
            yield accepted
        elif _failed(attempt):
            yield from _retry_findings(attempt, following)


def _accepted_stream(attempt: Attempt, retried: bool, client: ClientRecord | None) -> Finding | None:
    """The finding of a broken stream the client took as an answer, if it did."""
    if attempt.outcome == "malformed":
        # No client's record holds a malformed chunk (the SDK raises, nothing observes it): the
        # retry is the only evidence.
        noticed, how = _noticed(attempt, retried, None)
        if noticed:
            return None
        return _finding(
            "malformed_chunk_ignored",
            f"attempt {attempt.index} ({attempt.route}): a stream event was not JSON, and the "
            f"client took the reply as an answer ({how})",
            [attempt],
        )
    if attempt.outcome not in ("cut", "failed_stream"):
        return None
    noticed, how = _noticed(attempt, retried, client)
    if noticed:
        return None
    cut = attempt.outcome == "cut"
    what = "cut before its terminal event" if cut else "ended in its failure event"
    return _finding(
        "cut_stream_accepted" if cut else "failed_stream_accepted",
        f"attempt {attempt.index} ({attempt.route}, {attempt.fault}): the stream {what}, "
        f"and the client took it as an answer ({how})",
        [attempt],
    )


def _retry_findings(attempt: Attempt, following: Attempt | None) -> Iterable[Finding]:
    """What the client did after the failed `attempt`: retried too soon, retried what it must not,
    or gave up."""
    if following is None:
        if _retryable(attempt):
            yield _finding(
                "gave_up",
                f"attempt {attempt.index} ({attempt.route}, {attempt.fault or attempt.status}) failed "
                "with a failure a retry can recover from, and no retry followed",
                [attempt],
            )
        return
    # A failed status can be acted on from the status line (an SDK streaming a request reads no
    # further); a broken reply is known only at its end.
    known = attempt.ended_s
    if attempt.outcome == "failed" and attempt.answered_s is not None:
        known = attempt.answered_s
    gap = following.started_s - known
    if not _retryable(attempt):
        yield _finding(
            "retried_non_retryable",
            f"attempt {attempt.index} was refused with {attempt.status} "
            f"({attempt.fault or 'not a fault'}), and attempt {following.index} sent it again",
            [attempt, following],
        )
    elif attempt.retry_after_s is not None:
        if gap + CLOCK_SLACK_S < attempt.retry_after_s:
            yield _finding(
                "retry_after_ignored",
                f"attempt {attempt.index} asked for a wait of {attempt.retry_after_s:g} s "
                f"(Retry-After); attempt {following.index} came {gap:.3f} s later",
                [attempt, following],
            )
    elif gap < NO_BACKOFF_S:
        yield _finding(
            "no_backoff",
            f"attempt {following.index} came {gap:.3f} s after attempt {attempt.index} failed "
            f"({attempt.fault or attempt.status}): no backoff",
            [attempt, following],
        )


def verdict_document(verdict: Verdict, attempts: Sequence[Attempt], dropped: int = 0) -> dict[str, Any]:
    """What `--verdict-file` and the control route write: the verdict and the journal it read."""
    return {
        "verdict": verdict.model_dump(mode="json"),
        "journal": [a.model_dump(mode="json") for a in attempts],
        "journal_dropped": dropped,
    }
