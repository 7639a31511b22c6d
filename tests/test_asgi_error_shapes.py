"""The middleware's failure reply: the error shape per app or per route, a status per failure, Retry-After."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gym_failures.asgi import ErrorShape, FailureReportMiddleware
from gym_failures.failure_transport import FailureHeader
from gym_failures.failures import MAX_RETRY_AFTER_S, ModelFailure, NgFailureEvent


def _app(failure: Exception, **options: Any) -> Starlette:
    async def fail(request: Request) -> Response:
        raise failure

    app = Starlette(routes=[Route("/v1/messages", fail), Route("/v1/responses", fail)])
    app.add_middleware(FailureReportMiddleware, boundary="model", **options)
    return app


async def _post(app: Starlette, path: str = "/v1/responses") -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://model.test") as client:
        return await client.get(path)


def _quota(**fields: Any) -> ModelFailure:
    return ModelFailure(
        failure_kind="provider_quota_exhausted", failure_reason="quota", http_status=429, **fields
    )


async def test_the_gym_shape_is_the_default() -> None:
    failure = _quota()
    reply = await _post(_app(failure))
    assert reply.status_code == 500
    assert reply.json() == {
        "failure_kind": "provider_quota_exhausted",
        "failure_reason": "quota",
        "event_id": failure.event_id,
        "boundary": "model",
    }
    assert "retry-after" not in reply.headers


async def test_the_openai_shape_names_the_kind_and_event() -> None:
    failure = _quota()
    reply = await _post(_app(failure, error_shape="openai", failure_status=lambda f: f.http_status or 500))
    assert reply.status_code == 429
    error = reply.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "provider_quota_exhausted"
    assert error["message"] == f"provider_quota_exhausted: quota (event {failure.event_id})"
    assert (error["event_id"], error["boundary"]) == (failure.event_id, "model")
    report = FailureHeader.decode(reply.headers)
    assert report is not None
    assert report.failure_id == failure.event_id  # the report stays in the header


async def test_the_anthropic_shape_per_route() -> None:
    def shape(scope: Any) -> ErrorShape:
        return "anthropic" if scope["path"] == "/v1/messages" else "openai"

    failure = ModelFailure(failure_kind="model_server_error", failure_reason="crash")
    app = _app(failure, error_shape=shape)
    anthropic_body = (await _post(app, "/v1/messages")).json()
    assert anthropic_body["type"] == "error"
    assert anthropic_body["error"]["type"] == "api_error"
    assert anthropic_body["error"]["failure_kind"] == "model_server_error"
    assert (await _post(app, "/v1/responses")).json()["error"]["type"] == "server_error"


async def test_a_broken_status_or_shape_function_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    """It falls back and is logged by its type and raising frame, never its text (which a function of
    the failure or the scope may fill with the request's values)."""

    def broken(failure: NgFailureEvent) -> int:
        raise RuntimeError("boom CANARY-7f3a9q-alice")

    def nonsense(scope: Any) -> ErrorShape:
        return "xml"  # type: ignore[return-value]

    reply = await _post(_app(_quota(), failure_status=broken, error_shape=nonsense))
    assert reply.status_code == 500
    assert reply.json()["failure_kind"] == "provider_quota_exhausted"
    outside = await _post(_app(_quota(), failure_status=lambda f: 200))
    assert outside.status_code == 500
    logged = [r.getMessage() for r in caplog.records if r.name == "gym_failures.asgi"]
    assert any(m.startswith("failure_status raised RuntimeError at ") for m in logged)
    assert "CANARY-7f3a9q-alice" not in caplog.text
    assert all(r.exc_info is None for r in caplog.records)


def test_an_unknown_shape_is_refused_at_startup() -> None:
    with pytest.raises(ValueError, match="error_shape"):
        FailureReportMiddleware(_app(_quota()), boundary="model", error_shape="xml")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("hint", "header"),
    [(0.2, "1"), (1.0, "1"), (0.0, "0"), (MAX_RETRY_AFTER_S * 2, str(int(MAX_RETRY_AFTER_S)))],
)
async def test_retry_after_is_the_hint_in_whole_seconds_rounded_up(hint: float, header: str) -> None:
    reply = await _post(_app(_quota(retry_after_s=hint)))
    assert reply.headers["retry-after"] == header


async def test_retry_after_from_a_cause_the_caller_rebuilt() -> None:
    from gym_failures.failures import AgentFailure, HttpDetails

    provider = ModelFailure(failure_kind="provider_unavailable")
    provider.http_details = HttpDetails(
        method="POST", url="http://provider.test", status=503, retry_after_s=4.5
    )
    wrapper = AgentFailure(failure_kind="agent_run_error")
    wrapper.__cause__ = provider
    reply = await _post(_app(wrapper))
    assert reply.headers["retry-after"] == "5"
