"""The per-request failure log and the model-operation observation it keeps.

Public names are re-exported by `gym_failures.failure_transport`, which documents the flow.

Decisions:
- A report with `omitted` set marks the log omitted even when its events fit: a hop below already
  lost events, and every hop above keeps that flag.
- `model_operations` is bounded like the events (`_MAX_MODEL_OPERATIONS` operations, later ones
  counted in `dropped_model_operations`), because a client can start operations without end too.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_failures.failure_records import FailureReport
from gym_failures.failures import failure_report_of

_MAX_ID = 128
_NO_EVENTS = FailureReport()
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


@dataclass
class RequestFailureLog:
    """The failures observed while one server request is served, other than the request's own failure.

    The server middleware opens one per request with `capture`; code serving the request reaches it
    through `current`, so a retry loop deep in a client can record an attempt without threading it
    through calls.

    `report` is replaced, never changed in place (a new log shares one empty report, which keeps
    opening a log per request cheap): read it, and add to it only with `add`.

    A retry loop can fail without end, so the log keeps the first `MAX_EVENTS` events and counts the
    events of every later report in `dropped_events`; the report is then marked `omitted`. A report is
    kept or dropped whole, so every kept event's causes stay in the log.
    """

    MAX_EVENTS: ClassVar[int] = 64
    _MAX_MODEL_OPERATIONS: ClassVar[int] = 1024
    _current: ClassVar[ContextVar[RequestFailureLog | None]] = ContextVar(
        "ng_request_failure_log", default=None
    )

    report: FailureReport = field(default_factory=lambda: _NO_EVENTS)
    model_operations: dict[str, ModelOperationObservation] = field(default_factory=dict)
    dropped_events: int = 0
    dropped_model_operations: int = field(default=0, init=False)

    def add(self, report: FailureReport) -> None:
        """Add `report`'s events as observations; the log never has a `failure_id` of its own."""
        # Worker threads share the log (`asyncio.to_thread` and Starlette's thread pool copy the
        # context, not the object): read, merge and replace under one lock, or an event is lost.
        with _LOCK:
            self._add(report)

    def _add(self, report: FailureReport) -> None:
        events = self.report.events
        new = [event_id for event_id in report.events if event_id not in events]
        if len(events) + len(new) > self.MAX_EVENTS:
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
        elif report.omitted:
            self._mark_omitted()

    def _mark_omitted(self) -> None:
        if not self.report.omitted:
            self.report = FailureReport.model_construct(
                events=self.report.events, failure_id=None, omitted=True
            )

    def add_model_operation(self, observation: ModelOperationObservation) -> None:
        """Keep `observation`, the latest one per operation id, within the bound."""
        with _LOCK:
            self._add_model_operation(observation)

    def _add_model_operation(self, observation: ModelOperationObservation) -> None:
        operations = self.model_operations
        if observation.operation_id in operations or len(operations) < self._MAX_MODEL_OPERATIONS:
            operations[observation.operation_id] = observation
        else:
            self.dropped_model_operations += 1

    @classmethod
    @contextlib.contextmanager
    def capture(cls) -> Iterator[RequestFailureLog]:
        """Make a new log current for the request being served."""
        log = cls()
        token = cls._current.set(log)
        try:
            yield log
        finally:
            cls._current.reset(token)

    @classmethod
    def current(cls) -> RequestFailureLog | None:
        """The log of the request being served, or `None` outside a Gym server request."""
        return cls._current.get()

    def reply_report(self, error: BaseException | None) -> FailureReport:
        """The report for this request's reply: its own failure (`error`, `None` on success) and the log."""
        own = failure_report_of(error)
        return self.report if own is None else own.merged(self.report)
