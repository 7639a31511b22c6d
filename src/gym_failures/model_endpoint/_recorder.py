"""The endpoint's bookkeeping: the outermost layer of its app (`Recorder`) journals every attempt at a
model route, and `Bookkeeper` records it: the journal's entry, the count of its injected fault, a log
line and the OpenTelemetry counter.

The attempt's note (`AttemptNote`) is made here, with the call headers the request carries, and
travels to the handler in the ASGI scope (`ATTEMPT_KEY`); the reply's headers name its injected
fault (`mark_reply_headers`).

Decisions:
- An attempt is journaled before its reply's last bytes leave: a client that has read the reply finds
  its attempt in the journal. A reply that never finished (dropped, or the client gone) is journaled
  when the app returns.
- Logging: a fault that was asked for (by header, queue or plan) is one INFO line on
  `gym_failures.model_endpoint`; the lines it would otherwise cause are dropped (`QuietInjected`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_failures._http_status import is_error
from gym_failures.model_endpoint._journal import Journal, request_key
from gym_failures.model_endpoint._serving import (
    ATTEMPT_KEY,
    AttemptNote,
    QuietInjected,
    mark_reply_headers,
    read_call_headers,
)

__all__ = ["LOGGER", "Bookkeeper", "Recorder"]

LOGGER = logging.getLogger("gym_failures.model_endpoint")

_WAITS = ("slow", "stall", "slow_first_token")


class Bookkeeper:
    """What an endpoint keeps of the attempts it serves: `journal`, `fault_counts` (how many replies
    carried each fault, by name), and the log lines `quiet` drops."""

    def __init__(self, journal: Journal, fault_counts: Counter[str], quiet: QuietInjected) -> None:
        self.journal = journal
        self.fault_counts = fault_counts
        self.quiet = quiet
        self._counter: Any = None

    def record(self, route: str, note: AttemptNote, status: int, started: float, complete: bool) -> None:
        """Journal one attempt at `route`, which began at `started` and was answered with `status`
        (`complete`: its reply ended)."""
        fault = note.fault
        outcome = note.outcome
        if outcome is None:
            outcome = "failed" if is_error(status) else "ok" if complete else "dropped"
        if fault is not None:
            self.fault_counts[fault.name] += 1
            self.count(fault.name, route)
            LOGGER.info(
                "injected fault %s on %s (event %s): %s",
                fault.name,
                route,
                note.event_id,
                _told(outcome, status),
            )
            if outcome == "dropped" and not complete:
                self.quiet.dropped()
        self.journal.add(
            request=request_key(route, note.body),
            route=route,
            model=note.model,
            stream=note.stream,
            started_s=started,
            answered_s=note.answered_s,
            ended_s=max(started, self.journal.now()),
            status=status,
            fault=None if fault is None else fault.name,
            event_id=note.event_id if fault is not None else None,
            retry_after_s=note.retry_after_s if is_error(status) else None,
            delay_s=fault.delay_s if fault is not None and fault.name in _WAITS else None,
            outcome=outcome,
            sdk_retry_count=note.sdk_retry_count,
            call_id=note.call_id,
            call_attempt=note.call_attempt,
        )

    def count(self, name: str, route: str) -> None:
        """The fault in the OpenTelemetry counter `gym_failures.model_endpoint.faults`, when
        OpenTelemetry is installed (the `otel` or `prometheus` extra)."""
        if self._counter is None:
            try:
                from opentelemetry import metrics
            except ImportError:
                self._counter = False
                return
            self._counter = metrics.get_meter("gym_failures.model_endpoint").create_counter(
                "gym_failures.model_endpoint.faults", unit="{fault}", description="faults injected, by name"
            )
        if self._counter is not False:
            self._counter.add(1, {"fault": name, "route": route})


def _told(outcome: str, status: int) -> str:
    return f"replied {status}" if outcome == "failed" else f"the reply ended: {outcome}"


class Recorder:
    """The outermost layer of the endpoint's app: journals every attempt at a model route (one of
    `routes`), and adds the injected fault's headers (and `retry-after-ms`) to its reply."""

    def __init__(self, app: ASGIApp, books: Bookkeeper, routes: Collection[str]) -> None:
        self.app = app
        self.books = books
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.routes:
            await self.app(scope, receive, send)
            return
        books = self.books
        note = AttemptNote()
        books.journal.begin()
        started = books.journal.now()
        status = 500
        complete = False
        read_call_headers(scope.get("headers") or [], note)
        scope = {**scope, ATTEMPT_KEY: note}

        async def send_marked(message: Message) -> None:
            nonlocal status, complete
            if message["type"] == "http.response.start":
                status = message["status"]
                note.answered_s = books.journal.now()
                headers = mark_reply_headers(message.get("headers") or [], note, status)
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # Journaled before the reply's last bytes leave: a client that has read the reply
                # finds its attempt in the journal.
                complete = True
                books.record(scope["path"], note, status, started, complete)
            await send(message)

        try:
            await self.app(scope, receive, send_marked)
        finally:
            if not complete:
                books.record(scope["path"], note, status, started, complete)
