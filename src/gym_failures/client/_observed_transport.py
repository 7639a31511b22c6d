"""An httpx transport that records an attempt it raised for (no reply: refused, reset, timed out) as a
failure of its logical call: what `observe_attempts` wraps a client's transports in."""

from __future__ import annotations

from typing import Any

from gym_failures.client._calls import FAILURE_EXTENSION, end_attempt
from gym_failures.client._transport import transport_kind
from gym_failures.failure_records import FailureBoundary
from gym_failures.failure_transport import observe_failure
from gym_failures.failures import HttpDetails, NgFailureEvent, exception_type_name, failure_type_for
from gym_failures.redaction import url_without_secrets

__all__ = ["ObservedTransport", "transport_failure"]


def transport_failure(request: Any, error: BaseException, boundary: FailureBoundary) -> NgFailureEvent | None:
    """The failure of an attempt that got no reply (`error`: refused, reset, timed out), or `None`
    for an error that is not a transport failure."""
    mapped = transport_kind(error)
    if mapped is None:
        return None
    url = url_without_secrets(str(request.url))
    failure = failure_type_for(boundary)(
        boundary=boundary,
        failure_kind=mapped[0],
        failure_reason=f"{request.method} {url}: {exception_type_name(error)}, no reply",
        exception_type=exception_type_name(error),
    )
    failure.http_details = HttpDetails(method=request.method, url=url, delivery=mapped[1])
    return failure


class ObservedTransport:
    """An httpx (or httpx2) transport, passed through, that records an attempt the transport raised
    for (no reply: refused, reset, a timeout) as a failure of its call; the error is re-raised."""

    def __init__(self, transport: Any, boundary: FailureBoundary) -> None:
        self._transport = transport
        self._boundary = boundary

    def _failed(self, request: Any, error: BaseException) -> None:
        failure = transport_failure(request, error, self._boundary)
        if failure is None or isinstance(request.extensions.get(FAILURE_EXTENSION), NgFailureEvent):
            return
        request.extensions[FAILURE_EXTENSION] = failure
        observe_failure(failure)
        end_attempt(request, failure)

    def handle_request(self, request: Any) -> Any:
        try:
            return self._transport.handle_request(request)
        except Exception as error:
            self._failed(request, error)
            raise

    async def handle_async_request(self, request: Any) -> Any:
        try:
            return await self._transport.handle_async_request(request)
        except Exception as error:
            self._failed(request, error)
            raise

    def close(self) -> None:
        self._transport.close()

    async def aclose(self) -> None:
        await self._transport.aclose()

    def __enter__(self) -> Any:
        self._transport.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self._transport.__exit__(*args)

    async def __aenter__(self) -> Any:
        await self._transport.__aenter__()
        return self

    async def __aexit__(self, *args: Any) -> None:
        await self._transport.__aexit__(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
