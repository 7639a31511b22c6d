"""aiohttp's replies and errors, imported on the first aiohttp object the client helpers see."""

from __future__ import annotations

import aiohttp

from gym_failures.client._library_types import HttpLibrary, Reply, TransportRule
from gym_failures.failure_kinds import (
    ENVIRONMENT_PROTOCOL_VIOLATION,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_UNREACHABLE,
)
from gym_failures.failures import NgFailureEvent

__all__ = ["LIBRARY", "GymClientResponseError"]


class GymClientResponseError(aiohttp.ClientResponseError):
    """`aiohttp.ClientResponseError` carrying the rebuilt Gym failure and the reply's content."""

    # Its public home, where `__getattr__` serves it: the type name a failure records for it
    # (`exception_type`) and a traceback shows stays what it was before the package split.
    __module__ = "gym_failures.client"

    def __init__(self, response: aiohttp.ClientResponse, failure: NgFailureEvent, content: bytes):
        super().__init__(
            response.request_info,
            response.history,
            status=response.status,
            message=response.reason or "",
            headers=response.headers,
        )
        self.failure = failure
        self.content = content

    def __str__(self) -> str:
        # aiohttp's own text repeats the URL with its query string, which can carry a token.
        url = self.failure.http_details.url if self.failure.http_details else ""
        return f"{self.status}, message={self.message!r}, url={url!r}, failure={self.failure}"

    def __repr__(self) -> str:
        return f"<GymClientResponseError {self}>"


def _reply(response: aiohttp.ClientResponse) -> Reply:
    return Reply(response.status, response.headers, response.method, str(response.url))


async def _read_body(response: aiohttp.ClientResponse, limit: int) -> bytes:
    # aiohttp keeps a body read by `read()` in `_body`, and has no public way to ask for it or to hand
    # it one: the private attribute is the cache `read()` itself uses.
    body: bytes | None = getattr(response, "_body", None)
    if body is not None:
        return body[:limit]
    length = response.content_length
    if length is not None and length <= limit:
        return await response.read()
    chunks = bytearray()
    while len(chunks) <= limit:
        chunk = await response.content.read(limit + 1 - len(chunks))
        if not chunk:
            response._body = bytes(chunks)  # the whole body: keep it readable
            return bytes(chunks)
        chunks += chunk
    return bytes(chunks[:limit])


def _status_error_reply(error: BaseException) -> tuple[Reply, bytes] | None:
    """An error status's reply as `response.raise_for_status()` kept it: its headers, and the body
    NeMo Gym's own `raise_for_status` adds as `response_content` (nemo_gym/server_utils.py:667)."""
    if not isinstance(error, aiohttp.ClientResponseError) or _unreadable_reply(error):
        return None
    headers = error.headers if error.headers is not None else {}
    info = error.request_info
    # NeMo Gym swaps `request_info` for a named tuple of plain values; aiohttp's own has `real_url`.
    url = getattr(info, "real_url", None) or getattr(info, "url", "")
    content = getattr(error, "response_content", None)
    body = content if isinstance(content, bytes) else b""
    return Reply(error.status, headers, str(getattr(info, "method", "")), str(url)), body


def _unreadable_reply(error: BaseException) -> bool:
    """An error status carries no parse error; a reply aiohttp could not parse does (a header line over
    its 8190-byte limit, a malformed status line): the peer answered outside the protocol, and the same
    request would be answered the same way."""
    return isinstance(error.__cause__, aiohttp.http_exceptions.HttpProcessingError)


# A connector error whose errno says this host ran out of descriptors or ports is caught before this
# table, by errno, whichever library raised it (`ClientConnectorError.errno` is its `os_error`'s).
# A pinned certificate fingerprint that does not match is checked once connected, before the request
# is sent: refused as aiohttp's own certificate errors (`ClientConnectorCertificateError`) are.
TRANSPORT_ERRORS = (
    TransportRule(
        aiohttp.ClientResponseError, ENVIRONMENT_PROTOCOL_VIOLATION, "answered", when=_unreadable_reply
    ),
    TransportRule(
        (aiohttp.ClientConnectorError, aiohttp.ServerFingerprintMismatch), TRANSPORT_UNREACHABLE, "not_sent"
    ),
    TransportRule(aiohttp.ConnectionTimeoutError, TRANSPORT_TIMEOUT, "not_sent"),
    TransportRule(aiohttp.ServerTimeoutError, TRANSPORT_TIMEOUT, "unknown"),
    TransportRule(
        (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError),
        TRANSPORT_PEER_DROP,
        "unknown",
    ),
)

LIBRARY = HttpLibrary(
    response_type=aiohttp.ClientResponse,
    reply=_reply,
    read_body=_read_body,
    status_error=GymClientResponseError,
    status_error_reply=_status_error_reply,
    transport_errors=TRANSPORT_ERRORS,
)
