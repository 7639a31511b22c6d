"""What `FailureReportMiddleware` records: `gym.server.failures`, the report-size histogram and the span
events, driven in process with a real httpx client over the ASGI transport."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from opentelemetry.trace import StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

import gym_failures.telemetry._record as record_module
from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failure_transport import FailureHeader, observe_failure
from gym_failures.failures import AgentFailure, ModelFailure, SandboxFailure, rebuild_failure
from gym_failures.reply import reply_headers
from gym_failures.telemetry import (
    MAX_NAMESPACED_KINDS,
    REPORT_SIZE,
    SERVER_FAILURES,
)
from tests.telemetry.conftest import Telemetry

Handler = Callable[[Request], Awaitable[Response]]


def _app(handler: Handler, boundary: str = "agent") -> Starlette:
    app = Starlette(routes=[Route("/", handler, methods=["GET", "POST"])])
    app.add_middleware(FailureReportMiddleware, boundary=boundary)
    return app


async def _get(app: Starlette, telemetry: Telemetry | None = None, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        if telemetry is None:
            return await client.post("/", **kwargs)
        with telemetry.tracer.start_as_current_span("request"):
            return await client.post("/", **kwargs)


async def _chain(request: Request) -> Response:
    try:
        raise SandboxFailure(failure_kind="provider_oom_killed", failure_reason="exit 137", stage="agent")
    except SandboxFailure as oom:
        raise AgentFailure(
            failure_kind="agent_run_error", failure_reason="tool failed", stage="agent"
        ) from oom


async def test_a_failure_reply_is_counted_with_its_attributes(telemetry: Telemetry) -> None:
    reply = await _get(_app(_chain), telemetry)
    assert reply.status_code == 500
    points = telemetry.points()
    (point,) = points[SERVER_FAILURES]
    assert point.value == 1
    assert point.attributes == {
        "nemo.gym.boundary": "agent",
        "nemo.gym.failure_kind": "agent_run_error",
        "nemo.gym.failure_class": "evaluation",
        "nemo.gym.stage": "agent",
        "http.response.status_code": 500,
    }
    (size,) = points[REPORT_SIZE]
    assert size.value == 1
    assert size.total == len(reply.headers[FailureHeader.NAME])
    assert size.attributes == {}


async def test_a_failure_reply_puts_its_failure_and_chain_on_the_span_and_marks_it(
    telemetry: Telemetry,
) -> None:
    """What a trace UI reads off the exported span: the reply's failure in its attributes (the id a
    caller's `gym.failure.remote` names), every event in the chain, the error status; no event."""
    reply = await _get(_app(_chain), telemetry)
    report = FailureHeader.decode(dict(reply.headers))
    assert report is not None
    assert report.failure_id is not None
    (span,) = telemetry.spans()
    assert span.events == ()
    cause_id = report.events[report.failure_id].cause_id
    assert cause_id is not None
    attributes = dict(span.attributes or {})
    chain = attributes.pop("nemo.gym.failure.chain")
    assert attributes == {
        "error.type": "agent_run_error",
        "nemo.gym.failure.event_id": report.failure_id,
        "nemo.gym.failure.cause_id": cause_id,
        "nemo.gym.failure_kind": "agent_run_error",
        "nemo.gym.boundary": "agent",
        "nemo.gym.stage": "agent",
    }
    # The failure, then its causes, each as `<kind>@<boundary>`: the chain as a trace UI shows it.
    assert chain == "agent_run_error@agent <- provider_oom_killed@sandbox"
    assert "tool failed" not in chain  # reasons never go on a span
    assert span.status.status_code is StatusCode.ERROR


async def test_a_success_without_a_report_records_nothing(telemetry: Telemetry) -> None:
    async def ok(request: Request) -> Response:
        return PlainTextResponse("ok")

    reply = await _get(_app(ok), telemetry)
    assert reply.status_code == 200
    assert telemetry.points() == {}
    (span,) = telemetry.spans()
    assert span.events == ()
    assert span.status.status_code is StatusCode.UNSET


async def test_a_success_with_observations_records_its_size_and_events_but_no_failure(
    telemetry: Telemetry,
) -> None:
    async def recovered(request: Request) -> Response:
        observe_failure(ModelFailure(failure_kind="model_server_error", failure_reason="attempt 1 got 503"))
        return PlainTextResponse("ok")

    await _get(_app(recovered), telemetry)
    points = telemetry.points()
    assert SERVER_FAILURES not in points
    assert [point.value for point in points[REPORT_SIZE]] == [1]
    (span,) = telemetry.spans()
    assert span.events == ()
    # No failure, so no failure attributes and no error: the recovered event is in the chain.
    assert span.attributes == {"nemo.gym.failure.chain": "model_server_error@model"}
    assert span.status.status_code is StatusCode.UNSET


async def test_a_failure_the_app_replies_with_itself_is_counted_with_its_status(telemetry: Telemetry) -> None:
    async def quota(request: Request) -> Response:
        failure = ModelFailure(
            failure_kind="provider_quota_exhausted", failure_reason="quota", http_status=429
        )
        return PlainTextResponse("slow down", status_code=429, headers=reply_headers(failure))

    await _get(_app(quota, boundary="model"), telemetry)
    (point,) = telemetry.points()[SERVER_FAILURES]
    assert point.attributes["http.response.status_code"] == 429
    assert point.attributes["nemo.gym.failure_kind"] == "provider_quota_exhausted"
    assert point.attributes["nemo.gym.boundary"] == "model"


async def test_an_oversized_report_is_recorded_at_its_whole_size(telemetry: Telemetry) -> None:
    async def many(request: Request) -> Response:
        for index in range(40):
            observe_failure(
                ModelFailure(failure_kind="model_server_error", failure_reason=f"{index} " + "x" * 150)
            )
        raise AgentFailure(failure_kind="agent_run_error", failure_reason="gave up")

    reply = await _get(_app(many))
    (size,) = telemetry.points()[REPORT_SIZE]
    assert size.value == 1
    assert len(reply.headers[FailureHeader.NAME]) <= FailureHeader.MAX_BYTES < size.total


class _BrokenInstrument:
    """Raises from every record. OpenTelemetry's SDK does not raise from `add` or `record`, so only a
    stand-in can show that an instrument that does never reaches the caller."""

    def add(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("broken exporter")

    record = __call__ = add


async def test_recording_never_raises_into_the_caller(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = _BrokenInstrument()
    cost = record_module._AttemptCost(broken, broken, broken)  # type: ignore[arg-type]
    instruments = record_module._Instruments(broken, broken, broken, broken, broken, cost)  # type: ignore[arg-type]
    monkeypatch.setattr(record_module, "_instruments", instruments)
    reply = await _get(_app(_chain), telemetry)
    assert reply.status_code == 500
    assert reply.json()["failure_kind"] == "agent_run_error"


def _peer_header(kind: str) -> str:
    """A peer's reply header naming a failure of `kind`, as a newer version would send it."""
    event = {"boundary": "model", "failure_kind": kind, "failure_reason": "peer"}
    return json.dumps({"events": {"e1": event}, "failure_id": "e1"})


async def _relay(request: Request) -> Response:
    # A server that rebuilds the failure a peer replied with and fails with it, as an agent does.
    report = FailureHeader.decode({FailureHeader.NAME: request.headers["x-peer-report"]})
    assert report is not None
    failure = rebuild_failure(report)
    assert failure is not None
    raise failure


async def test_label_cardinality_stays_bounded_when_a_peer_sends_10000_unknown_kinds(
    telemetry: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """Half plain unknown names (`unregistered:<kind>` once decoded), half namespaced ones."""
    caplog.set_level(logging.CRITICAL, logger="gym_failures")  # 10,000 failure lines are not the subject
    app = _app(_relay)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for index in range(10_000):
            kind = f"peer:kind_{index}" if index % 2 else f"kind_{index}"
            reply = await client.post("/", headers={"x-peer-report": _peer_header(kind)})
            assert reply.status_code == 500
    points = telemetry.points()[SERVER_FAILURES]
    assert sum(point.value for point in points) == 10_000
    labels = {point.attributes["nemo.gym.failure_kind"] for point in points}
    namespaced = {label for label in labels if ":" in label}
    assert len(namespaced) <= MAX_NAMESPACED_KINDS
    assert {"unregistered", "other"} <= labels
    assert len(labels) <= MAX_NAMESPACED_KINDS + 2
    by_label = {point.attributes["nemo.gym.failure_kind"]: point.value for point in points}
    assert by_label["unregistered"] == 5_000
