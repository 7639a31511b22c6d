"""What each HTTP library's module provides, and which library an object comes from.

An object of aiohttp, httpx or httpx2 can exist only once its library is imported, so an object's own classes
tell its library without importing anything; the library's module here (`_aiohttp`, `_httpx`) is
imported on the first such object, and a caller that uses one library never pays for the other.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from gym_failures.failures import NgFailureEvent

__all__ = [
    "MODULE_BY_LIBRARY",
    "HttpDelivery",
    "HttpLibrary",
    "Reply",
    "TransportRule",
    "library_of",
    "reply_library",
]

HttpDelivery = Literal["not_sent", "unknown", "answered"]
"""Whether a request can have reached the peer, as the caller saw it (`HttpDetails.delivery`'s values):
never sent, maybe delivered (it broke after it may have been sent), or answered (a reply came, perhaps
one it could not read). Not the per-attempt record's `gym_failures.rollout_failure.Delivery`
(`not_sent`, `possibly_delivered`, `delivered`), which `rollout_failure.delivery_of` maps it to."""


class Reply(NamedTuple):
    """What a failure needs of a reply, in any library."""

    status: int
    headers: Mapping[str, str]
    method: str
    url: str


class TransportRule(NamedTuple):
    """A row of the transport-error table: an error of `types` is a failure of `kind`, `delivery`."""

    types: type[BaseException] | tuple[type[BaseException], ...]
    kind: str
    delivery: HttpDelivery
    when: Callable[[BaseException], bool] | None = None
    """A further test of the error, for a type that also means something else (aiohttp raises
    `ClientResponseError` both for an error status and for a reply it could not parse)."""


@dataclass(frozen=True, slots=True)
class HttpLibrary:
    """One HTTP library's replies and errors, as its module in this package reads them."""

    response_type: type[Any]
    reply: Callable[[Any], Reply]
    read_body: Callable[[Any, int], Awaitable[bytes]]
    """The reply's body, at most the given number of bytes; a body within the bound stays readable."""
    status_error: Callable[[Any, NgFailureEvent, bytes], Exception]
    """The library's own HTTP status error for a failed reply, carrying the failure and the content."""
    status_error_reply: Callable[[BaseException], tuple[Reply, bytes] | None]
    """What a status error the library raised (not ours) holds of its reply: the reply's facts and the
    body the error kept (empty when it kept none); `None` for any other error."""
    transport_errors: tuple[TransportRule, ...]
    """The library's transport errors, most specific first: the first row that matches wins."""


MODULE_BY_LIBRARY: Mapping[str, str] = {
    "aiohttp": "gym_failures.client._aiohttp",
    "httpx": "gym_failures.client._httpx",
    # A separate package with httpx's API, which current OpenAI and Anthropic SDKs are built on.
    "httpx2": "gym_failures.client._httpx2",
}
"""Every HTTP library the client helpers support, by its top-level package, and its module here. A
library added here is added to `_reply.Response` and to the tests' clients (`tests/client/servers.py`)."""


def library_of(obj: object) -> HttpLibrary | None:
    """The library `obj` (a reply or an error) comes from, its module imported now; None for any other.

    The whole class hierarchy is searched, so a subclass defined outside the library is still its own.
    """
    for cls in type(obj).__mro__:
        module = MODULE_BY_LIBRARY.get(cls.__module__.partition(".")[0])
        if module is not None:
            return _loaded(module)
    return None


@functools.cache
def _loaded(module: str) -> HttpLibrary:
    # Cached: every reply passes here, and `import_module` of a loaded module costs about 1 us.
    library: HttpLibrary = importlib.import_module(module).LIBRARY
    return library


def reply_library(response: object) -> HttpLibrary:
    """The library of `response`: an aiohttp `ClientResponse`, an httpx or an httpx2 `Response`."""
    library = library_of(response)
    if library is None or not isinstance(response, library.response_type):
        raise TypeError(f"not an aiohttp, httpx or httpx2 response: {type(response).__name__}")
    return library
