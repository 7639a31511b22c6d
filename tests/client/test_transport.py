"""Tests for mapping transport errors to Gym failures, against a real server and closed ports, and
row by row through the table."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
from collections.abc import Iterator

import aiohttp
import httpx
import httpx2
import pytest

from gym_failures.client import map_transport_errors
from gym_failures.failure_kinds import (
    ENVIRONMENT_PROTOCOL_VIOLATION,
    MODEL_SERVER_ERROR,
    TRANSPORT_LOCAL_RESOURCE,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_UNREACHABLE,
)
from gym_failures.failures import ModelFailure, NgFailureEvent
from tests.client.servers import QUERY_SECRET, ClientName, closed_port, get

URL = "http://model.test/v1/responses"


async def fetch_mapped(client: ClientName, url: str, *, read_timeout: float) -> None:
    with map_transport_errors("model", method="GET", url=url):
        async with get(client, url, read_timeout=read_timeout) as response:
            if isinstance(response, aiohttp.ClientResponse):
                await response.read()


async def transport_failure(client: ClientName, url: str, *, read_timeout: float = 10.0) -> NgFailureEvent:
    with pytest.raises(NgFailureEvent) as raised:
        await fetch_mapped(client, url, read_timeout=read_timeout)
    return raised.value


ORIGINAL_ERRORS: dict[tuple[ClientName, str], type[Exception]] = {
    ("aiohttp", "refused"): aiohttp.ClientConnectorError,
    ("httpx", "refused"): httpx.ConnectError,
    ("aiohttp", "drop"): aiohttp.ClientPayloadError,
    ("httpx", "drop"): httpx.RemoteProtocolError,
    ("aiohttp", "timeout"): aiohttp.ServerTimeoutError,
    ("httpx", "timeout"): httpx.ReadTimeout,
    ("aiohttp", "dns"): aiohttp.ClientConnectorError,
    ("httpx", "dns"): httpx.ConnectError,
    ("httpx2", "refused"): httpx2.ConnectError,
    ("httpx2", "drop"): httpx2.RemoteProtocolError,
    ("httpx2", "timeout"): httpx2.ReadTimeout,
    ("httpx2", "dns"): httpx2.ConnectError,
}


def assert_mapped(failure: NgFailureEvent, kind: str, delivery: str, original: type[Exception]) -> None:
    assert failure.failure_kind == kind
    assert type(failure) is ModelFailure
    assert failure.http_details is not None
    assert failure.http_details.delivery == delivery
    assert isinstance(failure.__cause__, original)
    assert failure.exception_type is not None
    assert QUERY_SECRET not in failure.failure_reason
    assert "?" not in failure.failure_reason


async def test_connection_refused_is_transport_unreachable_not_sent(client: ClientName) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1/responses?key={QUERY_SECRET}"
    failure = await transport_failure(client, url)

    assert_mapped(failure, TRANSPORT_UNREACHABLE, "not_sent", ORIGINAL_ERRORS[client, "refused"])


async def test_a_connection_closed_mid_reply_is_transport_peer_drop(
    client: ClientName, base_url: str
) -> None:
    failure = await transport_failure(client, f"{base_url}/drop/x?key={QUERY_SECRET}")

    assert_mapped(failure, TRANSPORT_PEER_DROP, "unknown", ORIGINAL_ERRORS[client, "drop"])


async def test_a_read_timeout_is_transport_timeout(client: ClientName, base_url: str) -> None:
    # speed-ok: fires: /hang never answers
    failure = await transport_failure(client, f"{base_url}/hang/x?key={QUERY_SECRET}", read_timeout=0.2)

    assert_mapped(failure, TRANSPORT_TIMEOUT, "unknown", ORIGINAL_ERRORS[client, "timeout"])


async def test_a_dns_failure_is_transport_unreachable(client: ClientName) -> None:
    failure = await transport_failure(client, f"http://gym-failures-test.invalid/v1?key={QUERY_SECRET}")

    assert_mapped(failure, TRANSPORT_UNREACHABLE, "not_sent", ORIGINAL_ERRORS[client, "dns"])


async def test_map_transport_errors_passes_other_exceptions_and_gym_failures_through() -> None:
    failure = ModelFailure(failure_kind=MODEL_SERVER_ERROR)
    with pytest.raises(ModelFailure) as raised, map_transport_errors("model"):
        raise failure
    assert raised.value is failure
    with pytest.raises(KeyError), map_transport_errors("model"):
        raise KeyError("not transport")


# --- The table, row by row ----------------------------------------------------------------------


class ReadTimeoutOfOurOwn(httpx.ReadTimeout):
    """A subclass defined outside httpx: still httpx's, by its class hierarchy."""


@pytest.mark.parametrize(
    ("error", "kind", "delivery"),
    [
        (OSError(errno.EMFILE, "too many open files"), TRANSPORT_LOCAL_RESOURCE, "not_sent"),
        (aiohttp.ClientOSError(errno.EADDRNOTAVAIL, "no port"), TRANSPORT_LOCAL_RESOURCE, "not_sent"),
        (httpx.ConnectTimeout("connect"), TRANSPORT_TIMEOUT, "not_sent"),
        (httpx.PoolTimeout("pool"), TRANSPORT_TIMEOUT, "not_sent"),
        (httpx.ReadTimeout("read"), TRANSPORT_TIMEOUT, "unknown"),
        (ReadTimeoutOfOurOwn("read"), TRANSPORT_TIMEOUT, "unknown"),
        (httpx.ConnectError("refused"), TRANSPORT_UNREACHABLE, "not_sent"),
        (httpx.RemoteProtocolError("closed"), TRANSPORT_PEER_DROP, "unknown"),
        (httpx.WriteError("broken"), TRANSPORT_PEER_DROP, "unknown"),
        (httpx.CloseError("close"), TRANSPORT_PEER_DROP, "unknown"),
        (httpx.NetworkError("network"), TRANSPORT_PEER_DROP, "unknown"),
        (httpx2.ConnectTimeout("connect"), TRANSPORT_TIMEOUT, "not_sent"),
        (httpx2.ReadTimeout("read"), TRANSPORT_TIMEOUT, "unknown"),
        (httpx2.ConnectError("refused"), TRANSPORT_UNREACHABLE, "not_sent"),
        (httpx2.ReadError("reset"), TRANSPORT_PEER_DROP, "unknown"),
        (aiohttp.ConnectionTimeoutError(), TRANSPORT_TIMEOUT, "not_sent"),
        (aiohttp.ServerTimeoutError(), TRANSPORT_TIMEOUT, "unknown"),
        (aiohttp.ServerDisconnectedError(), TRANSPORT_PEER_DROP, "unknown"),
        (aiohttp.ServerFingerprintMismatch(b"pin", b"got", "h", 443), TRANSPORT_UNREACHABLE, "not_sent"),
        (aiohttp.ClientOSError(), TRANSPORT_PEER_DROP, "unknown"),
        (TimeoutError(), TRANSPORT_TIMEOUT, "unknown"),
        (ConnectionRefusedError(), TRANSPORT_UNREACHABLE, "not_sent"),
        (ConnectionResetError(), TRANSPORT_PEER_DROP, "unknown"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_each_transport_error_maps_to_its_kind_and_delivery(
    error: Exception, kind: str, delivery: str
) -> None:
    with pytest.raises(ModelFailure) as raised, map_transport_errors("model", method="GET", url=URL):
        raise error

    assert raised.value.failure_kind == kind
    assert raised.value.http_details is not None
    assert raised.value.http_details.delivery == delivery
    assert raised.value.__cause__ is error


def test_the_reason_names_the_errno_not_the_error_text() -> None:
    with pytest.raises(ModelFailure) as raised, map_transport_errors("model", method="GET", url=URL):
        raise OSError(errno.EMFILE, f"too many open files for {URL}?key={QUERY_SECRET}")

    assert raised.value.failure_reason == f"GET {URL}: OSError [EMFILE]"


@pytest.mark.parametrize(
    "error",
    [
        httpx.LocalProtocolError("bad header"),
        httpx.UnsupportedProtocol("ftp"),
        httpx.ProxyError("407 from the proxy"),
        httpx2.LocalProtocolError("bad header"),
        httpx2.DecodingError("not gzip"),
        aiohttp.ClientError(),
        aiohttp.ClientConnectionError("Connector is closed."),
        OSError(),
    ],
    ids=lambda error: type(error).__name__,
)
def test_an_error_of_a_library_that_is_no_transport_error_passes_through(error: Exception) -> None:
    with pytest.raises(type(error)) as raised, map_transport_errors("model"):
        raise error
    assert raised.value is error


# --- A reply the client cannot parse -------------------------------------------------------------


@contextlib.contextmanager
def raw_reply_server(reply: bytes) -> Iterator[str]:
    """A loopback server that answers every connection with `reply`'s bytes, whatever they are."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stopping = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = listener.accept()
                with connection:
                    if stopping.is_set():
                        return
                    connection.recv(65536)
                    connection.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1/responses"
    finally:
        # Closing a socket does not wake a thread blocked in its accept(): a last connection does (the
        # server once waited out a 10 s accept timeout here, in every test that used it).
        stopping.set()
        with contextlib.suppress(OSError), socket.create_connection(listener.getsockname(), timeout=60):
            pass
        thread.join(60)
        listener.close()


OVERSIZED_HEADER = (
    b"HTTP/1.1 500 Internal Server Error\r\nX-NG-Failure-Report: "
    + b"a" * 9000
    + b"\r\nContent-Length: 2\r\n\r\nno"
)


async def test_a_reply_aiohttp_cannot_parse_is_a_protocol_violation_not_an_http_error() -> None:
    """aiohttp refuses a header line over 8190 bytes with a `ClientResponseError` of status 400 that
    no error status was ever sent for; the caller sees the peer's protocol violation, answered."""
    with raw_reply_server(OVERSIZED_HEADER) as url:
        failure = await transport_failure("aiohttp", url)

    assert_mapped(failure, ENVIRONMENT_PROTOCOL_VIOLATION, "answered", aiohttp.ClientResponseError)
    assert "aaaa" not in failure.failure_reason


async def raise_native_status(url: str) -> None:
    with map_transport_errors("model", method="GET", url=url):
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            response.raise_for_status()


async def test_an_error_status_from_aiohttps_own_raise_for_status_is_not_a_transport_failure() -> None:
    reply = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
    with raw_reply_server(reply) as url, pytest.raises(aiohttp.ClientResponseError) as raised:
        await raise_native_status(url)
    assert raised.value.status == 503
