"""The official OpenAI and Anthropic SDKs: observe every attempt they make; their errors as Gym failures.

One line plugs gym-failures into a client, through the `http_client` the SDKs accept::

    client = openai.OpenAI(http_client=observe_attempts(openai.DefaultHttpxClient()))
    client = openai.AsyncOpenAI(http_client=observe_attempts(openai.DefaultAsyncHttpxClient()))
    client = anthropic.Anthropic(http_client=observe_attempts(anthropic.DefaultHttpxClient()))
    client = anthropic.AsyncAnthropic(http_client=observe_attempts(anthropic.DefaultAsyncHttpxClient()))

`observe_attempts` adds a response event hook to an httpx or httpx2 client (sync or async), so every
attempt the SDK makes, its retries included, is observed into the current request's failure log: a
reply's report (success or failure), a failed reply without one as the caller's own failure, a body
that breaks off mid-way (a dropped connection), and a streamed reply's terminal report, or the
stream's cut when it ends without its terminal event. An attempt that never gets a reply (a refused
connection, a connect timeout) reaches no hook: `sdk_failure` of the SDK's final error reports it.

`sdk_failure(error)` is the one call that turns an SDK exception into the Gym failure it stands for
(raise it `from error`):

- a failed reply (`APIStatusError`): the failure its report names, rebuilt (same event id, kind,
  boundary and causes), with the HTTP exchange in `http_details`; without a report, a failure of the
  boundary called built from the status;
- an error in a stream (`APIError` from a failure event): the failure the stream's terminal report
  names;
- a connection error or timeout (`APIConnectionError`, `APITimeoutError`): the transport failure of
  the httpx error under it (`map_transport_errors`' table), or the dropped stream the hook saw;
- a reply body the SDK could not parse (`json.JSONDecodeError`, which the SDKs raise as it is): the
  `provider_protocol_error` the hook observed for the call's last attempt, under its event id;
- anything else: a failure of the boundary called, kind `model_request_error`, with the SDK's type
  and its own `message` field (redacted) as `foreign_error`.

A stream ends quietly in the SDKs when it is cut before its terminal event; `observed_failure(stream)`
(an SDK stream, or any object with the httpx `response` or `request`) is the failure the hook
observed for that attempt, the cut included, or `None`::

    stream = client.chat.completions.create(model=..., messages=..., stream=True)
    for chunk in stream:
        ...
    if (failure := observed_failure(stream)) is not None:
        raise failure

A plain JSON reply read whole (at most 1 MiB) has its token usage added to the request's sums
(`observe_usage`), which the server middleware reports with the request's model calls
(`X-Gym-Model-Calls`); a streamed reply's is not read: pass its final object to `observe_usage`.

When the hook already observed the attempt's failure, `sdk_failure` returns that same failure, so
the request's report holds it once. A failed stream (a terminal failure event, such as the Responses
API's `response.failed`, which the openai SDK yields as an event and does not raise) is that
attempt's failure too.

A reply from `gym-failures serve model` that carries an injected fault names its event in
`X-Gym-Fault-Event`; a cut or dropped body the hook observes on such a reply keeps that event id, so
the endpoint's recovery verdict finds the cut in the client's record.

Decisions:
- SDK objects are recognised by what they carry (`response`, `request`, `__cause__`), not by
  importing the SDKs: this module imports neither, and works with any Stainless-generated SDK.
- A stream the consumer closed before its end (a `break`) is not a cut: only a stream read to its
  end without a terminal event is.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from gym_failures._http_status import is_failed_reply
from gym_failures._injected import injected_name, injected_note
from gym_failures._usage import observe_usage
from gym_failures.client import _calls
from gym_failures.client._libraries import library_of
from gym_failures.client._observed_transport import ObservedTransport
from gym_failures.client._reply import DEFAULT_KIND_BY_BOUNDARY, body_excerpt, reply_failure, retry_after_s
from gym_failures.client._stream import stream_failure
from gym_failures.client._transport import transport_kind
from gym_failures.failure_kinds import PROVIDER_PROTOCOL_ERROR
from gym_failures.failure_records import FailureBoundary
from gym_failures.failure_transport import (
    FailureHeader,
    RequestFailureLog,
    StreamFailureReportReader,
    observe_failure,
    observe_report,
)
from gym_failures.failures import (
    HttpDetails,
    NgFailureEvent,
    exception_type_name,
    failure_type_for,
    sdk_error_details,
)
from gym_failures.redaction import url_without_secrets

__all__ = ["FAILURE_EXTENSION", "READER_EXTENSION", "observe_attempts", "observed_failure", "sdk_failure"]

ClientT = TypeVar("ClientT")

FAILURE_EXTENSION = _calls.FAILURE_EXTENSION
"""The request extension where the hook keeps the failure it observed for that attempt."""
READER_EXTENSION = "gym_failures.stream_reader"
"""The request extension where the hook keeps a streamed reply's `StreamFailureReportReader`."""
_EVENT_HEADER = "x-gym-fault-event"
_MAX_JSON_CHECK = 1 << 20
"""The largest plain JSON reply whose body is kept to check that it parses (1 MiB)."""


def observe_attempts(
    http_client: ClientT, *, boundary: FailureBoundary | str = FailureBoundary.MODEL
) -> ClientT:
    """`http_client` (an httpx or httpx2 `Client` or `AsyncClient`) with a response hook that observes
    every attempt into the current request's failure log; `boundary` is the boundary called."""
    called = FailureBoundary(boundary)
    is_async = any(cls.__name__ == "AsyncClient" for cls in type(http_client).__mro__)
    hooks: dict[str, list[Callable[..., Any]]] = dict(http_client.event_hooks)  # type: ignore[attr-defined]
    if is_async:

        async def on_request_async(request: Any) -> None:
            _calls.begin_attempt(request)

        async def on_response_async(response: Any) -> None:
            _on_response(response, called, is_async=True)

        before: Callable[..., Any] = on_request_async
        hook: Callable[..., Any] = on_response_async
    else:

        def on_response(response: Any) -> None:
            _on_response(response, called, is_async=False)

        before = _calls.begin_attempt
        hook = on_response
    hooks["request"] = [*hooks.get("request", []), before]
    hooks["response"] = [*hooks.get("response", []), hook]
    http_client.event_hooks = hooks  # type: ignore[attr-defined]
    _observe_transports(http_client, called)
    return http_client


def _observe_transports(http_client: Any, boundary: FailureBoundary) -> None:
    """Wrap the client's transports (its default one and its mounts) so that an attempt that gets no
    reply is recorded as its call's failure. httpx takes transports only when a client is made: the
    wrapping reaches its private attributes, and leaves a client that has none of them as it is."""
    transport = getattr(http_client, "_transport", None)
    if transport is not None and not isinstance(transport, ObservedTransport):
        http_client._transport = ObservedTransport(transport, boundary)
    mounts = getattr(http_client, "_mounts", None)
    if isinstance(mounts, dict):
        for pattern, mounted in list(mounts.items()):
            if mounted is not None and not isinstance(mounted, ObservedTransport):
                mounts[pattern] = ObservedTransport(mounted, boundary)


def _details(response: Any, status: int | None, *, body: str = "") -> HttpDetails:
    request = response.request
    return HttpDetails(
        method=request.method,
        url=url_without_secrets(str(request.url)),
        status=status,
        body_excerpt=body_excerpt(body),
        retry_after_s=retry_after_s(response.headers),
        delivery="answered",
    )


def _reply_failure(response: Any, boundary: FailureBoundary, *, body: str = "") -> NgFailureEvent:
    """The failure a failed reply names, rebuilt, or the caller's own built from its status."""
    details = _details(response, response.status_code, body=body)
    return reply_failure(FailureHeader.decode(response.headers), details, boundary=boundary)


def _on_response(response: Any, boundary: FailureBoundary, *, is_async: bool) -> None:
    report = FailureHeader.decode(response.headers)
    observe_report(report)
    extensions = response.request.extensions
    if is_failed_reply(response.status_code):
        failure = _reply_failure(response, boundary)
        extensions[FAILURE_EXTENSION] = failure
        if report is None:  # a report was observed whole above
            observe_failure(failure)
        _calls.end_attempt(response.request, failure)
        return
    # A success whose own report names a failure was built on a call that ended in it, downstream.
    _calls.end_attempt(response.request, report if report is not None and report.failure_id else None)
    # Every body is watched for a connection that breaks mid-way (the SDKs retry those); only a
    # stream is read for its terminal event.
    reader = None
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        reader = StreamFailureReportReader()
        extensions[READER_EXTENSION] = reader
    observed = _stream_type(type(response).__module__, is_async)(response, reader, boundary)
    observed.announced_id = _announced_event(response.headers)
    observed.injected = injected_note(injected_name(response.headers))
    if reader is None and response.headers.get("content-type", "").startswith("application/json"):
        observed.check_json()
    response.stream = observed


def _announced_event(headers: Any) -> str | None:
    """The event id a fault-injecting endpoint announced for this reply, when it is one and names no
    event the current request observed already (a reply must not hide another failure by reusing
    its id)."""
    value = headers.get(_EVENT_HEADER)
    if not (isinstance(value, str) and 0 < len(value) <= 64 and value.isascii() and value.isprintable()):
        return None
    log = RequestFailureLog.current()
    return None if log is not None and value in log.report.events else value


class _ObservedStream:
    """A reply's body, passed on unchanged: a stream's terminal report is read, and a body that breaks
    off is observed as the transport failure it is."""

    def __init__(
        self, response: Any, reader: StreamFailureReportReader | None, boundary: FailureBoundary
    ) -> None:
        self._stream = response.stream
        self._request = response.request
        self._reader = reader
        self._boundary = boundary
        self._ended = False
        self._done = False
        self.announced_id: str | None = None
        self.injected = ""
        """`injected_note` of the fault the reply's server announced it injected, else ""."""
        # The exception the caller was handling when the reply came: not this stream's (`close`).
        self._in_flight = sys.exc_info()[1]
        self._json: list[bytes] | None = None
        """A plain JSON body's chunks, kept (up to `_MAX_JSON_CHECK` bytes) to check it parses."""
        self._json_size = 0

    def check_json(self) -> None:
        """Keep the body to check, at its end, that it is JSON (a plain reply's, not a stream's)."""
        self._json = []

    def _chunk(self, chunk: bytes) -> bytes:
        if self._reader is not None:
            self._reader.feed(chunk)
        elif self._json is not None:
            self._json_size += len(chunk)
            if self._json_size > _MAX_JSON_CHECK:
                self._json = None  # too large to hold for a check: the SDK's parse says
            else:
                self._json.append(chunk)
        return chunk

    def _not_json(self) -> bool:
        """Whether a plain JSON body read whole is not JSON; one that is has its token usage observed
        (`gym_failures._usage`: the reply's `usage`, in any of the three APIs' shapes)."""
        if self._json is None or not self._ended:
            return False
        try:
            body = json.loads(b"".join(self._json))
        except (ValueError, RecursionError):
            return True
        observe_usage(body)
        return False

    def _raised_in_stream(self) -> bool:
        """Whether the exception in flight (the SDKs close a stream in a `finally` around their
        reading) is an event they could not read as JSON: raised while reading this stream, not one
        the caller was already handling when the reply came."""
        error = sys.exc_info()[1]
        if not isinstance(error, json.JSONDecodeError) or error is self._in_flight:
            return False
        traceback = error.__traceback__
        while traceback is not None:
            if traceback.tb_frame.f_globals.get("__name__", "").endswith("._streaming"):
                return True
            traceback = traceback.tb_next
        return False

    def _finish(self, error: BaseException | None = None, *, malformed: bool = False) -> None:
        if self._done:
            return
        self._done = True
        reader = self._reader
        if reader is not None:
            reader.finish()
            reader.observe()
        request = self._request
        failure: NgFailureEvent | None = None
        if malformed or (error is None and self._not_json()):
            failure = _malformed(request, self._boundary, self.announced_id, self.injected)
        elif error is not None:
            kind = transport_kind(error)
            if kind is not None:
                failure = failure_type_for(self._boundary)(
                    boundary=self._boundary,
                    failure_kind=kind[0],
                    failure_reason=(
                        f"{request.method} {url_without_secrets(str(request.url))}: "
                        f"{exception_type_name(error)} in the middle of the reply{self.injected}"
                    ),
                    exception_type=exception_type_name(error),
                    event_id=self.announced_id,
                )
                failure.http_details = HttpDetails(
                    method=request.method, url=url_without_secrets(str(request.url)), delivery="unknown"
                )
        elif reader is not None and self._ended and not reader.terminal_seen:
            failure = stream_failure(
                reader,
                boundary=self._boundary,
                method=request.method,
                url=str(request.url),
                event_id=self.announced_id,
                note=self.injected,
            )
        elif reader is not None and reader.report is not None:
            # A failed stream: its terminal report, observed whole above, is the attempt's failure.
            failed = stream_failure(reader, boundary=self._boundary, url=str(request.url))
            if failed is not None:
                request.extensions[FAILURE_EXTENSION] = failed
                _calls.end_attempt(request, failed)
        if failure is not None:
            request.extensions[FAILURE_EXTENSION] = failure
            observe_failure(failure)
            _calls.end_attempt(request, failure)

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._stream:
                yield self._chunk(chunk)
        except Exception as error:
            self._finish(error)
            raise
        self._ended = True
        self._finish()

    def close(self) -> None:
        malformed = self._raised_in_stream()
        try:
            self._stream.close()
        finally:
            self._finish(malformed=malformed)


class _ObservedAsyncStream(_ObservedStream):
    async def __aiter__(self) -> Any:
        try:
            async for chunk in self._stream:
                yield self._chunk(chunk)
        except Exception as error:
            self._finish(error)
            raise
        self._ended = True
        self._finish()

    async def aclose(self) -> None:
        malformed = self._raised_in_stream()
        try:
            await self._stream.aclose()
        finally:
            self._finish(malformed=malformed)


def _malformed(
    request: Any, boundary: FailureBoundary, announced_id: str | None, injected: str = ""
) -> NgFailureEvent:
    """The failure of a reply the SDK could not read as JSON, a stream's event or a plain body
    (`provider_protocol_error`), under the event id the endpoint announced for it, if it did."""
    url = url_without_secrets(str(request.url))
    failure = failure_type_for(boundary)(
        boundary=boundary,
        failure_kind=PROVIDER_PROTOCOL_ERROR,
        failure_reason=f"{request.method} {url}: a reply whose data is not JSON{injected}",
        exception_type="JSONDecodeError",
        event_id=announced_id,
    )
    failure.http_details = HttpDetails(method=request.method, url=url, delivery="answered")
    return failure


@functools.cache
def _stream_type(module_name: str, is_async: bool) -> type[_ObservedStream]:
    """The observed stream as a subclass of its library's byte stream, which httpx and httpx2 check."""
    library = importlib.import_module(module_name.partition(".")[0])
    if is_async:
        return type("ObservedAsyncStream", (_ObservedAsyncStream, library.AsyncByteStream), {})
    return type("ObservedStream", (_ObservedStream, library.SyncByteStream), {})


def sdk_failure(
    error: BaseException, *, boundary: FailureBoundary | str = FailureBoundary.MODEL
) -> NgFailureEvent:
    """The Gym failure an SDK exception stands for (see the module's docstring); raise it `from error`."""
    if isinstance(error, NgFailureEvent):
        return error
    called = FailureBoundary(boundary)
    response = getattr(error, "response", None)
    request = getattr(error, "request", None)
    if request is None and response is not None:
        request = getattr(response, "request", None)
    extensions = getattr(request, "extensions", None)
    if isinstance(extensions, dict):
        observed = extensions.get(FAILURE_EXTENSION)
        if isinstance(observed, NgFailureEvent):
            return observed
        reader = extensions.get(READER_EXTENSION)
        if isinstance(reader, StreamFailureReportReader):
            from_stream = stream_failure(reader, boundary=called, url=str(getattr(request, "url", "")))
            if from_stream is not None:
                return from_stream
    if response is not None and library_of(response) is not None and is_failed_reply(response.status_code):
        try:
            body = response.text
        except Exception:  # a streamed body that was never read
            body = ""
        return _reply_failure(response, called, body=body)
    for cause in _causes(error):
        mapped = transport_kind(cause)
        if mapped is not None:
            failure = failure_type_for(called)(
                boundary=called,
                failure_kind=mapped[0],
                failure_reason=f"{exception_type_name(error)}: {exception_type_name(cause)}",
                exception_type=exception_type_name(cause),
            )
            url = url_without_secrets(str(getattr(request, "url", "")))
            failure.http_details = HttpDetails(
                method=getattr(request, "method", ""), url=url, delivery=mapped[1]
            )
            return failure
    if isinstance(error, json.JSONDecodeError) and request is None:
        # The SDK's parse of a reply the hook saw was not JSON: that attempt's failure, its id kept.
        observed = _calls.call_failure()
        if observed is not None and observed.failure_kind == PROVIDER_PROTOCOL_ERROR:
            return observed
    message = getattr(error, "message", None)
    status = getattr(response, "status_code", None)
    return failure_type_for(called)(
        boundary=called,
        failure_kind=DEFAULT_KIND_BY_BOUNDARY[called],
        failure_reason=exception_type_name(error),
        foreign_error=sdk_error_details(
            error,
            message if isinstance(message, str) else "",
            http_status=status if type(status) is int else None,
        ),
        exception_type=exception_type_name(error),
    )


def observed_failure(obj: object) -> NgFailureEvent | None:
    """The failure `observe_attempts`' hook observed for the attempt behind `obj` (an SDK stream, an
    httpx or httpx2 response or request), or `None`."""
    request = getattr(obj, "request", None)
    if request is None:
        response = getattr(obj, "response", None)
        request = getattr(response, "request", None)
    extensions = getattr(request, "extensions", None)
    failure = extensions.get(FAILURE_EXTENSION) if isinstance(extensions, dict) else None
    return failure if isinstance(failure, NgFailureEvent) else None


def _causes(error: BaseException) -> Iterator[BaseException]:
    """`error` and its causes (explicit or implicit), at most 16, without loops."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
