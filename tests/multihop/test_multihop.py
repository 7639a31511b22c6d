"""Three hops over real sockets: collector -> agent server -> model server, each its own process.

The agent wraps the model's failure as its own (`raise AgentFailure(...) from model_failure`); the
collector must receive the agent's event with the model's event as its cause, origin ids unchanged,
and the report must stay within its bound at every hop. Every test runs with an aiohttp and an httpx
collector.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from gym_failures import AgentFailure, FailureBoundary, FailureEvent, FailureReport
from gym_failures.failure_transport import FailureHeader
from tests.multihop.collectors import Collector, Reply
from tests.multihop.conftest import Stack

FAILING_MODES = ["plain", "provider_503", "timeout"]
"""How the model fails: a plain exception, a provider 503, an answer slower than the agent waits."""
AGENT_TIMEOUT_S = 0.4
"""The agent's client timeout for the model call: well under the model's `timeout` mode."""
QUERY = {"trace": "t-4f2a9c"}


def new_rid() -> str:
    return f"r{uuid.uuid4().hex[:12]}x"


async def run(collector: Collector, stack: Stack, **body: Any) -> tuple[str, Reply]:
    """Call the agent's /run as a collector does; `body` says how the model and the agent behave."""
    rid = new_rid()
    payload = {"rid": rid, "timeout": AGENT_TIMEOUT_S if body.get("mode") == "timeout" else 30, **body}
    return rid, await collector.post(f"{stack.agent.url}/run", payload, params=QUERY)


async def origin(collector: Collector, stack: Stack, rid: str) -> dict[str, Any]:
    """What the model server itself made for `rid`, read out of band."""
    value: dict[str, Any] = json.loads(await collector.get(f"{stack.model.url}/_test/origin/{rid}"))
    return value


async def seen(collector: Collector, stack: Stack, rid: str) -> dict[str, Any]:
    """The model reply the agent received for `rid`, read out of band."""
    value: dict[str, Any] = json.loads(await collector.get(f"{stack.agent.url}/_test/seen/{rid}"))
    return value


def report_of(reply: Reply) -> FailureReport:
    report = reply.report
    assert report is not None, f"no {FailureHeader.NAME} on a {reply.status} reply"
    return report


def failed_event(report: FailureReport) -> FailureEvent:
    assert report.failure_id is not None
    return report.events[report.failure_id]


def cause_of(report: FailureReport, event: FailureEvent) -> FailureEvent:
    assert event.cause_id is not None, f"event {event.event_id} has no cause"
    return report.events[event.cause_id]


# --- The failure chain -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", FAILING_MODES)
async def test_the_reply_names_the_agents_failure(stack: Stack, collector: Collector, mode: str) -> None:
    rid, reply = await run(collector, stack, mode=mode)

    event = failed_event(report_of(reply))

    assert reply.status == 500
    assert (event.boundary, event.failure_kind, event.operation_id) == (
        FailureBoundary.AGENT,
        "agent_run_error",
        rid,
    )


@pytest.mark.parametrize("mode", FAILING_MODES)
async def test_the_agents_failure_is_caused_by_a_model_failure(
    stack: Stack, collector: Collector, mode: str
) -> None:
    _, reply = await run(collector, stack, mode=mode)
    report = report_of(reply)

    assert cause_of(report, failed_event(report)).boundary is FailureBoundary.MODEL


@pytest.mark.parametrize("mode", ["plain", "provider_503"])
async def test_the_models_event_keeps_the_id_the_model_server_made(
    stack: Stack, collector: Collector, mode: str
) -> None:
    """The cause's event id is the failure id of the report the model's reply left its process with."""
    rid, reply = await run(collector, stack, mode=mode)
    report = report_of(reply)
    made = await origin(collector, stack, rid)

    sent = FailureHeader.decode({FailureHeader.NAME: made["reply_header"]})

    assert sent is not None
    assert cause_of(report, failed_event(report)).event_id == sent.failure_id


async def test_a_plain_model_error_arrives_as_the_models_infrastructure_error(
    stack: Stack, collector: Collector
) -> None:
    rid, reply = await run(collector, stack, mode="plain")
    report = report_of(reply)

    cause = cause_of(report, failed_event(report))

    assert (cause.failure_kind, cause.exception_type) == ("infrastructure_error", "RuntimeError")
    # Its type, never its text: `str()` of a foreign exception is never read (docs/decisions.md).
    assert cause.failure_reason == (
        "RuntimeError raised in the handler (its message is never sent: it may quote the request)"
    )
    assert rid not in cause.failure_reason


async def test_a_provider_503_arrives_as_the_models_two_event_chain_with_its_origin_ids(
    stack: Stack, collector: Collector
) -> None:
    rid, reply = await run(collector, stack, mode="provider_503")
    report = report_of(reply)
    made = await origin(collector, stack, rid)

    model_event = cause_of(report, failed_event(report))
    provider_event = cause_of(report, model_event)

    assert [provider_event.event_id, model_event.event_id] == made["raised"]
    assert (model_event.failure_kind, model_event.http_status) == ("model_server_error", 503)
    assert (provider_event.failure_kind, provider_event.http_status) == ("model_request_error", 503)
    assert provider_event.cause_id is None


async def test_a_model_slower_than_the_agent_waits_arrives_as_a_transport_timeout(
    stack: Stack, collector: Collector
) -> None:
    """The agent observed the timeout itself: the model server made no event and sent no report."""
    rid, reply = await run(collector, stack, mode="timeout")
    report = report_of(reply)
    made = await origin(collector, stack, rid)

    cause = cause_of(report, failed_event(report))

    assert (cause.boundary, cause.failure_kind, cause.operation_id) == (
        FailureBoundary.MODEL,
        "transport_timeout",
        rid,
    )
    assert (made["raised"], made["reply_header"]) == ([], None)


async def test_a_success_carries_the_models_recovered_observations(
    stack: Stack, collector: Collector
) -> None:
    rid, reply = await run(collector, stack, mode="ok", model_observe=2)
    report = report_of(reply)
    made = await origin(collector, stack, rid)

    assert (reply.status, reply.failure, report.failure_id) == (200, None, None)
    assert sorted(report.events) == sorted(made["observed"])


# --- The collector's rebuilt failure ---------------------------------------------------------------


@pytest.mark.parametrize("mode", FAILING_MODES)
async def test_the_collector_rebuilds_the_agents_failure_with_its_event_id(
    stack: Stack, collector: Collector, mode: str
) -> None:
    _, reply = await run(collector, stack, mode=mode)
    report = report_of(reply)

    failure = reply.failure

    assert isinstance(failure, AgentFailure)
    assert (failure.event_id, failure.cause_id) == (report.failure_id, failed_event(report).cause_id)


async def test_the_rebuilt_failures_url_has_no_query_string(stack: Stack, collector: Collector) -> None:
    _, reply = await run(collector, stack, mode="plain")

    assert reply.failure is not None
    assert reply.failure.http_details is not None
    assert (reply.failure.http_details.url, reply.failure.http_details.status) == (
        f"{stack.agent.url}/run",
        500,
    )


# --- The header bound ------------------------------------------------------------------------------

GROWN = {"mode": "ok", "model_observe": 10, "observe": 10}
"""The model's report fits the bound; with the agent's own observations it does not."""
GROWN_AND_FAILED = {**GROWN, "agent_mode": "fail"}
OMITTED_BELOW = {"mode": "ok", "model_observe": 60}
"""The model's report is already over the bound: 60 events of `servers.REASON_LEN` characters."""
OVERSIZED = {"grown": GROWN, "grown_and_failed": GROWN_AND_FAILED, "omitted_below": OMITTED_BELOW}


async def test_a_report_grown_past_the_bound_on_the_way_up_arrives_omitted(
    stack: Stack, collector: Collector
) -> None:
    rid, reply = await run(collector, stack, **GROWN)
    model_reply = await seen(collector, stack, rid)

    assert model_reply["report_omitted"] is False, "the model's own report must fit for this test"
    assert report_of(reply) == FailureReport(omitted=True)


async def test_a_report_omitted_below_stays_omitted_above(stack: Stack, collector: Collector) -> None:
    rid, reply = await run(collector, stack, **OMITTED_BELOW)
    model_reply = await seen(collector, stack, rid)

    assert model_reply["report_omitted"] is True
    assert report_of(reply) == FailureReport(omitted=True)


async def test_a_failed_reply_over_the_bound_keeps_its_status_and_body(
    stack: Stack, collector: Collector
) -> None:
    rid, reply = await run(collector, stack, **GROWN_AND_FAILED)

    assert (reply.status, reply.json()["failure_kind"]) == (500, "agent_run_error")
    assert f"{rid}: the run failed after the model answered" in reply.json()["failure_reason"]
    assert report_of(reply).omitted


@pytest.mark.parametrize("body", OVERSIZED.values(), ids=OVERSIZED.keys())
async def test_no_reply_header_from_the_agent_exceeds_the_bound(
    stack: Stack, collector: Collector, body: dict[str, Any]
) -> None:
    _, reply = await run(collector, stack, **body)

    assert reply.headers[FailureHeader.NAME.lower()]
    assert max(len(value) for _, value in reply.raw_headers) <= FailureHeader.MAX_BYTES


@pytest.mark.parametrize("body", OVERSIZED.values(), ids=OVERSIZED.keys())
async def test_no_reply_header_from_the_model_exceeds_the_bound(
    stack: Stack, collector: Collector, body: dict[str, Any]
) -> None:
    """Measured by the agent's aiohttp client on the raw header lines it received."""
    rid, _ = await run(collector, stack, **body)
    model_reply = await seen(collector, stack, rid)

    assert FailureHeader.NAME.lower() in model_reply["header_bytes"]
    assert max(model_reply["header_bytes"].values()) <= FailureHeader.MAX_BYTES


async def test_a_model_reply_over_the_bound_reaches_a_direct_caller_within_it(
    stack: Stack, collector: Collector
) -> None:
    rid = new_rid()
    payload = {"rid": rid, "mode": "ok", "observe": 60}

    reply = await collector.post(f"{stack.model.url}/v1/responses", payload, boundary="model")

    assert (reply.status, reply.report) == (200, FailureReport(omitted=True))
    assert max(len(value) for _, value in reply.raw_headers) <= FailureHeader.MAX_BYTES


@pytest.mark.parametrize("body", OVERSIZED.values(), ids=OVERSIZED.keys())
async def test_aiohttp_reads_every_reply_over_the_bound(
    stack: Stack, collector: Collector, body: dict[str, Any]
) -> None:
    """The agent's aiohttp client read the model's status (no `ClientResponseError` 400), and so did
    the collector's client the agent's."""
    rid, reply = await run(collector, stack, **body)
    model_reply = await seen(collector, stack, rid)

    assert model_reply["status"] == 200
    assert reply.status == (500 if body.get("agent_mode") == "fail" else 200)
