"""httpx's replies and errors, imported on the first httpx object the client helpers see."""

from __future__ import annotations

import httpx

from gym_failures.client._libraries import HttpLibrary, Reply, TransportRule
from gym_failures.failure_kinds import TRANSPORT_PEER_DROP, TRANSPORT_TIMEOUT, TRANSPORT_UNREACHABLE
from gym_failures.failures import NgFailureEvent

__all__ = ["LIBRARY", "GymHTTPStatusError"]


class GymHTTPStatusError(httpx.HTTPStatusError):
    """`httpx.HTTPStatusError` carrying the rebuilt Gym failure and the reply's content."""

    # Its public home, where `__getattr__` serves it: the type name a failure records for it
    # (`exception_type`) and a traceback shows stays what it was before the package split.
    __module__ = "gym_failures.client"

    def __init__(self, response: httpx.Response, failure: NgFailureEvent, content: bytes):
        url = failure.http_details.url if failure.http_details else ""
        super().__init__(
            f"{response.status_code} {response.reason_phrase} for url {url!r}: {failure}",
            request=response.request,
            response=response,
        )
        self.failure = failure
        self.content = content


def _reply(response: httpx.Response) -> Reply:
    request = response.request
    return Reply(response.status_code, response.headers, request.method, str(request.url))


async def _read_body(response: httpx.Response, limit: int) -> bytes:
    try:
        return bytes(response.content[:limit])
    except httpx.ResponseNotRead:
        pass  # a streamed reply: read it here, bounded
    length = response.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) <= limit:
        return bytes(await response.aread())
    chunks = bytearray()
    async for chunk in response.aiter_bytes():
        chunks += chunk
        if len(chunks) > limit:
            await response.aclose()
            return bytes(chunks[:limit])
    response._content = bytes(chunks)  # the whole body: keep it readable, as `aread()` does
    return bytes(chunks)


TRANSPORT_ERRORS = (
    TransportRule((httpx.ConnectTimeout, httpx.PoolTimeout), TRANSPORT_TIMEOUT, "not_sent"),
    TransportRule(httpx.TimeoutException, TRANSPORT_TIMEOUT, "unknown"),
    TransportRule(httpx.ConnectError, TRANSPORT_UNREACHABLE, "not_sent"),
    TransportRule(
        (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError), TRANSPORT_PEER_DROP, "unknown"
    ),
)

LIBRARY = HttpLibrary(
    response_type=httpx.Response,
    reply=_reply,
    read_body=_read_body,
    status_error=GymHTTPStatusError,
    transport_errors=TRANSPORT_ERRORS,
)
