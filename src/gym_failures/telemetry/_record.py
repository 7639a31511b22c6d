"""Recording through OpenTelemetry's global providers: the two counters, the report-size histogram,
the attempts' cost (their duration and model attempts as histograms, their tokens as a counter), the
server span's failure attributes and the caller's remote-failure event; a no-op without
`opentelemetry-api`.

`opentelemetry` is imported on the first record, never before, and at most once: without it every
record returns at once. With it, the instruments come from the global meter provider, which the API
makes a proxy until an application sets one, so a provider configured later is used from then on and
a library never needs a setup call. Setting `OTEL_PYTHON_DISABLED_INSTRUMENTATIONS` to a list holding
`gym_failures` (OpenTelemetry's own switch for instrumentations) turns recording off.

Recording never raises into the caller: an error inside OpenTelemetry is logged at DEBUG (its type
only) and the record is dropped.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from gym_failures.failure_kinds import classify_failure
from gym_failures.failure_records import FailureEvent, FailureReport
from gym_failures.reply import FittedReport
from gym_failures.reporting._cost_keys import NO_COST, RowCost
from gym_failures.telemetry._labels import failure_kind_label, failure_type_label
from gym_failures.telemetry._progress import RolloutOutcome

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation
    from opentelemetry.trace import Span, Status

__all__ = [
    "ATTEMPT_DURATION",
    "ATTEMPT_MODEL_ATTEMPTS",
    "ATTEMPT_TOKENS",
    "BOUNDARY",
    "DISPATCH_NAME",
    "FAILURE_CLASS",
    "FAILURE_KIND",
    "FAILURE_TYPE",
    "HTTP_STATUS",
    "INSTRUMENTATION_NAME",
    "REPORT_SIZE",
    "ROLLOUTS_COMPLETED",
    "ROLLOUT_OUTCOME",
    "SERVER_FAILURES",
    "SPAN_EVENT",
    "SPAN_REMOTE_EVENT",
    "STAGE",
    "TOKEN_TYPE",
    "record_remote_failure",
    "record_reply",
    "record_rollout",
]

LOGGER = logging.getLogger("gym_failures.telemetry")

INSTRUMENTATION_NAME = "gym_failures"
ROLLOUTS_COMPLETED = "gym.rollout.completed_total"
SERVER_FAILURES = "gym.server.failures"
REPORT_SIZE = "gym.server.failure_report.size"
SPAN_EVENT = "gym.failure"
"""The span event failure replies added to the server's span until the reply's failure moved into
the span's attributes (`_mark_span`); kept so that imports of it keep working."""
SPAN_REMOTE_EVENT = "gym.failure.remote"
ATTEMPT_DURATION = "gym.rollout.attempt.duration"
ATTEMPT_MODEL_ATTEMPTS = "gym.rollout.attempt.model_attempts"
ATTEMPT_TOKENS = "gym.rollout.attempt.tokens"

ROLLOUT_OUTCOME = "nemo.gym.rollout.outcome"
DISPATCH_NAME = "nemo.gym.rollout.dispatch.name"
FAILURE_CLASS = "nemo.gym.failure_class"
FAILURE_KIND = "nemo.gym.failure_kind"
RERUN = "nemo.gym.rollout.rerun"
"""Whether a finished attempt is a re-run (past its rollout's first): what retrying cost, apart."""
FAILURE_TYPE = "nemo.gym.failure_type"
BOUNDARY = "nemo.gym.boundary"
STAGE = "nemo.gym.stage"
HTTP_STATUS = "http.response.status_code"
TOKEN_TYPE = "gen_ai.token.type"
"""OpenTelemetry's GenAI attribute for a token count's side: `input` or `output`."""
_EVENT_ID = "nemo.gym.failure.event_id"
_CAUSE_ID = "nemo.gym.failure.cause_id"
_EVENT_IDS = "nemo.gym.failure.event_ids"
_CHAIN = "nemo.gym.failure.chain"

# Bytes: the header's bound is 4096, so the buckets are finest just under it.
_SIZE_BUCKETS = (128.0, 256.0, 512.0, 1024.0, 2048.0, 3072.0, 3584.0, 4096.0, 8192.0, 16384.0, 65536.0)
# Seconds: an attempt takes from a fraction of a second (a refusal) to the collector's timeout.
_DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# Model attempts per rollout attempt: 3 SDK retries times 3 client retries is 9 per logical call.
_MODEL_ATTEMPT_BUCKETS = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 9.0, 12.0, 20.0, 27.0, 50.0, 100.0)


class _Counts:
    """A counter kept in process and reported through an observable counter when a reader collects.

    Measured with the SDK installed: a synchronous `Counter.add` with five attributes costs about
    5 µs, this about 0.3 µs, and a failure reply's own path about 140 µs: the difference is most of
    the 1.1x budget. Its series are the label sets, already bounded.
    """

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._counts: dict[tuple[tuple[str, str | int], ...], int] = {}
        self._lock = threading.Lock()

    def add(self, key: tuple[tuple[str, str | int], ...], amount: int = 1) -> None:
        """Count `amount` for the attributes `key` (their items, in a fixed order)."""
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + amount

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        with self._lock:
            counts = list(self._counts.items())
        return [Observation(value, dict(key)) for key, value in counts]


class _Sizes:
    """Report sizes kept in process and recorded into the SDK's histogram in batches: when a reader
    collects (the flush is a callback of the observable counters, which the SDK runs before it reads
    its synchronous instruments) and whenever `_SIZE_BATCH` are waiting.

    The histogram's `record`, one SDK call per reply, cost 45 µs in place on a failure reply's path
    (measured on a slow day: 7% of the path), against 8 µs for the same call run back to back: a cold
    walk through about forty SDK frames. In a batch they run warm. Nothing is lost (a reader always
    flushes before it reads, and a provider's shutdown collects), and nothing waits longer than a
    collection. The sizes are recorded outside any trace (`no_trace`): a batch runs in whichever
    request fills it, and an exemplar would tie a size to the wrong span.
    """

    __slots__ = ("_histogram", "_no_trace", "_pending")

    def __init__(self, histogram: Histogram, no_trace: Context) -> None:
        self._histogram = histogram
        self._no_trace = no_trace
        # A deque's `append` and `popleft` are each atomic (and thread-safe without the GIL): no lock.
        self._pending: deque[int] = deque()

    def add(self, size: int) -> None:
        """Keep one report's size; record the waiting ones when there are `_SIZE_BATCH`."""
        pending = self._pending
        pending.append(size)
        if len(pending) >= _SIZE_BATCH:
            self.flush()

    def flush(self, options: CallbackOptions | None = None) -> Iterable[Observation]:
        """Record the sizes waiting now; as an observable callback, observe nothing. A size added
        meanwhile is left for the next flush, and two flushes at once record each size once."""
        pending, record, no_trace = self._pending, self._histogram.record, self._no_trace
        for _ in range(len(pending)):
            try:
                size = pending.popleft()
            except IndexError:  # another thread's flush took the rest
                break
            record(size, context=no_trace)
        return ()


# Sizes waiting for the histogram at most: a bound on memory and on a batch's work.
_SIZE_BATCH = 128


class _AttemptCost:
    """The instruments of what the collector's attempts cost: their duration and model attempts
    (synchronous histograms: one record per attempt, whose own round trip is milliseconds at least)
    and their tokens (an observable counter, like the others)."""

    __slots__ = ("duration", "model_attempts", "tokens")

    def __init__(self, duration: Histogram, model_attempts: Histogram, tokens: _Counts) -> None:
        self.duration = duration
        self.model_attempts = model_attempts
        self.tokens = tokens


class _Instruments:
    __slots__ = ("attempt_cost", "current_span", "error_status", "report_size", "rollouts", "server_failures")

    def __init__(
        self,
        rollouts: _Counts,
        server_failures: _Counts,
        report_size: _Sizes,
        current_span: Callable[[], Span],
        error_status: Status,
        attempt_cost: _AttemptCost,
    ) -> None:
        self.rollouts = rollouts
        self.server_failures = server_failures
        self.report_size = report_size
        self.current_span = current_span
        self.error_status = error_status
        """The error `Status`, made once: an import statement and a `Status` per failure reply cost
        about two microseconds."""
        self.attempt_cost = attempt_cost


_UNSET: Any = object()
_instruments: _Instruments | None = _UNSET


def _disabled() -> bool:
    names = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    return INSTRUMENTATION_NAME in {name.strip() for name in names.split(",")}


def _no_trace() -> Context:
    """A context with no span in it: the invalid span set in an empty context. An empty `Context()`
    would not do: the SDK reads a falsy context as the current one (`context or get_current()`)."""
    from opentelemetry import trace
    from opentelemetry.context import Context

    return trace.set_span_in_context(trace.INVALID_SPAN, Context())


def _load() -> _Instruments | None:
    """The instruments, made once from the global meter provider; None without the API, when
    disabled, or when the API refuses them (an `opentelemetry-api` older than the extras ask for:
    recording is off, logged once at DEBUG, rather than raising at every reply)."""
    global _instruments
    if _instruments is not _UNSET:
        return _instruments
    _instruments = None
    if _disabled():
        return None
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    try:
        _instruments = _made(metrics.get_meter(INSTRUMENTATION_NAME))
    except Exception as error:
        LOGGER.debug("telemetry is off: OpenTelemetry refused the instruments (%s)", type(error).__name__)
    return _instruments


def _made(meter: Meter) -> _Instruments:
    """The instruments from `meter`, and what a reply's record reads of the tracing API."""
    from opentelemetry import trace

    rollouts, server_failures = _Counts(), _Counts()
    sizes = _Sizes(
        meter.create_histogram(
            REPORT_SIZE,
            unit="By",
            description="Size of the failure report a server replied with; over 4096 bytes it was cut.",
            explicit_bucket_boundaries_advisory=list(_SIZE_BUCKETS),
        ),
        _no_trace(),
    )
    meter.create_observable_counter(
        ROLLOUTS_COMPLETED,
        callbacks=[rollouts.observe],
        unit="1",
        description="Rollout attempts the collector finished, by outcome.",
    )
    meter.create_observable_counter(
        SERVER_FAILURES,
        # The sizes first: the SDK runs a collection's callbacks before it reads the histogram.
        callbacks=[sizes.flush, server_failures.observe],
        unit="{failure}",
        description="Failures the servers replied with.",
    )
    return _Instruments(
        rollouts,
        server_failures,
        sizes,
        trace.get_current_span,
        trace.Status(trace.StatusCode.ERROR),
        _attempt_cost(meter),
    )


def _attempt_cost(meter: Meter) -> _AttemptCost:
    tokens = _Counts()
    meter.create_observable_counter(
        ATTEMPT_TOKENS,
        callbacks=[tokens.observe],
        unit="{token}",
        description="Tokens the model replies of the collector's attempts reported, by side.",
    )
    return _AttemptCost(
        meter.create_histogram(
            ATTEMPT_DURATION,
            unit="s",
            description="Wall time of each rollout attempt at the collector, by outcome.",
            explicit_bucket_boundaries_advisory=list(_DURATION_BUCKETS),
        ),
        meter.create_histogram(
            ATTEMPT_MODEL_ATTEMPTS,
            unit="{attempt}",
            description="Model attempts (SDK and client retries included) of each rollout attempt.",
            explicit_bucket_boundaries_advisory=list(_MODEL_ATTEMPT_BUCKETS),
        ),
        tokens,
    )


def record_rollout(outcome: RolloutOutcome, dispatch_name: str) -> None:
    """Count one finished attempt in `gym.rollout.completed_total`, and record what its row says it
    cost: its duration and model attempts, and its tokens (each only when the row reports it), with
    the same attributes but the failure type."""
    instruments = _instruments if _instruments is not _UNSET else _load()
    if instruments is None:
        return
    try:
        attributes: dict[str, str | int | bool] = {
            ROLLOUT_OUTCOME: outcome.outcome,
            DISPATCH_NAME: dispatch_name,
            RERUN: outcome.rerun,
        }
        if outcome.failure_class is not None:
            attributes[FAILURE_CLASS] = outcome.failure_class
        if outcome.failure_kind is not None:
            attributes[FAILURE_KIND] = failure_kind_label(outcome.failure_kind)
        if outcome.failure_type is not None:
            instruments.rollouts.add(
                (*attributes.items(), (FAILURE_TYPE, failure_type_label(outcome.failure_type)))
            )
        else:
            instruments.rollouts.add(tuple(attributes.items()))
        if outcome.cost is not NO_COST:
            _record_cost(instruments.attempt_cost, outcome.cost, attributes)
    except Exception as error:
        LOGGER.debug("could not record a rollout (%s)", type(error).__name__)


def _record_cost(instruments: _AttemptCost, cost: RowCost, attributes: dict[str, str | int | bool]) -> None:
    if cost.seconds is not None:
        instruments.duration.record(cost.seconds, attributes)
    if cost.model_attempts is not None:
        instruments.model_attempts.record(cost.model_attempts, attributes)
    for side, tokens in (("input", cost.input_tokens), ("output", cost.output_tokens)):
        if tokens:
            instruments.tokens.add((*attributes.items(), (TOKEN_TYPE, side)), tokens)


def record_reply(status: int, report: FailureReport, fitted: FittedReport) -> None:
    """Record a reply the middleware sends with a failure report (`report`, scrubbed, as `fitted`
    into its header): the header's size, one count in `gym.server.failures` when the reply carries a
    failure (`report.failure_id`), and the reply's failure and chain as attributes of the active span,
    which a failure also marks as an error (`_mark_span`)."""
    instruments = _instruments if _instruments is not _UNSET else _load()
    if instruments is None:
        return
    try:
        if fitted.header_value is not None:
            instruments.report_size.add(_report_size(report, fitted))
        failure = report.events.get(report.failure_id) if report.failure_id is not None else None
        if failure is not None:
            instruments.server_failures.add(_failure_key(failure, status))
        span = instruments.current_span()
        if span.is_recording():
            _mark_span(span, report, failure, instruments.error_status)
    except Exception as error:
        LOGGER.debug("could not record a reply (%s)", type(error).__name__)


def _report_size(report: FailureReport, fitted: FittedReport) -> int:
    """The report's size in bytes: the header sent when the report fit it whole (ASCII, so its
    length), else the whole report's JSON, over the bound, so the histogram shows by how much."""
    assert fitted.header_value is not None
    if fitted.report is report:
        return len(fitted.header_value)
    # Rare (a report over 4096 bytes): encoding it again is the price of showing its real size.
    return len(report.model_dump_json().encode())


_FailureKey = tuple[tuple[str, str | int], ...]
_FAILURE_KEYS: dict[tuple[object, ...], _FailureKey] = {}
# The evidence behind a label set is a handful of combinations in a real mesh; a peer minting kinds
# can make more, so past this many the labels are computed each time instead of kept.
_MAX_FAILURE_KEYS = 1024


def _failure_key(event: FailureEvent, status: int) -> _FailureKey:
    """The attributes of one count in `gym.server.failures`, as items in a fixed order."""
    # The boundary's value, not the enum: an enum member hashes in Python, its value in C.
    evidence = (event.boundary._value_, event.failure_kind, event.stage, event.http_status, status)
    key = _FAILURE_KEYS.get(evidence)
    if key is None:
        attributes: dict[str, str | int] = {
            BOUNDARY: event.boundary.value,
            FAILURE_KIND: failure_kind_label(event.failure_kind),
            FAILURE_CLASS: classify_failure(event.failure_kind, event.stage, event.http_status).value,
            HTTP_STATUS: status,
        }
        if event.stage is not None:
            attributes[STAGE] = event.stage
        key = tuple(attributes.items())
        if len(_FAILURE_KEYS) < _MAX_FAILURE_KEYS:
            _FAILURE_KEYS[evidence] = key
    return key


def _failure_attributes(event: FailureEvent) -> dict[str, str]:
    # A span is one record, not a time series: the kind goes as sent. Reasons never do.
    attributes = {
        # OpenTelemetry's semantic conventions: `error.type` names the class of error.
        "error.type": event.failure_kind,
        _EVENT_ID: event.event_id,
        FAILURE_KIND: event.failure_kind,
        BOUNDARY: event.boundary._value_,
    }
    if event.cause_id is not None:
        attributes[_CAUSE_ID] = event.cause_id
    if event.stage is not None:
        attributes[STAGE] = event.stage
    return attributes


def _chain(report: FailureReport, failure: FailureEvent | None) -> str:
    """The report's events as a trace UI shows them, `<kind>@<boundary>` each: the reply's failure
    and its causes joined by ` <- `, then any other event (a recovered one) after `; `. Kinds and
    boundaries only: ids are in the scalar attributes, and reasons never go on a span."""
    events = report.events
    count = len(events)
    walk: list[FailureEvent] = []
    labels: list[str] = []
    event = failure
    while event is not None and len(walk) < count:  # a validated report has no cycle; bounded anyway
        walk.append(event)
        # `_value_`: the enum's value without the descriptor `value` goes through.
        labels.append(f"{event.failure_kind}@{event.boundary._value_}")
        cause_id = event.cause_id
        event = events.get(cause_id) if cause_id is not None else None
    chain = " <- ".join(labels)
    if len(walk) == count:
        return chain
    walked = {id(event) for event in walk}
    rest = [
        f"{event.failure_kind}@{event.boundary._value_}"
        for event in events.values()
        if id(event) not in walked
    ]
    return "; ".join([chain, *rest]) if chain else "; ".join(rest)


def _mark_span(span: Span, report: FailureReport, failure: FailureEvent | None, error: Status) -> None:
    """Put the reply on the active span (the server's span) as its attributes, in one call: the
    reply's failure (its id, the one a caller's `gym.failure.remote` names: the join of the hops;
    its cause's id, kind, boundary and stage; `error.type`), every event of the report in the
    `chain` string, and the error status when the reply carries a failure.

    Attributes rather than a span event: a server span answers one request, so the reply's failure
    is a fact about the span, as its status and `error.type` are, and trace UIs search span
    attributes first. It is also the cheaper record: the SDK's `add_event` builds an attribute
    mapping of its own, with a lock, for each event (a `gym.failure` event per reply made a failure
    reply in a span cost 1.12x to 1.16x; docs/benchmarks.md), and OpenTelemetry is deprecating the
    span-event API in favour of log-based events (OTEP 4430).
    """
    attributes = {} if failure is None else _failure_attributes(failure)
    attributes[_CHAIN] = _chain(report, failure)
    span.set_attributes(attributes)
    if failure is not None:
        # The span of an operation that failed has the error status (semantic conventions).
        span.set_status(error)


def record_remote_failure(report: FailureReport) -> None:
    """Record on the active span that a reply named the remote failure `report.failure_id`: one event
    `gym.failure.remote` with its id and every remote event id, so a trace joins the hops."""
    instruments = _instruments if _instruments is not _UNSET else _load()
    if instruments is None:
        return
    try:
        span = instruments.current_span()
        if not span.is_recording() or report.failure_id is None:
            return
        failure = report.events.get(report.failure_id)
        attributes: dict[str, str | tuple[str, ...]] = {
            _EVENT_ID: report.failure_id,
            _EVENT_IDS: tuple(report.events),
        }
        if failure is not None:
            attributes[FAILURE_KIND] = failure.failure_kind
            attributes[BOUNDARY] = failure.boundary.value
        span.add_event(SPAN_REMOTE_EVENT, attributes)
    except Exception as error:
        LOGGER.debug("could not record a remote failure (%s)", type(error).__name__)
