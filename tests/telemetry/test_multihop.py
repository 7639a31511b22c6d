"""A real multi-hop failure with OpenTelemetry's SDK in every process: collector -> agent -> model.

The model fails with a two-event chain (a provider's 503 under its own `model_server_error`); the agent
rebuilds it and fails with its own `agent_run_error` from it; the collector rebuilds that. Each server
counts the failure it replied with and puts one event carrying its reply's chain on its span; each
caller puts the remote event ids on its own span.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gym_failures.failure_kinds import classify_failure
from gym_failures.failure_transport import FailureHeader
from gym_failures.telemetry import REPORT_SIZE, SERVER_FAILURES, SPAN_REMOTE_EVENT
from tests.multihop.collectors import AiohttpCollector
from tests.processes import free_port, stop, wait_listening
from tests.telemetry.conftest import Telemetry

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Traced:
    url: str
    process: subprocess.Popen[bytes]


def _start(name: str, *args: str) -> Traced:
    port = free_port()
    command = [sys.executable, "-m", "tests.telemetry.traced_servers", name, "--port", str(port), *args]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, process)
    except BaseException:
        stop(process)
        raise
    return Traced(f"http://127.0.0.1:{port}", process)


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[Traced, Traced]]:
    model = _start("model")
    try:
        agent = _start("agent", "--model-url", model.url)
    except BaseException:
        stop(model.process)
        raise
    try:
        yield model, agent
    finally:
        stop(agent.process)
        stop(model.process)


async def _recorded(session: aiohttp.ClientSession, server: Traced) -> dict[str, Any]:
    async with session.get(f"{server.url}/_test/telemetry") as reply:
        value: dict[str, Any] = await reply.json()
        return value


def _only(items: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(items) == 1, items
    return items[0]


async def test_every_hop_records_its_failure_and_the_remote_ids(
    telemetry: Telemetry, stack: tuple[Traced, Traced]
) -> None:
    model, agent = stack
    rid = f"r{uuid.uuid4().hex[:12]}x"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await _recorded(session, model)  # only this test's records from here on
        await _recorded(session, agent)
        collector = AiohttpCollector(session)
        with telemetry.tracer.start_as_current_span("collector"):
            reply = await collector.post(
                f"{agent.url}/run", {"rid": rid, "mode": "provider_503", "timeout": 30}
            )
        origin = json.loads(await collector.get(f"{model.url}/_test/origin/{rid}"))
        at_model = await _recorded(session, model)
        at_agent = await _recorded(session, agent)

    assert reply.status == 500
    report = FailureHeader.decode(reply.headers)
    assert report is not None
    assert report.failure_id is not None
    model_ids = origin["raised"]  # causes first: the provider's 503, then the model server's failure
    assert len(model_ids) == 2
    agent_id = report.failure_id
    assert set(report.events) == {agent_id, *model_ids}

    # The model server: one failure counted, both its events on its span, the span an error.
    counted = _only(at_model["metrics"][SERVER_FAILURES])
    assert counted["value"] == 1
    assert counted["attributes"] == {
        "nemo.gym.boundary": "model",
        "nemo.gym.failure_kind": "model_server_error",
        "nemo.gym.failure_class": classify_failure(
            "model_server_error", None, report.events[model_ids[1]].http_status
        ).value,
        "http.response.status_code": 500,
    }
    assert _only(at_model["metrics"][REPORT_SIZE])["count"] == 1
    model_span = _only(at_model["spans"])
    assert model_span["status"] == "ERROR"
    assert model_span["events"] == []  # the reply is on the span itself
    assert model_span["attributes"]["error.type"] == "model_server_error"
    assert model_span["attributes"]["nemo.gym.failure.event_id"] == model_ids[1]
    assert model_span["attributes"]["nemo.gym.failure.cause_id"] == model_ids[0]
    assert (
        model_span["attributes"]["nemo.gym.failure.chain"]
        == "model_server_error@model <- model_request_error@model"
    )

    # The agent: the model's ids on its span as a remote failure, its own failure counted and on it.
    counted = _only(at_agent["metrics"][SERVER_FAILURES])
    assert counted["attributes"]["nemo.gym.boundary"] == "agent"
    assert counted["attributes"]["nemo.gym.failure_kind"] == "agent_run_error"
    agent_span = _only([span for span in at_agent["spans"] if span["name"] == "POST /run"])
    assert agent_span["status"] == "ERROR"
    assert agent_span["attributes"]["error.type"] == "agent_run_error"
    remote = _only([event for event in agent_span["events"] if event["name"] == SPAN_REMOTE_EVENT])
    assert remote["attributes"]["nemo.gym.failure.event_id"] == model_ids[1]
    assert sorted(remote["attributes"]["nemo.gym.failure.event_ids"]) == sorted(model_ids)
    assert [event["name"] for event in agent_span["events"]] == [SPAN_REMOTE_EVENT]
    assert agent_span["attributes"]["nemo.gym.failure.event_id"] == agent_id
    assert agent_span["attributes"]["nemo.gym.failure.cause_id"] == model_ids[1]
    assert agent_span["attributes"]["nemo.gym.failure.chain"] == (
        "agent_run_error@agent <- model_server_error@model <- model_request_error@model"
    )
    # The join of the hops: the agent's remote event names the model span's failure.
    assert (
        remote["attributes"]["nemo.gym.failure.event_id"]
        == model_span["attributes"]["nemo.gym.failure.event_id"]
    )

    # The collector (this process): every id of the agent's reply on its own span.
    (span,) = [span for span in telemetry.spans() if span.name == "collector"]
    (event,) = [event for event in span.events if event.name == SPAN_REMOTE_EVENT]
    assert event.attributes is not None
    assert event.attributes["nemo.gym.failure.event_id"] == agent_id
    ids = event.attributes["nemo.gym.failure.event_ids"]
    assert isinstance(ids, tuple)
    assert sorted(ids) == sorted(report.events)
