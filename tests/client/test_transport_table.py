"""The transport-error table, class by class: every exception class of every supported library lands on
the row of the nearest class in its MRO, never on an earlier, broader row; the classes no row covers
are listed below, each with the reason it stays a plain exception.

The table is first-match-wins (`_transport.transport_rule`), so one misplaced row silently takes the
errors of a narrower one. As httpx keeps a test that every httpcore exception is mapped
(`tests/test_exceptions.py` there), this one walks the real installed modules:

- aiohttp, httpx and httpx2 (`MODULE_BY_LIBRARY`, the libraries the table has rows for): every
  module of the package is imported and every exception class defined in it is checked; a library
  that is not installed is skipped, saying so. A class a new release adds and no row covers fails
  the test until it is mapped or listed here with its reason.
- the builtins, which `BUILTIN_TRANSPORT_ERRORS` covers for any library and for a raw socket.
- the official SDKs (openai, anthropic): no row is theirs. Their connection errors are read by the
  transport error under them (`sdk_failure` walks the cause), checked here for every mapped httpx2
  class; every other SDK error is a reply or the caller's own error. Their exported classes and their
  `_exceptions` module are walked, not every module: the SDKs have 2,000 to 3,200 modules (seconds to
  import each), whose other errors are the helpers' (tools, agents, credentials) and API errors
  subclassing `APIStatusError`, a reply, as `test_no_sdk_error_is_a_transport_row_of_its_own` checks
  for those walked.
- not walked: requests, which the client helpers do not support (`library_of` does not know it; its
  errors are plain OSErrors, no builtin `ConnectionError` or `TimeoutError`, so only the errno row can
  take one); httpcore and
  httpcore2, whose errors httpx and httpx2 translate into their own (`map_httpcore_exceptions`)
  before a caller sees them. One that slips through untranslated is unmapped by
  `map_transport_errors`; `sdk_failure` reads the socket error it was raised `from`, when there is one
  (httpcore's timeouts and read and write errors are).

A class is checked on a bare instance (`cls.__new__(cls)`: no errno, no cause), so only its class
speaks; the two rows that read an instance further (`LOCAL_RESOURCE_RULE` by errno, aiohttp's
unreadable reply by its cause) come first by design, which `test_no_row_is_shadowed_by_an_earlier_one`
checks, and each has its own tests (`test_transport.py`).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from types import ModuleType

import pytest

from gym_failures.client import sdk_failure
from gym_failures.client._libraries import MODULE_BY_LIBRARY
from gym_failures.client._library_types import HttpLibrary, TransportRule
from gym_failures.client._transport import (
    BUILTIN_TRANSPORT_ERRORS,
    LOCAL_RESOURCE_RULE,
    transport_rule,
    transport_rules,
)

# --- Why a class no row covers stays a plain exception --------------------------------------------

_HTTPX_UNMAPPED = {
    "HTTPError": "the base of every httpx error, replies and misuse included",
    "RequestError": "the base of the errors of sending a request, the caller's misuse included",
    "TransportError": "the base of the transport's errors, the caller's misuse included "
    "(`UnsupportedProtocol`, `LocalProtocolError`, `ProxyError`)",
    "ProtocolError": "the base of both sides' protocol errors: only the peer's (`RemoteProtocolError`) "
    "is a drop",
    "LocalProtocolError": "the caller's request breaks HTTP (a bad header): sending it again fails again",
    "UnsupportedProtocol": "the URL's scheme is not HTTP: the caller's request, refused before any "
    "connection",
    "ProxyError": "the proxy answered the tunnel with an error status: the proxy's answer to the caller's "
    "configuration, not the peer's, as aiohttp's `ClientHttpProxyError`",
    "DecodingError": "a reply came; its body does not decode as its Content-Encoding says: a reply, "
    "read as one",
    "TooManyRedirects": "replies came, each a redirect: the caller's redirect limit, not a transport failure",
    "HTTPStatusError": "a reply with an error status: `status_error_failure` reads it",
    "InvalidURL": "the caller's URL",
    "CookieConflict": "the caller's lookup of a cookie set twice",
    "StreamError": "the base of the caller's misuse of a body stream",
    "StreamConsumed": "the caller read a body stream twice",
    "StreamClosed": "the caller read a body stream after closing it",
    "ResponseNotRead": "the caller read `.content` of a streamed reply before reading it",
    "RequestNotRead": "the caller read `.content` of a streamed request before reading it",
}

UNMAPPED: dict[str, dict[str, str]] = {
    "aiohttp": {
        "ClientError": "the base of every aiohttp client error; raised bare by its digest-auth middleware "
        "for a challenge it cannot answer (a reply)",
        "ClientConnectionError": "raised bare both for a lost connection and for the caller's own misuse "
        "(a closed connector, a released reply read again): a transport kind would blame the peer for "
        "the caller's bug; its subclasses say which",
        "ServerConnectionError": "the base of the server-side drops; aiohttp raises only its subclasses, "
        "each a row of its own",
        "ClientResponseError": "a reply with an error status (`status_error_failure` reads it); only a "
        "reply aiohttp could not parse is a transport row, conditional on its cause",
        "ContentTypeError": "a reply whose body is not the JSON the caller asked `json()` for",
        "TooManyRedirects": "replies came, each a redirect: the caller's redirect limit",
        "ClientHttpProxyError": "the proxy answered the tunnel with an error status (a reply)",
        "WSServerHandshakeError": "a websocket handshake answered with an error status (a reply)",
        "UploadAbortedError": "settles the request's `upload_complete` future only; the request's own "
        "outcome is its reply or that reply's error",
        "InvalidURL": "the caller's URL, refused before any connection",
        "InvalidUrlClientError": "the caller's URL, refused before any connection",
        "NonHttpUrlClientError": "the caller's URL is not HTTP, refused before any connection",
        "RedirectClientError": "the base of a redirect's refused target (a reply)",
        "InvalidUrlRedirectClientError": "a redirect to an invalid URL (a reply)",
        "NonHttpUrlRedirectClientError": "a redirect to a URL that is not HTTP (a reply)",
        "WSMessageTypeError": "a websocket message of the wrong type: websockets are not read here",
        "WSHandshakeError": "websockets are not read here",
        "WebSocketError": "websockets are not read here",
        "TooManyMembersError": "the decompressor's own signal; a body that does not decompress reaches "
        "the caller as `ClientPayloadError`, a drop",
        "EofStream": "the body reader's internal end-of-stream signal, never raised to the caller",
        "BadContentDispositionHeader": "a warning about a multipart body the caller parses",
        "BadContentDispositionParam": "a warning about a multipart body the caller parses",
        "LookupError": "no payload type for the caller's request body",
        "NotAppKeyWarning": "a warning of aiohttp's web server",
    },
    "httpx": _HTTPX_UNMAPPED,
    "httpx2": {
        **_HTTPX_UNMAPPED,
        "SSEError": "a streamed reply that is no server-sent event stream, or an event over the size "
        "limit: a reply, read as one",
        "HTTPXDeprecationWarning": "a warning",
    },
    "builtins": {
        "OSError": "without an errno it names no failure (`LOCAL_RESOURCE_RULE` reads the errno); "
        "its subclasses say which",
        "BlockingIOError": "a non-blocking call that would block: the caller's I/O loop, not the peer",
        "ChildProcessError": "a process error of this host, not an exchange with a peer",
        "ProcessLookupError": "a process error of this host, not an exchange with a peer",
        "InterruptedError": "a system call interrupted by a signal: this host's, retried by Python itself",
        "FileExistsError": "a file error of this host, not an exchange with a peer",
        "FileNotFoundError": "a file error of this host, not an exchange with a peer",
        "IsADirectoryError": "a file error of this host, not an exchange with a peer",
        "NotADirectoryError": "a file error of this host, not an exchange with a peer",
        "PermissionError": "a file error of this host, not an exchange with a peer",
    },
}
"""By library, the classes no row covers, by name, and why."""

UNMAPPED_MODULES = {
    "aiohttp.web": "aiohttp's web server, not its client",
    "aiohttp.http_exceptions": "the HTTP parser's errors: on the client they arrive as the cause of a "
    "`ClientResponseError` (the unreadable-reply row) or of a `ClientPayloadError` (a drop)",
}
"""Whole modules no row covers, by module prefix, and why."""

NOT_AN_OS_ERROR = (
    "a builtin error outside OSError: a failed exchange raises an OSError (a socket's errors all are), "
    "so no other builtin is a transport error"
)


def unmapped_reason(cls: type[BaseException], library: str) -> str | None:
    """Why no row covers `cls`, or None when this file does not say."""
    if library == "builtins" and not issubclass(cls, OSError):
        return NOT_AN_OS_ERROR
    for prefix, reason in UNMAPPED_MODULES.items():
        if cls.__module__ == prefix or cls.__module__.startswith(prefix):
            return reason
    return UNMAPPED[library].get(cls.__name__)


# --- The classes, walked from the installed modules ----------------------------------------------


def _modules(package: ModuleType) -> Iterator[ModuleType]:
    """`package` and every module under it that imports (an optional dependency missing skips one)."""
    yield package
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".", onerror=lambda _: None):
        try:
            yield importlib.import_module(info.name)
        except ImportError:  # aiohttp.worker without gunicorn, httpx2.websockets without websockets
            continue


def exception_classes(package: ModuleType, *, deep: bool = True) -> list[type[BaseException]]:
    """Every exception class defined in `package` (in any of its modules with `deep`), once each."""
    modules = _modules(package) if deep else iter([package])
    found = {
        value
        for module in modules
        for value in list(vars(module).values())
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__.partition(".")[0] == package.__name__
    }
    return sorted(found, key=lambda cls: (cls.__module__, cls.__qualname__))


def bare(cls: type[BaseException]) -> BaseException:
    """An instance of `cls` without its `__init__`: no errno, no cause, no message."""
    if issubclass(cls, BaseExceptionGroup):  # a group cannot be made empty
        members = [Exception()] if issubclass(cls, Exception) else [BaseException()]
        return cls("", members)
    instance = cls.__new__(cls)
    assert type(instance) is cls
    return instance


def library_rows(name: str) -> tuple[TransportRule, ...]:
    library: HttpLibrary = importlib.import_module(MODULE_BY_LIBRARY[name]).LIBRARY
    return library.transport_errors


def types_of(rule: TransportRule) -> tuple[type[BaseException], ...]:
    return rule.types if isinstance(rule.types, tuple) else (rule.types,)


def nearest_row(cls: type[BaseException], rows: tuple[TransportRule, ...]) -> TransportRule | None:
    """The unconditional row of the class nearest `cls` in its MRO: the row that should take it."""
    for base in cls.__mro__:
        holding = [rule for rule in rows if rule.when is None and base in types_of(rule)]
        assert len(holding) <= 1, f"{base.__name__} is in {len(holding)} rows: which one wins is luck"
        if holding:
            return holding[0]
    return None


def _library_classes() -> Iterator[tuple[str, type[BaseException]]]:
    for name in sorted(MODULE_BY_LIBRARY):
        try:
            package = importlib.import_module(name)
        except ImportError:  # an extra that is not installed: nothing of it can be raised here
            continue
        for cls in exception_classes(package):
            yield name, cls
    import builtins

    for cls in exception_classes(builtins, deep=False):
        yield "builtins", cls


CLASSES = list(_library_classes())


def test_every_supported_library_is_walked() -> None:
    """An extra that is not installed is skipped above: say which, so a skip is never silent."""
    walked = {library for library, _ in CLASSES}
    missing = sorted(set(MODULE_BY_LIBRARY) - walked)
    if missing:
        pytest.skip(f"not installed, so not walked: {', '.join(missing)}")
    assert walked == {*MODULE_BY_LIBRARY, "builtins"}


@pytest.mark.parametrize(
    ("library", "cls"), CLASSES, ids=[f"{cls.__module__}.{cls.__qualname__}" for _, cls in CLASSES]
)
def test_each_error_class_lands_on_its_most_specific_row(library: str, cls: type[BaseException]) -> None:
    rows = (*(() if library == "builtins" else library_rows(library)), *BUILTIN_TRANSPORT_ERRORS)
    expected = nearest_row(cls, rows)
    error = bare(cls)

    assert transport_rules(error)[1:] == rows  # the rows the table reads for it, after the errno row
    assert transport_rule(error) is expected
    reason = unmapped_reason(cls, library)
    if expected is None:
        assert reason, f"no row covers {cls.__module__}.{cls.__qualname__}: map it or say why not"
    else:
        assert reason is None, f"listed as unmapped, yet {expected} covers it"


@pytest.mark.parametrize("library", [*sorted(MODULE_BY_LIBRARY), "builtins"])
def test_no_row_is_shadowed_by_an_earlier_one(library: str) -> None:
    """First match is safe when no row comes after one that already takes its types: a later row's
    type is never a subclass of an earlier unconditional row's, and a conditional row (it reads the
    error further) comes before every row of its types' subclasses, which it overrides."""
    if library != "builtins":
        pytest.importorskip(library)
    own = () if library == "builtins" else library_rows(library)
    rows = (LOCAL_RESOURCE_RULE, *own, *BUILTIN_TRANSPORT_ERRORS)
    shadowed = []
    for i, first in enumerate(rows):
        for second in rows[i + 1 :]:
            for first_type in types_of(first):
                for second_type in types_of(second):
                    if first.when is None and issubclass(second_type, first_type):
                        shadowed.append(f"{second_type.__name__} never reaches its row: {first} takes it")
                    if second.when is not None and issubclass(first_type, second_type):
                        shadowed.append(f"{first_type.__name__} is taken before {second} reads it")
    assert shadowed == []


# --- The SDKs: read through the transport error under them ----------------------------------------

SDKS = ("openai", "anthropic")


def sdk_classes(name: str) -> list[type[BaseException]]:
    """The classes `name` exports and those of its `_exceptions` module (imported here, not at
    collection: the two SDKs take seconds to import)."""
    package = pytest.importorskip(name)
    found = {*exception_classes(package, deep=False)}
    found |= set(exception_classes(importlib.import_module(f"{name}._exceptions"), deep=False))
    return sorted(found, key=lambda cls: (cls.__module__, cls.__qualname__))


@pytest.mark.parametrize("sdk", SDKS)
def test_no_sdk_error_is_a_transport_row_of_its_own(sdk: str) -> None:
    """No SDK class is a library's or a builtin's: no row takes one by its class, so a connection error
    is read by its cause (below) and every other error is a reply or the caller's own."""
    classes = sdk_classes(sdk)
    assert {"APIConnectionError", "APITimeoutError", "APIStatusError"} <= {cls.__name__ for cls in classes}
    assert [cls.__qualname__ for cls in classes if transport_rule(bare(cls)) is not None] == []


@pytest.mark.parametrize("sdk", SDKS)
def test_an_sdk_connection_error_maps_by_the_transport_error_under_it(sdk: str) -> None:
    """Each SDK connection error (`APIConnectionError`, `APITimeoutError`) raised `from` each httpx2
    error a row covers is the failure of that row: its kind and delivery."""
    import httpx2

    causes = [cls for cls in exception_classes(httpx2) if transport_rule(bare(cls)) is not None]
    connection_errors = [
        cls for cls in sdk_classes(sdk) if cls.__name__ in ("APIConnectionError", "APITimeoutError")
    ]
    assert len(connection_errors) == 2
    assert len(causes) >= 10
    wrong = []
    for sdk_class in connection_errors:
        for cause_class in causes:
            error = sdk_class(request=httpx2.Request("POST", "http://model.test/v1/responses"))  # type: ignore[call-arg]
            error.__cause__ = cause = bare(cause_class)
            rule = transport_rule(cause)
            assert rule is not None
            failure = sdk_failure(error)
            details = failure.http_details
            seen = (failure.failure_kind, None if details is None else details.delivery)
            if seen != (rule.kind, rule.delivery):
                wrong.append(f"{sdk_class.__name__} from {cause_class.__name__}: {seen}")
    assert wrong == []
