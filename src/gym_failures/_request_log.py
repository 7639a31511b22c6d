"""The per-request failure log and the model-operation observation it keeps.

Public names are re-exported by `gym_failures.failure_transport`, which documents the flow; the
report a reply carries is made from the log by `gym_failures.reply`.

The log of the request being served lives in one module-level ContextVar, `CURRENT_REQUEST_LOG`
(structlog's `contextvars` module is the model): `RequestFailureLog.capture()` sets it for a block,
and the server middleware sets and resets it with a token, which is cheaper than a context manager
on every request.

Decisions:
- A report with `omitted` set marks the log omitted even when its events fit: a hop below already
  lost events, and every hop above keeps that flag.
- `model_operations` is bounded like the events (`_MAX_MODEL_OPERATIONS` operations, later ones
  counted in `dropped_model_operations`), because a client can start operations without end too.
- A new log starts with one shared empty report (`EMPTY_REPORT`) and `add` replaces `report`, never
  changes it: a `FailureReport()` per request costs about 1 µs, three times the middleware's whole
  cost over its structural floor. Whether the log holds anything is the `observed` flag `add` sets
  (`is_empty`), never an identity check against the shared report.
- The log keeps the request's ASGI scope (`request_scope`, set by the middleware) so that the
  request's own secrets are read from it only when a report is about to leave the server.
- A call that *ended* in failure (its latest `ModelOperationObservation` is `failed`) makes the
  request's reply name that failure as its own (`failure_id`) even when the handler returned: an
  answer built on a failed call is not a clean measurement (`gym_failures.calls`). The first such
  call in the order the calls began is named. The failure a call ends in is kept past `MAX_EVENTS`
  (`keep`, up to as many again), so a long episode's last cut is named however many failures came
  before it.
- The log also sums the tokens the model replies it read reported (`add_usage`, a `UsageTally` left
  unset until the first reply: the success path pays nothing for it), once per reply id, so that the
  SDK hook and an agent that reports the same reply itself count it once. The middleware sends the
  sums with the calls' counts (`gym_failures._attempt_cost`), never in the failure report.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Self, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_failures._request_context import CURRENT_REQUEST_LOG as REQUEST_CONTEXT_LOG
from gym_failures._scrub import scrub
from gym_failures.failure_records import FailureReport
from gym_failures.failures import explicit_gym_failure
from gym_failures.redaction import MIN_KNOWN_SECRET, request_secrets

_MAX_ID = 128
EMPTY_REPORT = FailureReport()
"""The report every new log starts with; never changed (a log replaces its report to add to it)."""

CURRENT_REQUEST_LOG = cast("ContextVar[RequestFailureLog | None]", REQUEST_CONTEXT_LOG)
"""The log of the request being served; `None` outside a Gym server request. One ContextVar with
`gym_failures._request_context.CURRENT_REQUEST_LOG`, where the records read the request's
credentials (that module's docstring), typed here as the log it holds."""

# One lock for every log: adding is rare and short, and a lock per log would cost every request.
_LOCK = threading.Lock()
_NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class ModelOperationObservation(BaseModel):
    """A terminal HTTP retry-loop observation, not proof that every operation or response body was
    observed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operation_id: str = Field(min_length=1, max_length=_MAX_ID)
    outcome: Literal["completed", "failed"]
    final_attempt_id: str | None = Field(default=None, max_length=_MAX_ID)
    failure_id: str | None = Field(default=None, max_length=_MAX_ID)
    http_attempts: int | None = Field(default=None, ge=0, strict=True)
    transport_failures: int | None = Field(default=None, ge=0, strict=True)
    retry_wait_s: _NonNegativeFloat | None = None
    request_elapsed_ms: _NonNegativeFloat | None = None

    @model_validator(mode="after")
    def _failed_names_its_failure(self) -> Self:
        if self.outcome == "completed" and self.failure_id is not None:
            raise ValueError("a completed operation has no failure_id")
        return self


def _empty_report() -> FailureReport:
    return EMPTY_REPORT


@dataclass(slots=True)
class UsageTally:
    """The tokens the model replies a request read reported, summed: `None` where no reply reported
    that figure."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    replies: set[str] = field(default_factory=set)
    """The ids of the replies added, so that a reply reported twice counts once."""


@dataclass(slots=True, init=False)
class RequestFailureLog:
    """The failures observed while one server request is served, other than the request's own failure.

    The server middleware opens one per request; code serving the request reaches it through
    `current`, so a retry loop deep in a client can record an attempt without threading it through
    calls. `capture` opens one for a block of code (a collector's attempt, a test).

    `report` is replaced, never changed in place (a new log shares one empty report): read it, and add
    to it only with `add`.

    A retry loop can fail without end, so the log keeps the first `MAX_EVENTS` events and counts the
    events of every later report in `dropped_events`; the report is then marked `omitted`. A report is
    kept or dropped whole, so every kept event's causes stay in the log.
    """

    MAX_EVENTS: ClassVar[int] = 64
    _MAX_MODEL_OPERATIONS: ClassVar[int] = 1024
    _current: ClassVar[ContextVar[RequestFailureLog | None]] = CURRENT_REQUEST_LOG

    report: FailureReport = field(default_factory=_empty_report)
    model_operations: dict[str, ModelOperationObservation] = field(default_factory=dict)
    dropped_events: int = 0
    dropped_model_operations: int = field(default=0, init=False)
    request_scope: Mapping[str, Any] | None = field(default=None, init=False, repr=False, compare=False)
    """The ASGI scope of the request this log belongs to, when a server middleware opened it."""
    known_secrets: tuple[Mapping[str, Any], list[str]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """The scope `request_secrets` last read and the credential values it found there: every record
    made in the request asks (`gym_failures._request_context`)."""
    model_usage: UsageTally | None = field(default=None, init=False, repr=False, compare=False)
    """The tokens the request's model replies reported (`add_usage`); unset until the first."""
    observed: bool = field(default=False, init=False, repr=False, compare=False)
    """Whether `add` kept anything (an event, or the omitted flag): the middleware asks on every reply,
    and a flag costs a tenth of reading the report's fields (measured: 0.08 us a request)."""

    def __init__(
        self,
        report: FailureReport = EMPTY_REPORT,
        model_operations: dict[str, ModelOperationObservation] | None = None,
        dropped_events: int = 0,
    ) -> None:
        # Written out rather than generated: the generated one calls a factory per field, and the
        # middleware makes a log per request (0.15 -> 0.08 us).
        self.report = report
        self.observed = report is not EMPTY_REPORT and bool(report.events or report.omitted)
        self.model_operations = {} if model_operations is None else model_operations
        self.dropped_events = dropped_events
        self.dropped_model_operations = 0
        self.request_scope = None

    def is_empty(self) -> bool:
        """Whether nothing was observed: no event, and nothing omitted."""
        return not self.observed

    def add(self, report: FailureReport) -> None:
        """Add `report`'s events as observations; the log never has a `failure_id` of its own."""
        # Worker threads share the log (`asyncio.to_thread` and Starlette's thread pool copy the
        # context, not the object): read, merge and replace under one lock, or an event is lost.
        with _LOCK:
            self._add(report)

    def _add(self, report: FailureReport, bound: int | None = None) -> None:
        """Merge `report`'s events, within `bound` events in all (`MAX_EVENTS` unless given)."""
        events = self.report.events
        new = [event_id for event_id in report.events if event_id not in events]
        if len(events) + len(new) > (self.MAX_EVENTS if bound is None else bound):
            self.dropped_events += len(new)
            self._mark_omitted()
            return
        if new:
            merged = dict(events)
            for event_id in new:
                merged[event_id] = report.events[event_id]
            # Both maps are valid and every new event's causes come with it: no revalidation.
            self.report = FailureReport.model_construct(
                events=merged, failure_id=None, omitted=self.report.omitted or report.omitted
            )
            self.observed = True
        elif report.omitted:
            self._mark_omitted()

    def _mark_omitted(self) -> None:
        if not self.report.omitted:
            self.report = FailureReport.model_construct(
                events=self.report.events, failure_id=None, omitted=True
            )
        self.observed = True

    def keep(self, report: FailureReport) -> None:
        """Add `report`'s events even past `MAX_EVENTS`: the failure a call ended in, which the reply
        names as its own (`own_report`). At most `MAX_EVENTS` more events are kept so; past them the
        log is marked omitted, as any report it drops."""
        with _LOCK:
            self._add(report, 2 * self.MAX_EVENTS)

    def add_model_operation(self, observation: ModelOperationObservation) -> None:
        """Keep `observation`, the latest one per operation id, within the bound."""
        with _LOCK:
            operations = self.model_operations
            if observation.operation_id in operations or len(operations) < self._MAX_MODEL_OPERATIONS:
                operations[observation.operation_id] = observation
            else:
                self.dropped_model_operations += 1

    def operations(self) -> tuple[ModelOperationObservation, ...]:
        """The calls observed so far (their latest observations), read under the lock: worker threads
        may add one while the reply is being made."""
        with _LOCK:
            return tuple(self.model_operations.values())

    def usage(self) -> UsageTally | None:
        """The tokens the request's model replies reported, or `None` when none did."""
        try:
            # Left unset by `__init__`, so the success path pays nothing for it.
            return self.model_usage
        except AttributeError:
            return None

    def add_usage(self, usage: Mapping[str, int], reply_id: str | None = None) -> None:
        """Add one reply's figures (`input_tokens`, `output_tokens`, read and bounded by
        `gym_failures._usage.usage_of`) to the request's sums, unless a reply of the same id was added
        already. At most `_MAX_MODEL_OPERATIONS` ids are kept; a later reply is added without one."""
        with _LOCK:
            tally = self.usage()
            if tally is None:
                tally = self.model_usage = UsageTally()
            if reply_id is not None:
                if reply_id in tally.replies:
                    return
                if len(tally.replies) < self._MAX_MODEL_OPERATIONS:
                    tally.replies.add(reply_id)
            if "input_tokens" in usage:
                tally.input_tokens = (tally.input_tokens or 0) + usage["input_tokens"]
            if "output_tokens" in usage:
                tally.output_tokens = (tally.output_tokens or 0) + usage["output_tokens"]

    def request_secrets(self) -> list[str]:
        """The request's own credential values (credential headers, cookies, query values) that a
        report leaving this server must not quote; none when no middleware opened the log."""
        scope = self.request_scope
        if scope is None:
            return []
        try:
            # Left unset by `__init__`, so the success path pays nothing for it.
            known = self.known_secrets
        except AttributeError:
            known = None
        if known is not None and known[0] is scope:
            return known[1]
        found = request_secrets(scope.get("headers") or (), scope.get("query_string") or b"")
        # A shorter value would match ordinary words in a reason; `redact` ignores it too.
        secrets = [secret for secret in found if len(secret) >= MIN_KNOWN_SECRET]
        self.known_secrets = (scope, secrets)
        return secrets

    @classmethod
    @contextlib.contextmanager
    def capture(cls) -> Iterator[RequestFailureLog]:
        """Make a new log current for the request being served."""
        log = cls()
        token = CURRENT_REQUEST_LOG.set(log)
        try:
            yield log
        finally:
            CURRENT_REQUEST_LOG.reset(token)

    @classmethod
    def current(cls) -> RequestFailureLog | None:
        """The log of the request being served, or `None` outside a Gym server request."""
        return CURRENT_REQUEST_LOG.get()

    def failed_call(self) -> ModelOperationObservation | None:
        """The first call (in the order the calls began) whose last attempt failed, with its failure
        among the log's events; `None` when every call observed ended well."""
        events = self.report.events
        for operation in self.model_operations.values():
            if operation.outcome == "failed" and operation.failure_id in events:
                return operation
        return None

    def own_report(self) -> FailureReport:
        """The log's report as a reply that raised nothing carries it: its observations, and as its
        own failure (`failure_id`) the failure a call ended in, if one did (`failed_call`)."""
        if not self.model_operations:
            return self.report
        failed = self.failed_call()
        if failed is None:
            return self.report
        report = self.report
        return FailureReport.model_construct(
            events=report.events, failure_id=failed.failure_id, omitted=report.omitted
        )

    def reply_report(self, error: BaseException | None) -> FailureReport:
        """The report for this request's reply: its own failure (`error`; on a reply without one, the
        failure a call ended in, `own_report`) and the log, scrubbed of the request's own secrets and
        the registered ones (not yet fitted to the header's bound: `gym_failures.reply.fit`)."""
        failure = explicit_gym_failure(error)
        report = self.own_report() if failure is None else failure.failure_report().merged(self.report)
        return scrub(report, self.request_secrets())
