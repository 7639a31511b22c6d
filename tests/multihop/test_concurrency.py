"""2,000 concurrent requests through the agent and the model, failing at random: every reply's report
holds its own request's events and no other request's.

Each request carries a marker (`rid`, fixed width, so no marker is part of another) that both servers
copy into every failure they raise or observe. It travels in the JSON body, not the query string: the
middleware treats every query value as a credential and scrubs it from the reasons it sends. The
servers yield between observations, so requests interleave inside each process.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from gym_failures import FailureBoundary, FailureReport
from gym_failures.failure_transport import FailureHeader
from tests.multihop.conftest import Stack

REQUESTS = 2000
CONNECTIONS = 100
SEED = 20260417


@dataclass(frozen=True)
class Plan:
    """How one request fails, and what its reply must then hold."""

    outcome: str
    body: dict[str, Any]
    status: int
    events: int


def plan(index: int) -> Plan:
    rng = random.Random(f"{SEED}:{index}")
    outcome = rng.choice(("recovered", "gym_failure", "plain_exception"))
    if outcome == "recovered":
        # The model recovers from 1-3 failed attempts and the agent from one of its own.
        model_observe = rng.randint(1, 3)
        return Plan(
            outcome, {"mode": "ok", "model_observe": model_observe, "observe": 1}, 200, model_observe + 1
        )
    if outcome == "gym_failure":
        # The agent's failure over the model's two-event chain, after 0-1 recovered agent failures.
        observe = rng.randint(0, 1)
        return Plan(outcome, {"mode": "provider_503", "observe": observe}, 500, 3 + observe)
    # The agent's failure over the model middleware's infrastructure_error.
    return Plan(outcome, {"mode": "plain"}, 500, 2)


@dataclass(frozen=True)
class Outcome:
    rid: str
    plan: Plan
    status: int
    report: FailureReport | None


async def _send(session: aiohttp.ClientSession, url: str, index: int) -> Outcome:
    rid = f"c{index:05d}x"
    chosen = plan(index)
    async with session.post(url, json={"rid": rid, **chosen.body}) as response:
        await response.read()
        return Outcome(rid, chosen, response.status, FailureHeader.decode(response.headers))


async def _send_all(url: str) -> list[Outcome]:
    connector = aiohttp.TCPConnector(limit=CONNECTIONS)
    # Per read, not per request: aiohttp's `total` would count the wait for one of the pool's connections.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async with asyncio.timeout(120):  # a hang fails the run instead of stalling the suite
            return await asyncio.gather(*(_send(session, url, index) for index in range(REQUESTS)))


@pytest.fixture(scope="module")
def outcomes(stack: Stack) -> list[Outcome]:
    results = asyncio.run(_send_all(f"{stack.agent.url}/run"))
    mix = {
        name: sum(o.plan.outcome == name for o in results)
        for name in ("recovered", "gym_failure", "plain_exception")
    }
    assert min(mix.values()) >= REQUESTS // 5, f"the random plan must mix every outcome: {mix}"
    return results


def test_every_reply_has_the_status_its_request_planned(outcomes: list[Outcome]) -> None:
    wrong = [(o.rid, o.plan.outcome, o.status) for o in outcomes if o.status != o.plan.status]
    assert not wrong


def _carries_marker(report: FailureReport, event_id: str, rid: str) -> bool:
    """Whether the event carries `rid`: in its reason, or (a plain exception the middleware wrapped,
    whose text is never read, so its reason holds only its type) in the reason of the event it caused."""
    event = report.events[event_id]
    if rid in event.failure_reason:
        return True
    return event.exception_type is not None and any(
        other.cause_id == event_id and rid in other.failure_reason for other in report.events.values()
    )


def test_every_event_in_every_reply_carries_its_own_requests_marker(outcomes: list[Outcome]) -> None:
    foreign = [
        (o.rid, event.event_id, event.operation_id, event.failure_reason[:40])
        for o in outcomes
        if o.report is not None
        for event in o.report.events.values()
        if not _carries_marker(o.report, event.event_id, o.rid) or event.operation_id not in (None, o.rid)
    ]
    assert not foreign


def test_every_reply_holds_every_event_its_request_made(outcomes: list[Outcome]) -> None:
    wrong = [
        (o.rid, o.plan.outcome, None if o.report is None else len(o.report.events))
        for o in outcomes
        if o.report is None or o.report.omitted or len(o.report.events) != o.plan.events
    ]
    assert not wrong


def test_every_failed_reply_names_its_own_agents_failure(outcomes: list[Outcome]) -> None:
    wrong: list[tuple[str, str, str | None]] = []
    for o in outcomes:
        assert o.report is not None
        failed = o.report.events.get(o.report.failure_id) if o.report.failure_id else None
        if o.plan.status == 200:
            if failed is not None:
                wrong.append((o.rid, o.plan.outcome, failed.event_id))
        elif failed is None or (failed.boundary, failed.operation_id) != (FailureBoundary.AGENT, o.rid):
            wrong.append((o.rid, o.plan.outcome, o.report.failure_id))
    assert not wrong
