"""NeMo Gym servers: one call makes a NeMo Gym server speak gym-failures, unchanged otherwise.

    from gym_failures.nemo_gym_server import instrument

    @instrument
    class MyResourcesServer(SimpleResourcesServer):
        ...

or, for a server class you do not own (a bundled agent), in its entrypoint::

    instrument(SimpleAgent).run_webserver()

NeMo Gym builds each server's app in the server's `setup_webserver()`, which its
`SimpleServer.run_webserver()` calls before it adds NeMo Gym's own exception middleware, its
cancellation middleware and OpenTelemetry's (nemo_gym/server_utils.py:1355-1379). `instrument(cls)`
wraps the class's `setup_webserver` so that every app it builds, in every worker:

- sends each request's failure report (`gym_failures.asgi.FailureReportMiddleware`, the boundary
  named by the server's base class). The middleware sits inside NeMo Gym's exception middleware, so a
  failure reply is a response there and NeMo Gym leaves it alone;
- rebuilds the upstream failure a handler's `ClientResponseError` names: NeMo Gym's own
  `raise_for_status` (nemo_gym/server_utils.py:655) keeps the upstream reply's headers and body on
  it, so the middleware rebuilds the upstream failure (same kind, event and origin ids, its causes).
  When the error escapes the handler, the reply is that failure, as a call site rewritten to
  `raise_boundary_failure` would send; an exception raised `from` it is this server's failure with
  the upstream one as its cause. Existing `await raise_for_status(response)` call sites keep the
  chain without a change;
- observes its outbound calls (`gym_failures._nemo_gym_outbound`): every aiohttp call the server
  makes while it serves a request, NeMo Gym's `ServerClient` (through `nemo_gym.server_utils.request`
  and its global session) and a model server's upstream calls (`NeMoGymAsyncOpenAI`, the same
  session) alike. A reply's report header is observed; a transport error (a refused connection, a
  timeout, a connection dropped before the reply or in the middle of its body, aiohttp's
  `ServerDisconnectedError`, `ClientPayloadError`, ...) becomes a failure of the boundary called, of
  the kind `map_transport_errors` gives it, under the event id the upstream announced in
  `X-Gym-Fault-Event` (`gym-failures serve model`); a reply whose JSON body does not parse is a
  `provider_protocol_error` (a model's; `environment_protocol_violation` for any other server). The
  aiohttp error itself is re-raised unchanged, so NeMo Gym's retry loops behave as before;
- adds this hop's event: when an exception that stands for a failed upstream call (one of those, or
  a status error whose reply carried a report) escapes the handler, the reply is this server's own
  failure, of the upstream failure's kind and this server's boundary, with the upstream failure as
  its cause; and when the handler returns an upstream's failed reply as its own (the `legacy_agent`
  environment server relays the agent's `/run`), the reply is this server's failure caused by the
  upstream one, the same way. So the chain that reaches NeMo Gym's collector through instrumented
  servers is environment (`/run`, the relay) -> agent (`/run`) -> agent (its own `/v1/responses`) ->
  model server -> the endpoint's event;
- puts the report into the failure reply's JSON body too (`failure_report`, bounded and ordered so
  its root is last: `gym_failures._body_report`), since NeMo Gym's collector keeps a failed `/run`'s
  body and drops its headers; `gym-failures explain` rebuilds the chain from the row's
  `_ng_failure_response_body`, through NeMo Gym's own quoting when a server that is not instrumented
  passed the body on;
- registers the server's secrets (`gym_failures.redaction.register_secret`): every string in its
  config and in the global config it was given under a key one of whose words is NeMo Gym's word
  for a secret (`nemo_gym.secret_utils.looks_like_secret_key`, nemo_gym/secret_utils.py:24: "token",
  "key", "header") or redaction's (`gym_failures.redaction.SECRET_NAME_WORDS`: secret, password,
  auth, credential, cookie, signature, ...), whole sub-trees included, a bearer value's token too,
  and every `SecretStr`. No failure text this process sends or logs holds them.

The boundary by base class, matched by name along the MRO as NeMo Gym matches its server types
(nemo_gym/server_utils.py:1045): `SimpleResourcesServer` is `resources_server`,
`SimpleResponsesAPIAgent` is `agent`, `SimpleResponsesAPIModel` is `model`, `BaseEnvironmentServer`
is `environment`; another class names its own with `boundary=`.

Decisions:
- The call takes the class, not an instance or an app: `run_webserver()` makes the instance and
  the app itself, so the class is what a user holds. It changes the class in place (as a class
  decorator does) and returns it. Calling it again adds nothing; a subclass of an instrumented class
  is instrumented already, with its parent's boundary (its app gets the middleware once).
- A model server's failure replies are in the shape its callers' SDKs read: Anthropic's on
  `/v1/messages`, OpenAI's elsewhere; every other server's are gym-failures' own body.
- A config value is registered when its key names a secret by whole words (split on `_`, `-`, `.`
  and camelCase: `gym_failures.redaction.name_words`), with NeMo Gym's words and ours, and its last
  word names no model, tokenizer or policy. NeMo Gym's own rule matches substrings
  (`"token" in key`), so it calls `tokenizer_model`, `output_token_policy` and `max_tokens` secret;
  it only masks them when a config is printed, where that costs nothing. Registered here, such a
  value (`gpt-4o`) would be cut out of every failure text ("judge [REDACTED]-mini answered 503"), so
  those keys are not secret here; nor is `author`, which our `auth` matched as a substring. A value
  registered under a real secret key costs at most a word of a failure text, never data. A value shorter
  than `gym_failures.redaction.MIN_KNOWN_SECRET` cannot be registered; its key is logged, never it.
- An escaped upstream failure gets this server's event on top (issue 31), where the plain
  `FailureReportMiddleware` forwards it as it came: through NeMo Gym's hops a chain of one event
  said nothing of which servers it crossed. The hop's event takes the upstream failure's kind, not
  `infrastructure_error`: a reader that takes a row's kind from its failure's own event (the retry
  rules, the gate) reads what it read when the upstream failure was forwarded, and the boundary and
  the chain say where it came from.
- The outbound calls are observed by wrapping `aiohttp.ClientSession._request` once per process
  (`_nemo_gym_outbound` says why not a `TraceConfig`); it acts only while an instrumented server
  serves a request, and never changes what a call raises or returns.
- This module imports neither NeMo Gym nor a web framework (aiohttp only when `instrument_app`
  runs): it needs only what a server and its app are (`config`, `server_client.global_config_dict`,
  `add_middleware`, `state`), and OmegaConf, when a global config is one, to read it. NeMo Gym's
  secret-key rule is matched, not imported.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

from gym_failures._body_report import with_body_report
from gym_failures._nemo_gym_outbound import HopApp, Resolver, called_boundaries, observe_aiohttp
from gym_failures.asgi import ErrorShape, FailureReportMiddleware, Scope
from gym_failures.failure_records import FailureBoundary
from gym_failures.failure_transport import FailureHeader
from gym_failures.redaction import MIN_KNOWN_SECRET, is_secret_name, register_secret

__all__ = [
    "BOUNDARY_BY_BASE",
    "NemoGymFailureMiddleware",
    "boundary_of",
    "instrument",
    "instrument_app",
    "server_secrets",
]

LOGGER = logging.getLogger(__name__)

ServerT = TypeVar("ServerT", bound=type)

BOUNDARY_BY_BASE: Mapping[str, FailureBoundary] = {
    "SimpleResourcesServer": FailureBoundary.RESOURCES_SERVER,
    "BaseResourcesServer": FailureBoundary.RESOURCES_SERVER,
    "SimpleResponsesAPIAgent": FailureBoundary.AGENT,
    "BaseResponsesAPIAgent": FailureBoundary.AGENT,
    "SimpleResponsesAPIModel": FailureBoundary.MODEL,
    "BaseResponsesAPIModel": FailureBoundary.MODEL,
    "BaseEnvironmentServer": FailureBoundary.ENVIRONMENT,
}
"""A NeMo Gym server base class's name -> the boundary its servers' failures are of."""

_INSTRUMENTED = "__gym_failures_instrumented__"
_APP_MARK = "gym_failures_instrumented"
_REPORT_HEADER = FailureHeader.NAME.lower().encode("ascii")
# NeMo Gym's words for a secret key ("token", "key", "header": nemo_gym/secret_utils.py:24) beside
# redaction's own (`SECRET_NAME_WORDS`), each a whole word of the key.
_NEMO_GYM_WORDS = frozenset({"token", "key", "keys", "header", "headers"})
_SCHEME = re.compile(r"(?i)^(?:bearer|basic|token|digest)\s+(\S+)$")
_MAX_DEPTH = 32


class _App(Protocol):
    """What this module needs of a FastAPI or Starlette app."""

    @property
    def state(self) -> Any: ...

    def add_middleware(self, middleware_class: Any, *args: Any, **kwargs: Any) -> None: ...


def instrument(server_class: ServerT, *, boundary: FailureBoundary | str | None = None) -> ServerT:
    """Make `server_class` (a NeMo Gym `SimpleServer` subclass) speak gym-failures: every app its
    `setup_webserver()` builds gets `instrument_app` (see the module's docstring). Returns the class,
    changed in place, so it also serves as a class decorator."""
    chosen = boundary_of(server_class) if boundary is None else FailureBoundary(boundary)
    if server_class.__dict__.get(_INSTRUMENTED) == chosen:
        return server_class
    setup: Callable[[Any], Any] = server_class.setup_webserver  # type: ignore[attr-defined]

    @functools.wraps(setup)
    def setup_webserver(self: Any) -> Any:
        app = setup(self)
        instrument_app(app, self, boundary=chosen)
        return app

    # A pydantic model class takes a new method like any class; its instances are what refuse it.
    type.__setattr__(server_class, "setup_webserver", setup_webserver)
    type.__setattr__(server_class, _INSTRUMENTED, chosen)
    return server_class


def boundary_of(server_class: type) -> FailureBoundary:
    """The boundary of a NeMo Gym server class, by its base class (`BOUNDARY_BY_BASE`)."""
    for base in server_class.__mro__:
        found = BOUNDARY_BY_BASE.get(base.__name__)
        if found is not None:
            return found
    raise ValueError(
        f"{server_class.__name__} is no NeMo Gym resources, agent, model or environment server: "
        "name its boundary (instrument(cls, boundary=...))"
    )


def instrument_app(app: _App, server: object, *, boundary: FailureBoundary | str) -> None:
    """Add the failure-report middleware to `app` (once) and register `server`'s secrets: what
    `instrument` does to each app a server builds, for an app built outside `setup_webserver`."""
    for secret in server_secrets(server):
        register_secret(secret)
    if getattr(app.state, _APP_MARK, False):
        return
    setattr(app.state, _APP_MARK, True)
    chosen = FailureBoundary(boundary)
    shape: ErrorShape | Callable[[Scope], ErrorShape] = (
        _model_error_shape if chosen is FailureBoundary.MODEL else "gym"
    )
    global_config = getattr(getattr(server, "server_client", None), "global_config_dict", None)
    observe_aiohttp()
    app.add_middleware(
        NemoGymFailureMiddleware,
        boundary=chosen,
        error_shape=shape,
        called=called_boundaries(global_config, chosen),
    )


class NemoGymFailureMiddleware(FailureReportMiddleware):
    """`FailureReportMiddleware` for an instrumented NeMo Gym server: the app runs inside `HopApp`
    (outbound calls observed, each failed call the cause of this server's failure), and a failure
    reply's JSON body carries its report too (`gym_failures._body_report`). See the module's
    docstring."""

    def __init__(
        self, app: Any, *, boundary: FailureBoundary | str, called: Resolver, **options: Any
    ) -> None:
        chosen = FailureBoundary(boundary)
        super().__init__(HopApp(app, boundary=chosen, called=called), boundary=chosen, **options)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        held: dict[str, Any] | None = None

        async def with_body_report(message: Any) -> None:
            nonlocal held
            if held is not None:
                start, held = held, None
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    start, message = _with_body_report(start, message)
                await send(start)
            elif (
                message["type"] == "http.response.start" and message["status"] >= 400 and _has_report(message)
            ):
                held = message
                return
            await send(message)

        await super().__call__(scope, receive, with_body_report)


def _has_report(start: Mapping[str, Any]) -> bool:
    return any(name.lower() == _REPORT_HEADER for name, _ in start.get("headers", ()))


def _with_body_report(start: Any, message: Any) -> tuple[Any, Any]:
    """The failure reply (`start`, `message`) with its header's report in its JSON body, when the body
    is a JSON object; unchanged otherwise."""
    headers = list(start.get("headers", ()))
    value = next((value for name, value in headers if name.lower() == _REPORT_HEADER), b"")
    report = FailureHeader.decode({FailureHeader.NAME: value.decode("latin-1")})
    body = with_body_report(bytes(message.get("body", b"")), report) if report is not None else None
    if body is None:
        return start, message
    headers = [(name, value) for name, value in headers if name.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode("ascii")))
    return {**start, "headers": headers}, {**message, "body": body}


def _model_error_shape(scope: Scope) -> ErrorShape:
    path = scope.get("path", "")
    return "anthropic" if isinstance(path, str) and path.endswith("/v1/messages") else "openai"


def server_secrets(server: object) -> list[str]:
    """The secrets a NeMo Gym server holds in its config and in the global config it was given (see
    the module's docstring), each once, longest first; values too short to register are left out and
    their keys logged."""
    found: dict[str, None] = {}
    config = getattr(server, "config", None)
    global_config = getattr(getattr(server, "server_client", None), "global_config_dict", None)
    for source in (_plain(config), _plain(global_config)):
        for key, value in _secret_values(source, secret=False, key="", depth=0):
            if len(value) >= MIN_KNOWN_SECRET:
                found[value] = None
            elif value:
                LOGGER.warning("config key %r looks secret but is too short to redact", key)
    return sorted(found, key=len, reverse=True)


def _plain(config: object) -> object:
    """`config` as plain dicts and lists: a pydantic model dumped (its `SecretStr`s revealed), an
    OmegaConf config resolved (unresolved when it cannot be)."""
    if config is None:
        return None
    dump = getattr(config, "model_dump", None)
    if callable(dump):
        return _revealed(dump())
    try:
        omegaconf = importlib.import_module("omegaconf")
    except ImportError:
        return config
    if isinstance(config, omegaconf.DictConfig | omegaconf.ListConfig):
        try:
            return omegaconf.OmegaConf.to_container(config, resolve=True)
        except Exception:  # an interpolation this process cannot resolve: read what is there
            return omegaconf.OmegaConf.to_container(config, resolve=False)
    return config


def _revealed(value: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        return None
    secret = getattr(value, "get_secret_value", None)
    if callable(secret):
        return {"secret": secret()}  # a SecretStr is secret whatever its key
    if isinstance(value, Mapping):
        return {key: _revealed(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_revealed(item, depth + 1) for item in value]
    return value


def _is_secret_key(key: str) -> bool:
    return is_secret_name(key, _NEMO_GYM_WORDS)


def _secret_values(value: object, *, secret: bool, key: str, depth: int) -> Iterator[tuple[str, str]]:
    """(key, value) for every string at or under a secret key, a bearer value's token beside it."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, str):
        if secret:
            yield key, value.strip()
            match = _SCHEME.match(value.strip())
            if match:
                yield key, match.group(1)
    elif isinstance(value, Mapping):
        for name, item in value.items():
            name = str(name)
            yield from _secret_values(item, secret=secret or _is_secret_key(name), key=name, depth=depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _secret_values(item, secret=secret, key=key, depth=depth + 1)
