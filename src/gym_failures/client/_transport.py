"""Transport errors as Gym failures: a table from an error's type to a failure kind and delivery state.

The table is read top to bottom and the first row that matches wins (`transport_rule`): an errno that
says this host ran out of a resource (`LOCAL_RESOURCE_RULE`), then the rows of the error's own HTTP
library (`_aiohttp.TRANSPORT_ERRORS`, `_httpx_api.library_for`'s for httpx and httpx2), then the
builtin errors any library or a raw socket raises (`BUILTIN_TRANSPORT_ERRORS`).

First match is only safe when a narrower row comes before every broader one it overlaps:
`tests/client/test_transport_table.py` checks that over the rows, and over every exception class of
each supported library (each lands on the row of the nearest class in its MRO), and lists the classes
no row covers, each with the reason it stays a plain exception.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from gym_failures.calls import current_call
from gym_failures.client._calls import attempt_failed
from gym_failures.client._libraries import library_of
from gym_failures.client._library_types import HttpDelivery, TransportRule
from gym_failures.failure_kinds import (
    TRANSPORT_LOCAL_RESOURCE,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_UNREACHABLE,
    FailureStage,
)
from gym_failures.failure_records import FailureBoundary
from gym_failures.failures import HttpDetails, NgFailureEvent, exception_type_name, failure_type_for
from gym_failures.redaction import url_without_secrets

__all__ = [
    "BUILTIN_TRANSPORT_ERRORS",
    "LOCAL_RESOURCE_ERRNOS",
    "LOCAL_RESOURCE_RULE",
    "map_transport_errors",
    "transport_kind",
    "transport_rule",
    "transport_rules",
]

LOCAL_RESOURCE_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL}
)
"""Errnos that mean this host, not the peer, failed: the request was never sent."""


def _local_resource(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in LOCAL_RESOURCE_ERRNOS


LOCAL_RESOURCE_RULE = TransportRule(OSError, TRANSPORT_LOCAL_RESOURCE, "not_sent", when=_local_resource)
"""First, whichever library raised the error: its errno, not its type, says this host failed
(`ClientConnectorError.errno` is its `os_error`'s)."""

# Last, so a library's subclass of these (aiohttp's `ServerTimeoutError` is a `TimeoutError`) takes
# its library's row.
BUILTIN_TRANSPORT_ERRORS = (
    TransportRule(TimeoutError, TRANSPORT_TIMEOUT, "unknown"),
    TransportRule(ConnectionRefusedError, TRANSPORT_UNREACHABLE, "not_sent"),
    TransportRule(ConnectionError, TRANSPORT_PEER_DROP, "unknown"),
)


def transport_rules(error: BaseException) -> tuple[TransportRule, ...]:
    """The rows read for `error`, in order: the errno row, its library's, the builtin ones."""
    library = library_of(error)
    library_rules = () if library is None else library.transport_errors
    return (LOCAL_RESOURCE_RULE, *library_rules, *BUILTIN_TRANSPORT_ERRORS)


def transport_rule(error: BaseException) -> TransportRule | None:
    """The row `error` maps by: the first of `transport_rules(error)` that matches; None for no row."""
    for rule in transport_rules(error):
        if isinstance(error, rule.types) and (rule.when is None or rule.when(error)):
            return rule
    return None


def transport_kind(error: BaseException) -> tuple[str, HttpDelivery] | None:
    """(kind, delivery) for a transport error, or None for anything else."""
    rule = transport_rule(error)
    return None if rule is None else (rule.kind, rule.delivery)


@contextlib.contextmanager
def map_transport_errors(
    boundary: FailureBoundary | str,
    *,
    method: str = "",
    url: str = "",
    stage: FailureStage | None = None,
    operation: str | None = None,
    operation_id: str | None = None,
    attempt_id: str | None = None,
) -> Iterator[None]:
    """Raise a transport error inside the block as a Gym failure of `boundary`, `from` the error.

    The reason names the error's type, its errno and the URL without secrets; it never quotes the
    error's text, which can repeat the request. Inside a `logical_call()` the failure is also observed
    as the end of the call's attempt (`gym_failures.calls`).
    """
    try:
        yield
    except NgFailureEvent:
        raise
    except Exception as error:
        mapped = transport_kind(error)
        if mapped is None:
            raise
        kind, delivery = mapped
        safe_url = url_without_secrets(url)
        code = getattr(error, "errno", None)
        cause = exception_type_name(error) + (
            f" [{errno.errorcode.get(code, code)}]" if isinstance(code, int) else ""
        )
        target = f"{method} {safe_url}".strip()
        failure = failure_type_for(boundary)(
            boundary=boundary,
            failure_kind=kind,
            failure_reason=f"{target}: {cause}" if target else cause,
            stage=stage,
            operation=operation,
            operation_id=operation_id,
            attempt_id=attempt_id,
            exception_type=exception_type_name(error),
        )
        failure.http_details = HttpDetails(method=method, url=safe_url, delivery=delivery)
        if current_call() is not None:
            # An attempt of a logical call got no reply: it is the call's outcome until a later
            # attempt settles it.
            attempt_failed(failure)
        raise failure from error
