"""The types every HTTP library's module in this package fills in: its replies, its transport-error
table and the record of what it provides (`HttpLibrary`).

Apart from `_libraries`, which finds an object's library and imports its module (`_aiohttp`,
`_httpx`, `_httpx2`): those modules import these types, and `_libraries` imports them, so no import
goes both ways.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from gym_failures.failures import NgFailureEvent

__all__ = ["HttpDelivery", "HttpLibrary", "Reply", "TransportRule"]

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
