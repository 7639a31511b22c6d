"""The collector side of the multi-hop tests: one interface over a real aiohttp and a real httpx client.

Each reply is read whole, then passed to `raise_boundary_failure` as a collector would, so a test sees
the status, the raw header lines as they came off the wire, the body and the rebuilt failure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import httpx

from gym_failures import FailureReport, NgFailureEvent
from gym_failures.client import raise_boundary_failure
from gym_failures.failure_transport import FailureHeader

Params = Mapping[str, str] | None
Headers = Mapping[str, str] | None


@dataclass(frozen=True)
class Reply:
    status: int
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes
    failure: NgFailureEvent | None
    """What `raise_boundary_failure` raised for this reply; `None` when it returned."""

    @property
    def headers(self) -> dict[str, str]:
        """The header values by lower-case name."""
        return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.raw_headers}

    @property
    def report(self) -> FailureReport | None:
        return FailureHeader.decode(self.headers)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class StreamReply:
    status: int
    raw_headers: list[tuple[bytes, bytes]]
    chunks: list[bytes]
    arrived: list[float]
    """`time.monotonic()` when each chunk arrived."""

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class Collector(Protocol):
    name: str

    async def post(
        self,
        url: str,
        payload: Any,
        *,
        params: Params = None,
        headers: Headers = None,
        boundary: str = "agent",
    ) -> Reply: ...

    async def stream(
        self, url: str, payload: Any, *, params: Params = None, headers: Headers = None
    ) -> StreamReply: ...

    async def get(self, url: str) -> bytes: ...


async def _failure_of(
    response: aiohttp.ClientResponse | httpx.Response, boundary: str
) -> NgFailureEvent | None:
    try:
        await raise_boundary_failure(response, boundary=boundary)
    except NgFailureEvent as failure:
        return failure
    return None


class AiohttpCollector:
    name = "aiohttp"

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def post(
        self,
        url: str,
        payload: Any,
        *,
        params: Params = None,
        headers: Headers = None,
        boundary: str = "agent",
    ) -> Reply:
        async with self.session.post(url, json=payload, params=params, headers=headers) as response:
            body = await response.read()
            failure = await _failure_of(response, boundary)
            return Reply(response.status, list(response.raw_headers), body, failure)

    async def stream(
        self, url: str, payload: Any, *, params: Params = None, headers: Headers = None
    ) -> StreamReply:
        chunks: list[bytes] = []
        arrived: list[float] = []
        async with self.session.post(url, json=payload, params=params, headers=headers) as response:
            async for chunk in response.content.iter_any():
                chunks.append(chunk)
                arrived.append(time.monotonic())
            return StreamReply(response.status, list(response.raw_headers), chunks, arrived)

    async def get(self, url: str) -> bytes:
        async with self.session.get(url) as response:
            response.raise_for_status()
            return await response.read()


class HttpxCollector:
    name = "httpx"

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def post(
        self,
        url: str,
        payload: Any,
        *,
        params: Params = None,
        headers: Headers = None,
        boundary: str = "agent",
    ) -> Reply:
        response = await self.client.post(url, json=payload, params=params, headers=headers)
        failure = await _failure_of(response, boundary)
        return Reply(response.status_code, list(response.headers.raw), response.content, failure)

    async def stream(
        self, url: str, payload: Any, *, params: Params = None, headers: Headers = None
    ) -> StreamReply:
        chunks: list[bytes] = []
        arrived: list[float] = []
        async with self.client.stream("POST", url, json=payload, params=params, headers=headers) as response:
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                arrived.append(time.monotonic())
            return StreamReply(response.status_code, list(response.headers.raw), chunks, arrived)

    async def get(self, url: str) -> bytes:
        response = await self.client.get(url)
        response.raise_for_status()
        return response.content
