"""httpx's API, whichever package provides it: `library_for` reads httpx's replies and errors and
httpx2's alike (`_httpx`, `_httpx2`).

It imports neither package: a caller with only httpx2 (the official OpenAI and Anthropic SDKs bring
httpx2, not httpx) never needs httpx, and one with only httpx never needs httpx2.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from gym_failures.client._library_types import HttpLibrary, Reply, TransportRule
from gym_failures.failure_kinds import TRANSPORT_PEER_DROP, TRANSPORT_TIMEOUT, TRANSPORT_UNREACHABLE
from gym_failures.failures import NgFailureEvent

__all__ = ["library_for"]


def library_for(
    module: ModuleType, status_error: Callable[[Any, NgFailureEvent, bytes], Exception]
) -> HttpLibrary:
    """The `HttpLibrary` of an httpx-shaped `module` (httpx, or httpx2, which the official OpenAI and
    Anthropic SDKs are built on: the same API under another name)."""

    def reply(response: Any) -> Reply:
        request = response.request
        return Reply(response.status_code, response.headers, request.method, str(request.url))

    async def read_body(response: Any, limit: int) -> bytes:
        try:
            return bytes(response.content[:limit])
        except module.ResponseNotRead:
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

    def status_error_reply(error: BaseException) -> tuple[Reply, bytes] | None:
        if not isinstance(error, module.HTTPStatusError):
            return None
        response = error.response
        try:
            body = bytes(response.content)
        except module.ResponseNotRead:  # a streamed reply nobody read: its headers are the evidence
            body = b""
        return reply(response), body

    # `NetworkError` after `ConnectError`, its subclass: a read, write or close that failed on a
    # connection made is a drop (`ReadError`, `WriteError`, `CloseError` and the base itself).
    transport_errors = (
        TransportRule((module.ConnectTimeout, module.PoolTimeout), TRANSPORT_TIMEOUT, "not_sent"),
        TransportRule(module.TimeoutException, TRANSPORT_TIMEOUT, "unknown"),
        TransportRule(module.ConnectError, TRANSPORT_UNREACHABLE, "not_sent"),
        TransportRule((module.RemoteProtocolError, module.NetworkError), TRANSPORT_PEER_DROP, "unknown"),
    )
    return HttpLibrary(
        response_type=module.Response,
        reply=reply,
        read_body=read_body,
        status_error=status_error,
        status_error_reply=status_error_reply,
        transport_errors=transport_errors,
    )
