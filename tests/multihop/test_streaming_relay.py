"""A streamed reply through a relay: the model streams SSE and fails in its terminal event, the agent
passes the stream on unchanged (`relay_stream`) and still reports the model's failure.

The model records every byte it streamed, so the bytes the collector receives through the agent are
compared with the bytes the model sent for that very request.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from gym_failures import FailureReport
from gym_failures.failure_transport import StreamFailureReportReader
from tests.multihop.collectors import Collector, StreamReply
from tests.multihop.conftest import Stack

PAUSE_S = 0.8
"""How long the model pauses before its terminal event in the pacing test."""


def new_rid() -> str:
    return f"s{uuid.uuid4().hex[:12]}x"


async def relayed(collector: Collector, stack: Stack, **body: Any) -> tuple[str, StreamReply]:
    rid = new_rid()
    return rid, await collector.stream(f"{stack.agent.url}/relay", {"rid": rid, **body})


async def streamed(collector: Collector, stack: Stack, rid: str) -> bytes:
    """The bytes the model server says it streamed for `rid`."""
    return await collector.get(f"{stack.model.url}/_test/stream/{rid}")


async def origin(collector: Collector, stack: Stack, rid: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(await collector.get(f"{stack.model.url}/_test/origin/{rid}"))
    return value


def read_report(chunks: list[bytes]) -> FailureReport | None:
    reader = StreamFailureReportReader()
    for chunk in chunks:
        reader.feed(chunk)
    return reader.finish()


async def test_the_relay_passes_the_models_stream_on_byte_for_byte(
    stack: Stack, collector: Collector
) -> None:
    rid, reply = await relayed(collector, stack, mode="fail")
    sent = await streamed(collector, stack, rid)

    assert reply.status == 200
    assert reply.body == sent
    # The whole stream: past the large delta, up to the end of its terminal event.
    assert len(sent) > 300_000
    assert sent.endswith(b"\n\n")
    assert b"event: response.failed\n" in sent


async def test_a_direct_caller_receives_the_stream_the_model_recorded(
    stack: Stack, collector: Collector
) -> None:
    """The model's record is what it put on the wire, so comparing a relayed stream with it is sound."""
    rid = new_rid()

    reply = await collector.stream(f"{stack.model.url}/v1/responses/stream", {"rid": rid, "mode": "fail"})

    assert reply.body == await streamed(collector, stack, rid)


async def test_the_relay_forwards_each_event_as_it_comes(stack: Stack, collector: Collector) -> None:
    """The model pauses before its terminal event: the events before it reach the collector first."""
    _, reply = await relayed(collector, stack, mode="fail", pause_s=PAUSE_S)

    assert reply.arrived[-1] - reply.arrived[0] >= PAUSE_S / 2


async def test_the_collector_reads_the_models_failure_from_the_relayed_stream(
    stack: Stack, collector: Collector
) -> None:
    rid, reply = await relayed(collector, stack, mode="fail")
    provider_id, model_id = (await origin(collector, stack, rid))["raised"]

    report = read_report(reply.chunks)

    assert report is not None
    assert report.failure_id == model_id
    assert report.events[model_id].cause_id == provider_id
    assert sorted(report.events) == sorted([model_id, provider_id])


async def test_the_collector_reads_the_recovered_observations_of_a_completed_stream(
    stack: Stack, collector: Collector
) -> None:
    rid, reply = await relayed(collector, stack, mode="ok", observe=2)
    made = await origin(collector, stack, rid)

    report = read_report(reply.chunks)

    assert report is not None
    assert report.failure_id is None
    assert sorted(report.events) == sorted(made["observed"])


async def test_the_relaying_agent_reports_the_models_stream_failure(
    stack: Stack, collector: Collector
) -> None:
    """/run-stream consumes the model's stream with `relay_stream` and answers JSON: its reply header
    holds the model's events as observations."""
    rid = new_rid()

    reply = await collector.post(f"{stack.agent.url}/run-stream", {"rid": rid, "mode": "fail"})
    made = await origin(collector, stack, rid)

    assert reply.status == 200
    assert reply.report is not None
    assert reply.report.failure_id is None
    assert sorted(reply.report.events) == sorted(made["raised"])


async def test_the_relaying_agent_consumes_the_stream_the_model_sent(
    stack: Stack, collector: Collector
) -> None:
    rid = new_rid()

    reply = await collector.post(f"{stack.agent.url}/run-stream", {"rid": rid, "mode": "fail"})
    sent = await streamed(collector, stack, rid)

    assert reply.json() == {"sha256": hashlib.sha256(sent).hexdigest(), "bytes": len(sent)}
