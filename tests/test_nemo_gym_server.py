"""`gym_failures.nemo_gym_server` on its own: the secrets it finds in a config, the boundary a class
must name, and an instrumented server's outbound aiohttp calls, against a local upstream that drops
the connection or cuts its reply. The real NeMo Gym servers are in
tests/nemo_gym_peer/test_nemo_gym_servers.py and tests/nemo_gym_peer/test_outbound_chain.py."""

from __future__ import annotations

import asyncio
import json
import socketserver
import threading
from collections.abc import Iterator
from typing import ClassVar

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gym_failures._body_report import body_report
from gym_failures.failure_kinds import MODEL_SERVER_ERROR, PROVIDER_PROTOCOL_ERROR, TRANSPORT_PEER_DROP
from gym_failures.failure_records import FailureBoundary, FailureReport
from gym_failures.failure_transport import FailureHeader
from gym_failures.failures import ModelFailure
from gym_failures.nemo_gym_server import boundary_of, instrument, instrument_app, server_secrets
from gym_failures.redaction import MIN_KNOWN_SECRET, forget_registered_secrets


class _Config(BaseModel):
    name: str = "judge"
    host: str = "127.0.0.1"
    judge_api_key: str = "judge-key-0123456789"
    policy_token: SecretStr = SecretStr("secret-str-value-42")
    extra_headers: dict[str, str] = {
        "Authorization": "Bearer header-token-abcdef",
        "X-Trace": "trace-id-1234",
    }
    tokenless: int = 7
    short_key: str = "abc"


class _Client:
    global_config_dict: ClassVar[dict[str, object]] = {
        "other_server": {"models": {"openai_api_key": "global-key-9876543210"}}
    }


class _Server:
    config = _Config()
    server_client = _Client()


def test_the_secrets_are_every_string_under_a_secret_key_and_every_secret_str() -> None:
    assert set(server_secrets(_Server())) == {
        "judge-key-0123456789",
        "secret-str-value-42",
        "Bearer header-token-abcdef",
        "header-token-abcdef",
        "trace-id-1234",  # under a "header" key: NeMo Gym masks it, so it is registered too
        "global-key-9876543210",
    }


def test_a_secret_too_short_to_redact_is_logged_by_its_key_only(caplog: pytest.LogCaptureFixture) -> None:
    server_secrets(_Server())
    assert "'short_key'" in caplog.text
    assert "abc" not in caplog.text.replace("'short_key'", "")


def test_instrument_app_adds_the_middleware_once() -> None:
    app = Starlette()
    try:
        instrument_app(app, _Server(), boundary="resources_server")
        instrument_app(app, _Server(), boundary="resources_server")
    finally:
        forget_registered_secrets()
    assert [getattr(entry.cls, "__name__", None) for entry in app.user_middleware] == [
        "NemoGymFailureMiddleware"
    ]


def test_a_class_that_is_no_nemo_gym_server_must_name_its_boundary() -> None:
    class Plain:
        def setup_webserver(self) -> Starlette:
            return Starlette()

    with pytest.raises(ValueError, match="name its boundary"):
        boundary_of(Plain)
    assert instrument(Plain, boundary="sandbox") is Plain
    assert instrument(Plain, boundary="sandbox") is Plain
    assert Plain.__dict__["__gym_failures_instrumented__"] == FailureBoundary.SANDBOX


_CONFIG = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["api_key", "host", "headers", "name", "x", "Token"]) | st.text(max_size=8),
            children,
            max_size=4,
        )
    ),
    max_leaves=25,
)


class _Any:
    def __init__(self, config: object, global_config: object) -> None:
        self.config = config
        self.server_client = type("Client", (), {"global_config_dict": global_config})()


@given(_CONFIG, _CONFIG)
def test_any_config_gives_secrets_found_in_it_never_a_crash(config: object, global_config: object) -> None:
    secrets = server_secrets(_Any(config, global_config))
    text = repr((config, global_config))
    assert all(len(secret) >= MIN_KNOWN_SECRET for secret in secrets)
    assert all(repr(secret)[1:-1] in text for secret in secrets)
    assert len(secrets) == len(set(secrets))


def test_a_model_servers_failure_replies_are_in_its_callers_sdk_shapes() -> None:
    async def fail(request: Request) -> Response:
        raise ModelFailure(failure_kind=MODEL_SERVER_ERROR, failure_reason="the model crashed")

    app = Starlette(
        routes=[Route("/v1/messages", fail, methods=["POST"]), Route("/v1/responses", fail, methods=["POST"])]
    )
    instrument_app(app, object(), boundary="model")
    with TestClient(app, raise_server_exceptions=False) as client:
        anthropic = client.post("/v1/messages").json()
        openai = client.post("/v1/responses").json()
    assert (anthropic["type"], anthropic["error"]["type"]) == ("error", "api_error")
    assert openai["error"]["code"] == MODEL_SERVER_ERROR


class _ModelConfig(BaseModel):
    """Keys that hold a secret word only as a substring, or name a model, tokenizer or policy."""

    tokenizer_model: str = "gpt-4o"
    output_token_policy: str = "remaining_context"
    author: str = "nvidia_team"
    authors: list[str] = ["Ada Lovelace"]
    judge_model_name: str = "gpt-4o-mini"
    monkey_patch: str = "enabled-always"
    apiKey: str = "camel-key-0123456789"  # noqa: N815 (a config key spelled as a user spells it)
    policy_api_key: str = "policy-key-0123456789"


class _ModelServer:
    config = _ModelConfig()


def test_only_whole_secret_words_of_a_key_make_it_secret() -> None:
    assert set(server_secrets(_ModelServer())) == {"camel-key-0123456789", "policy-key-0123456789"}


def test_a_model_name_in_the_config_survives_in_a_failure_text() -> None:
    from gym_failures.redaction import redact, register_secret

    try:
        for secret in server_secrets(_ModelServer()):
            register_secret(secret)
        assert redact("judge gpt-4o-mini answered 503") == "judge gpt-4o-mini answered 503"
        assert redact("key policy-key-0123456789 refused") == "key [REDACTED] refused"
    finally:
        forget_registered_secrets()


# --- Outbound calls ---------------------------------------------------------------------------------

_CANARY = "sk-outbound-canary-0123456789"


class _Upstream(socketserver.BaseRequestHandler):
    """Reads one request, then: `drop` closes before any reply; `cut` sends the headers (announcing
    event `ev-endpoint-cut`) and half the body, then closes; `malformed` sends a whole body that is
    not JSON (announcing `ev-endpoint-bad`)."""

    mode = "drop"

    def handle(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            data += chunk
        body = b'{"id": "resp_1", "output": []}'
        if self.mode == "cut":
            head = b"X-Gym-Fault-Event: ev-endpoint-cut\r\ncontent-length: %d\r\n" % len(body)
        elif self.mode == "malformed":
            head = b"X-Gym-Fault-Event: ev-endpoint-bad\r\ncontent-length: 10\r\nconnection: close\r\n"
        else:
            return
        reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + head + b"\r\n" + body[:10]
        self.request.sendall(reply)


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _chain(report: FailureReport) -> list[tuple[str, str, str, str | None]]:
    return [
        (event_id, event.boundary.value, event.failure_kind, event.cause_id)
        for event_id, event in report.events.items()
    ]


def _model_server(port: int) -> Starlette:
    async def responses(request: Request) -> Response:
        async with aiohttp.ClientSession() as session:
            reply = await session.post(
                f"http://127.0.0.1:{port}/v1/responses?api_key={_CANARY}",
                json={"input": "hi"},
                headers={"Authorization": f"Bearer {_CANARY}"},
            )
            return JSONResponse(json.loads(await reply.read()))

    app = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])
    instrument_app(app, object(), boundary="model")
    return app


@pytest.mark.parametrize(
    ("mode", "kind", "endpoint_event"),
    [
        ("drop", TRANSPORT_PEER_DROP, None),
        ("cut", TRANSPORT_PEER_DROP, "ev-endpoint-cut"),
        ("malformed", PROVIDER_PROTOCOL_ERROR, "ev-endpoint-bad"),
    ],
)
def test_an_upstream_call_that_breaks_is_the_cause_of_the_servers_failure(
    upstream: int, mode: str, kind: str, endpoint_event: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Upstream, "mode", mode)
    with TestClient(_model_server(upstream), raise_server_exceptions=False) as client:
        reply = client.post("/v1/responses", json={})
    report = FailureHeader.decode(dict(reply.headers))
    assert report is not None
    assert report.failure_id is not None
    own = report.events[report.failure_id]
    assert (own.boundary, own.failure_kind) == (FailureBoundary.MODEL, kind)
    assert own.cause_id is not None
    cause = report.events[own.cause_id]
    assert (cause.boundary, cause.failure_kind, cause.cause_id) == (FailureBoundary.MODEL, kind, None)
    if endpoint_event is not None:
        assert own.cause_id == endpoint_event
    # The same chain in the body, for a reader that keeps no headers (NeMo Gym's collector).
    in_body = body_report(reply.text)
    assert in_body is not None
    assert _chain(in_body) == _chain(report)
    assert _CANARY not in reply.text
    assert _CANARY not in str(reply.headers)


def test_outside_an_instrumented_request_a_session_is_left_alone(upstream: int) -> None:
    async def call() -> None:
        async with aiohttp.ClientSession() as session:
            await session.post(f"http://127.0.0.1:{upstream}/v1/responses", json={})

    _Upstream.mode = "drop"
    with pytest.raises(aiohttp.ServerDisconnectedError) as raised:
        asyncio.run(call())
    assert not hasattr(raised.value, "gym_failures_failure")
