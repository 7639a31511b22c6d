"""The exceptions Gym producers raise, with origin identity and explicit cause chains.

    Exception
     └── NgFailureEvent               a failure observed at a Gym boundary (boundary given)
          ├── AgentFailure            boundary "agent"
          ├── CollectionFailure       boundary "collection"
          ├── EnvironmentFailure      boundary "environment"
          ├── HarnessFailure          boundary "harness"
          ├── ModelFailure            boundary "model"
          ├── ResourcesServerFailure  boundary "resources_server"
          └── SandboxFailure          boundary "sandbox"

A failure's `event_id` is made once, where the failure is first observed, and kept across every hop.
Its cause is explicit: `raise B from A`, with A a Gym failure (or a foreign exception raised from
one), gives B's event `cause_id = A.event_id`. Implicit context (`__context__`) is never a cause.

A failure rebuilt from a remote report (`rebuild_failure`) keeps the remote event as it was, with the
remote report it came in; its cause is the remote event's own `cause_id`, whatever Python chain it is
raised in. The remote chain is rebuilt as real exceptions too: `__cause__` links each rebuilt failure
to its rebuilt cause (with `__suppress_context__` set, as `raise ... from` does), so tracebacks,
`raise ... from` walkers and error trackers see the whole remote chain.

A foreign exception (a third-party SDK error) never becomes an event by itself: an adapter selects
`SdkErrorDetails` with `sdk_error_details` and raises its own Gym failure `from` it. `str()` of a
foreign exception is never read, because it can carry request data and credentials.

Decisions (see also docs/decisions.md):
- A kind this version does not register is accepted with a warning (`validate_failure_kind`) and
  projected as `unregistered:<kind>`; a name that is not a name, or a gate-derived class, is a
  programming error and raises `ValueError` at the raise site.
- A reason longer than 2000 characters is cut to 2000 (ending in "…") rather than refused: the
  failure matters more than its prose.
- Every reason and selected SDK message is passed through `gym_failures.redaction.redact` first, so a
  credential or URL secret quoted by a producer never reaches a header, a row or a log.
- An `http_status` that is not an int in 100-599 is dropped as no evidence (as in
  `sdk_error_details`): a peer's odd status must not turn the failure into a validation error.
- Failures pickle with their whole explicit chain, so a process pool (or Ray) returns them intact:
  each Gym failure on the chain keeps its id, kind, HTTP details and hints; a foreign exception in
  the middle of the chain is not carried (it may not unpickle, and its text can hold credentials),
  and the Gym failures on either side of it stay linked, as `cause_id` already links them.
- `http_details` and `retry_after_s` are properties over the instance, not class defaults, so a
  wrapper that forwards a failure's attributes (Ray's `RayTaskError(ModelFailure)`) reads the
  failure's own values; `explicit_gym_cause` walks such a wrapper as the failure it wraps.
- `NgFailureEvent.http_status` is the event's own status when it has one (the evidence its producer
  recorded, the spec'd `FailureEvent.http_status`, which `to_event()` keeps unchanged), else the
  status of the failed (4xx/5xx) reply a caller rebuilt it from (`http_details.status`): a rebuilt
  failure's `http_status` is never `None` when a failed reply carried it, and a provider's 429 under a
  500 reply stays 429. A 200 whose stream broke off is not a failure's status.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from gym_failures._request_context import current_request_secrets
from gym_failures.failure_kinds import (
    GATE_DERIVED_KINDS,
    PROVIDER_QUOTA_EXHAUSTED,
    FailureStage,
    quota_reset_unix,
    validate_failure_kind,
    wire_failure_kind,
)
from gym_failures.failure_records import (
    FailureBoundary,
    FailureDetails,
    FailureEvent,
    FailureReport,
    SdkErrorDetails,
)
from gym_failures.redaction import CUT_MARK, redact

__all__ = [
    "MAX_RETRY_AFTER_S",
    "AgentFailure",
    "CollectionFailure",
    "EnvironmentFailure",
    "HarnessFailure",
    "HttpDetails",
    "ModelFailure",
    "NgFailureEvent",
    "ResourcesServerFailure",
    "SandboxFailure",
    "bounded_text",
    "exception_type_name",
    "explicit_gym_cause",
    "explicit_gym_failure",
    "failure_type_for",
    "new_event_id",
    "rebuild_failure",
    "retry_hint_s",
    "safe_text",
    "sdk_error_details",
]

_MAX_REASON = 2000
_MAX_NAME = 256
# A chain deeper than this is cut (and the cut marked omitted): no real chain is, and a loop of
# wrapper exceptions must not hang the server that projects it.
_MAX_CHAIN = 64


def new_event_id() -> str:
    """A new origin id: 96 random bits, 16 URL-safe characters."""
    return secrets.token_urlsafe(12)


def safe_text(text: str) -> str:
    """`text` with every lone surrogate escaped (`\\udcff`): text decoded with `surrogateescape`, as a
    tool's stderr often is, cannot be written as UTF-8, and a JSON reader may refuse its escape. The
    failure matters more than its bytes, so the text is kept, escaped, rather than refused."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def bounded_text(text: str, limit: int = _MAX_REASON) -> str:
    """`text` made safe (`safe_text`) and cut to at most `limit` characters, the cut marked with "…"."""
    text = safe_text(text)
    return text if len(text) <= limit else text[: limit - 1] + CUT_MARK


def _bounded_reason(text: str, limit: int = _MAX_REASON) -> str:
    # Redact before cutting, so a cut never leaves half a secret; pre-cut so redaction stays cheap.
    # Inside a request, its own credential values go too (`gym_failures._request_context`).
    return bounded_text(redact(text[: 4 * limit], current_request_secrets()), limit)


# The text fields of the details schemas and their bounds: cut (and the free-text one redacted)
# rather than refused, so a long provider message never replaces the failure with a ValidationError.
_DETAIL_TEXTS = {
    "execution_id": _MAX_NAME,
    "provider": _MAX_NAME,
    "sandbox_id": _MAX_NAME,
    "provider_request_id": _MAX_NAME,
}


def _bounded_details(details: FailureDetails | Mapping[str, Any] | None) -> Any:
    if details is None:
        return None
    if isinstance(details, Mapping):
        bounded = dict(details)
        for name, limit in _DETAIL_TEXTS.items():
            if isinstance(bounded.get(name), str):
                bounded[name] = bounded_text(bounded[name], limit)
        if isinstance(bounded.get("provider_status_reason"), str):
            bounded["provider_status_reason"] = _bounded_reason(bounded["provider_status_reason"])
        return bounded
    reason = getattr(details, "provider_status_reason", None)
    if isinstance(reason, str) and _bounded_reason(reason) != reason:
        return details.model_copy(update={"provider_status_reason": _bounded_reason(reason)})
    return details


def _bounded_foreign(error: SdkErrorDetails | None) -> SdkErrorDetails | None:
    """An adapter may build `SdkErrorDetails` itself rather than with `sdk_error_details`: its
    message is redacted and cut here too."""
    if error is None:
        return None
    message = _bounded_reason(error.message)
    return error if message == error.message else error.model_copy(update={"message": message})


def _http_status(status: object) -> int | None:
    """`status` when it is a real int in 100-599; anything else is no evidence."""
    return status if type(status) is int and 100 <= status <= 599 else None


def exception_type_name(error: BaseException | type[BaseException]) -> str:
    cls = error if isinstance(error, type) else type(error)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return bounded_text(name, _MAX_NAME)


def sdk_error_details(
    error: BaseException, message: str, *, http_status: int | None = None
) -> SdkErrorDetails:
    """The `SdkErrorDetails` an adapter selected from a foreign `error`.

    `message` is the field the adapter chose (an SDK's `message` or `code`), never `str(error)`.
    It is redacted and cut to 2000 characters; an `http_status` outside 100-599 is dropped as no evidence.
    """
    return SdkErrorDetails(
        exception_type=exception_type_name(error),
        http_status=_http_status(http_status),
        message=_bounded_reason(message),
    )


def explicit_gym_cause(error: BaseException) -> NgFailureEvent | None:
    """The nearest Gym failure on `error`'s explicit `__cause__` chain, `error` itself excluded."""
    seen = {id(error)}
    current = _forwarded(error).__cause__
    for _ in range(_MAX_CHAIN):
        if current is None or id(current) in seen:
            return None
        if isinstance(current, NgFailureEvent):
            return current
        seen.add(id(current))
        current = current.__cause__
    return None


def _forwarded(error: BaseException) -> BaseException:
    """The Gym failure a forwarding wrapper stands for, else `error` itself.

    Ray raises a failed task's failure as a `RayTaskError(ModelFailure)`: an instance of both classes
    that holds the failure as `cause` and forwards its attributes, but has no `__cause__` of its own.
    Its chain is the wrapped failure's (the same event, by identity).
    """
    if error.__cause__ is not None or not isinstance(error, NgFailureEvent):
        return error
    inner = error.__dict__.get("cause")
    if isinstance(inner, NgFailureEvent) and inner is not error and inner._event is error._event:
        return inner
    return error


@dataclass(frozen=True)
class HttpDetails:
    """What the caller saw of an HTTP exchange, kept beside a failure and never inside its event.

    `delivery` says whether the request can have reached the peer: `not_sent` (the connection was
    never made), `unknown` (it broke after the request may have been sent), `answered` (a reply came).
    """

    method: str
    url: str
    """The URL without user info, query string or fragment."""
    status: int | None = None
    body_excerpt: str = ""
    """At most 512 characters of the reply body, redacted."""
    retry_after_s: float | None = None
    delivery: Literal["not_sent", "unknown", "answered"] = "answered"


class NgFailureEvent(Exception):
    """A failure observed at a Gym boundary; `to_event()` is its validated wire projection."""

    BOUNDARY: ClassVar[FailureBoundary | None] = None
    """The boundary a subclass fixes; `None` on the base class, which takes it as an argument."""

    # `http_details` and `retry_after_s` are properties over instance attributes, never class-level
    # defaults: a wrapper that forwards a failure's instance attributes (Ray's `RayTaskError(ModelFailure)`
    # forwards what it lacks through `__getattr__`) would find a class default first and read `None`.

    @property
    def http_details(self) -> HttpDetails | None:
        """The HTTP exchange a caller observed this failure in (`gym_failures.client`), if any."""
        details: HttpDetails | None = getattr(self, "_http_details", None)
        return details

    @http_details.setter
    def http_details(self, details: HttpDetails | None) -> None:
        self._http_details = details

    @property
    def retry_after_s(self) -> float | None:
        """An explicit hint: retrying before this many seconds is pointless (a reply carrying this
        failure sends it as `Retry-After`, see `retry_hint_s`). Local to this process, never on the wire."""
        seconds: float | None = getattr(self, "_retry_after_s", None)
        return seconds

    @retry_after_s.setter
    def retry_after_s(self, seconds: float | None) -> None:
        self._retry_after_s = seconds

    _event: FailureEvent
    _failure_kind: str
    _remote: FailureReport | None

    def __init__(
        self,
        *,
        failure_kind: str,
        failure_reason: str = "",
        boundary: FailureBoundary | str | None = None,
        stage: FailureStage | None = None,
        http_status: int | None = None,
        operation: str | None = None,
        operation_id: str | None = None,
        attempt_id: str | None = None,
        details: FailureDetails | Mapping[str, Any] | None = None,
        foreign_error: SdkErrorDetails | None = None,
        exception_type: str | None = None,
        event_id: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        if failure_kind in GATE_DERIVED_KINDS:
            raise ValueError(f"{failure_kind!r} is derived by the acceptance gate; no producer raises it")
        validate_failure_kind(failure_kind)
        self._failure_kind = failure_kind
        self._remote = None
        self._event = FailureEvent(
            event_id=new_event_id() if event_id is None else event_id,
            boundary=self._boundary(boundary),
            failure_kind=wire_failure_kind(failure_kind),
            failure_reason=_bounded_reason(failure_reason),
            stage=stage,
            http_status=_http_status(http_status),
            operation=None if operation is None else _bounded_reason(operation, _MAX_NAME),
            operation_id=operation_id,
            attempt_id=attempt_id,
            details=_bounded_details(details),
            foreign_error=_bounded_foreign(foreign_error),
            exception_type=None if exception_type is None else bounded_text(exception_type, _MAX_NAME),
        )
        super().__init__(self._event.failure_reason)
        if retry_after_s is not None:
            self.retry_after_s = _bounded_wait(retry_after_s)

    @classmethod
    def _boundary(cls, boundary: FailureBoundary | str | None) -> FailureBoundary:
        if boundary is None:
            if cls.BOUNDARY is None:
                raise TypeError(f"{cls.__name__} needs a boundary")
            return cls.BOUNDARY
        resolved = FailureBoundary(boundary)
        if cls.BOUNDARY is not None and resolved is not cls.BOUNDARY:
            raise TypeError(f"{cls.__name__} is a {cls.BOUNDARY.value} failure, not {resolved.value}")
        return resolved

    # --- identity and fields -------------------------------------------------------------------

    @property
    def event_id(self) -> str:
        return self._event.event_id

    @property
    def boundary(self) -> FailureBoundary:
        return self._event.boundary

    @property
    def failure_kind(self) -> str:
        """The kind as the producer named it (the event may keep it as `unregistered:<kind>`)."""
        return self._failure_kind

    @property
    def failure_reason(self) -> str:
        return self._event.failure_reason

    @property
    def stage(self) -> FailureStage | None:
        return self._event.stage

    @property
    def http_status(self) -> int | None:
        """The event's own status, else the status of the reply it was rebuilt from (see above)."""
        own = self._event.http_status
        if own is None and self.http_details is not None:
            status = self.http_details.status
            return status if status is not None and 400 <= status <= 599 else None
        return own

    @property
    def operation(self) -> str | None:
        return self._event.operation

    @property
    def operation_id(self) -> str | None:
        return self._event.operation_id

    @property
    def attempt_id(self) -> str | None:
        return self._event.attempt_id

    @property
    def details(self) -> FailureDetails | None:
        return self._event.details

    @property
    def foreign_error(self) -> SdkErrorDetails | None:
        return self._event.foreign_error

    @property
    def exception_type(self) -> str | None:
        return self._event.exception_type

    @property
    def cause_id(self) -> str | None:
        """The event id of this failure's explicit cause, or `None`."""
        if self._remote is not None:
            return self._event.cause_id
        cause = explicit_gym_cause(self)
        return None if cause is None else cause.event_id

    @property
    def remote_report(self) -> FailureReport | None:
        """The report a rebuilt remote failure arrived with; `None` for a failure made here.

        An unpickled failure carries its chain this way too, since `__cause__` does not pickle.
        """
        return self._remote

    # --- projections ---------------------------------------------------------------------------

    def to_event(self) -> FailureEvent:
        """This failure as a validated `FailureEvent`, its `cause_id` resolved."""
        cause_id = self.cause_id
        if cause_id == self._event.cause_id:
            return self._event
        return self._event.model_copy(update={"cause_id": cause_id})

    def failure_report(self) -> FailureReport:
        """This failure (`failure_id`) and its explicit cause chain, origin ids preserved."""
        events: dict[str, FailureEvent] = {}
        omitted = False
        current: NgFailureEvent | None = self
        previous: str | None = None
        while current is not None:
            if len(events) == _MAX_CHAIN:
                omitted = True
                break
            event = current.to_event()
            if event.event_id in events:
                # The chain loops back (a failure re-raised from its own effect): drop the link
                # that closes the loop, or the report would be refused as a cycle.
                if previous is not None:
                    events[previous] = events[previous].model_copy(update={"cause_id": None})
                break
            events[event.event_id] = event
            previous = event.event_id
            if current._remote is not None:
                # A rebuilt failure's causes are in the report it arrived with, not in Python.
                for event_id, remote_event in current._remote.events.items():
                    events.setdefault(event_id, remote_event)
                omitted = omitted or current._remote.omitted
                break
            current = explicit_gym_cause(current)
        if omitted or _dangling_causes(events):
            events = _without_dangling_causes(events)
        return FailureReport.model_construct(events=events, failure_id=self.event_id, omitted=omitted)

    # --- rebuilding ----------------------------------------------------------------------------

    @classmethod
    def _from_event(cls, event: FailureEvent, remote: FailureReport) -> NgFailureEvent:
        failure = cls._bare(event, remote)
        # The remote chain as real `__cause__` links; each cause carries its own chain as its report.
        current, seen = failure, {event.event_id}
        while (cause_id := current._event.cause_id) is not None and len(seen) < _MAX_CHAIN:
            cause_event = remote.events.get(cause_id)
            if cause_event is None or cause_id in seen:
                break
            seen.add(cause_id)
            chain = _chain_from(remote, cause_id)
            cause = failure_type_for(cause_event.boundary)._bare(cause_event, chain)
            current.__cause__ = cause
            current = cause
        return failure

    @classmethod
    def _bare(cls, event: FailureEvent, remote: FailureReport) -> NgFailureEvent:
        failure = cls.__new__(cls)
        failure._event = event
        failure._failure_kind = event.failure_kind
        failure._remote = remote
        Exception.__init__(failure, event.failure_reason)
        return failure

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only __init__ defeats Exception's default pickling, and __cause__ never pickles:
        # carry the projected chain so the unpickled failure has the same ids and causes, and each
        # Gym failure's own state on the chain (its HTTP details, hints), keyed by event id.
        causes: dict[str, dict[str, Any]] = {}
        current = explicit_gym_cause(self)
        while current is not None and len(causes) < _MAX_CHAIN and current.event_id not in causes:
            causes[current.event_id] = _local_state(current)
            current = explicit_gym_cause(current)
        report = self.failure_report()
        return (_restore, (type(self), report, self._failure_kind, _local_state(self), causes))

    def __str__(self) -> str:
        reason = self.failure_reason
        return f"{self.failure_kind}: {reason}" if reason else self.failure_kind

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(boundary={self.boundary.value!r}, "
            f"failure_kind={self.failure_kind!r}, failure_reason={self.failure_reason!r}, "
            f"event_id={self.event_id!r})"
        )


_STATE_KEYS = frozenset({"_event", "_failure_kind", "_remote"})
# Pickles made before `http_details` and `retry_after_s` became properties kept them under these names.
_LEGACY_STATE = {"http_details": "_http_details", "retry_after_s": "_retry_after_s"}


def _local_state(failure: NgFailureEvent) -> dict[str, Any]:
    """What a failure holds besides its event: its HTTP details, hints, and attributes set on it."""
    return {k: v for k, v in failure.__dict__.items() if k not in _STATE_KEYS}


def _dangling_causes(events: Mapping[str, FailureEvent]) -> bool:
    return any(e.cause_id is not None and e.cause_id not in events for e in events.values())


def _without_dangling_causes(events: dict[str, FailureEvent]) -> dict[str, FailureEvent]:
    """A cut chain keeps its events; a cause that was cut off is unlinked (the report is omitted)."""
    return {
        event_id: (
            event.model_copy(update={"cause_id": None})
            if event.cause_id is not None and event.cause_id not in events
            else event
        )
        for event_id, event in events.items()
    }


def _chain_from(report: FailureReport, event_id: str) -> FailureReport:
    """The part of `report` that is `event_id` and its causes, as that event's own report."""
    events: dict[str, FailureEvent] = {}
    current: str | None = event_id
    while current is not None and current in report.events and current not in events:
        events[current] = report.events[current]
        current = report.events[current].cause_id
    return FailureReport.model_construct(events=events, failure_id=event_id, omitted=report.omitted)


def _restore(
    cls: type[NgFailureEvent],
    report: FailureReport,
    failure_kind: str,
    extra: dict[str, Any],
    causes: Mapping[str, dict[str, Any]] | None = None,
) -> NgFailureEvent:
    assert report.failure_id is not None
    failure = cls._from_event(report.events[report.failure_id], report)
    failure._failure_kind = failure_kind
    _set_state(failure, extra)
    current = failure.__cause__
    while causes and isinstance(current, NgFailureEvent):
        state = causes.get(current.event_id)
        if state is not None:
            _set_state(current, state)
        current = current.__cause__
    return failure


def _set_state(failure: NgFailureEvent, state: Mapping[str, Any]) -> None:
    failure.__dict__.update({_LEGACY_STATE.get(name, name): value for name, value in state.items()})


class AgentFailure(NgFailureEvent):
    """A failure the agent server observed."""

    BOUNDARY = FailureBoundary.AGENT


class CollectionFailure(NgFailureEvent):
    """A failure the collector observed (a lost reply, a refused resume)."""

    BOUNDARY = FailureBoundary.COLLECTION


class EnvironmentFailure(NgFailureEvent):
    """A failure an environment server observed."""

    BOUNDARY = FailureBoundary.ENVIRONMENT


class HarnessFailure(NgFailureEvent):
    """A failure the harness that runs an agent observed."""

    BOUNDARY = FailureBoundary.HARNESS


class ModelFailure(NgFailureEvent):
    """A failure a model server (or its client) observed."""

    BOUNDARY = FailureBoundary.MODEL


class ResourcesServerFailure(NgFailureEvent):
    """A failure a resources server (a verifier, a judge) observed."""

    BOUNDARY = FailureBoundary.RESOURCES_SERVER


class SandboxFailure(NgFailureEvent):
    """A failure a sandbox (or its provider client) observed."""

    BOUNDARY = FailureBoundary.SANDBOX


_BY_BOUNDARY: dict[FailureBoundary, type[NgFailureEvent]] = {
    cls.BOUNDARY: cls
    for cls in (
        AgentFailure,
        CollectionFailure,
        EnvironmentFailure,
        HarnessFailure,
        ModelFailure,
        ResourcesServerFailure,
        SandboxFailure,
    )
    if cls.BOUNDARY is not None
}


def failure_type_for(boundary: FailureBoundary | str) -> type[NgFailureEvent]:
    """The exception class of `boundary` (`ModelFailure` for "model", ...)."""
    return _BY_BOUNDARY[FailureBoundary(boundary)]


def rebuild_failure(report: FailureReport, event_id: str | None = None) -> NgFailureEvent | None:
    """The remote failure `event_id` (default: the report's `failure_id`) as the exception of its
    boundary, same event id, kind, stage and causes; `None` when the report has no such event."""
    event_id = report.failure_id if event_id is None else event_id
    event = report.events.get(event_id) if event_id is not None else None
    if event is None:
        return None
    return failure_type_for(event.boundary)._from_event(event, report)


MAX_RETRY_AFTER_S = 86400.0
"""The longest wait a retry hint may ask for (a day); a longer one, or one that is not a finite
number, is bounded here rather than trusted: a hint can come from a peer's header."""


def _bounded_wait(seconds: float) -> float | None:
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds != seconds:
        return None
    try:
        return min(max(float(seconds), 0.0), MAX_RETRY_AFTER_S)
    except OverflowError:  # an int past a float's range: a wait past any bound
        return MAX_RETRY_AFTER_S if seconds > 0 else 0.0


def retry_hint_s(failure: BaseException | None, *, now: float | None = None) -> float | None:
    """How long to wait before retrying `failure`, when it knows: the first hint met on its explicit
    chain (the failure first, then its causes), each failure's hints in this order:

    - an explicit hint (`NgFailureEvent.retry_after_s`);
    - the `Retry-After` of the reply a caller rebuilt it from (`http_details.retry_after_s`), such
      as a provider's own;
    - a quota's reset time in a `provider_quota_exhausted` reason ("resets at ... UTC").

    Bounded to 0-`MAX_RETRY_AFTER_S`; `None` when nothing on the chain knows.
    """
    current = explicit_gym_failure(failure)
    for _ in range(_MAX_CHAIN):
        if current is None:
            return None
        if current.retry_after_s is not None:
            return current.retry_after_s
        details = current.http_details
        if details is not None and details.retry_after_s is not None:
            return _bounded_wait(details.retry_after_s)
        if current.failure_kind == PROVIDER_QUOTA_EXHAUSTED:
            reset = quota_reset_unix(current.failure_reason)
            if reset is not None:
                return _bounded_wait(reset - (time.time() if now is None else now))
        current = explicit_gym_cause(current)
    return None


def explicit_gym_failure(error: BaseException | None) -> NgFailureEvent | None:
    """`error` when it is a Gym failure, else the nearest one on its explicit `__cause__` chain."""
    if error is None or isinstance(error, NgFailureEvent):
        return error
    return explicit_gym_cause(error)
