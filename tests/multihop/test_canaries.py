"""Canary secrets sent in a request's `Authorization` header (Bearer), `Proxy-Authorization` (Basic),
`X-Api-Key`, a quoted cookie and the query string, a provider key the model server registered, or one
repeated by a provider SDK's error, never appear in a reply header, a reply body, a saved row, a
rebuilt failure or a server's log line: a body the app builds and serializes itself from the records
(`BaseEpisodeResponse(...).model_dump()`) among them.

The canary requests run once per module against their own servers, through an aiohttp and an httpx
collector; the servers are stopped before their logs (stdout and stderr: uvicorn's log and the
`gym_failures` logger at DEBUG) are read. uvicorn's access log is off (see `servers.main`): it prints
request lines with their query strings, which is uvicorn's own log, not one a failure produces.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import pytest

from gym_failures import FailureReport, NgFailureEvent
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure
from gym_failures.failure_transport import FailureReportRow, StreamFailureReportReader
from tests.multihop.collectors import AiohttpCollector, Collector, HttpxCollector
from tests.multihop.conftest import Stack, running_stack
from tests.multihop.servers import PROVIDER_KEY_CANARY, SDK_CANARY

AUTH_CANARY = "sk-CANARY-hdr-1f3a"
QUERY_CANARY = "CANARYQUERYTOKEN77"
BASIC_CANARY = "basicPasswordCANARY31"
COOKIE_CANARY = "cookieValueCANARY8842"
API_KEY_CANARY = "apiKeyHeaderCANARY2207"
CANARIES = (
    AUTH_CANARY, QUERY_CANARY, SDK_CANARY, BASIC_CANARY, COOKIE_CANARY, API_KEY_CANARY, PROVIDER_KEY_CANARY
)  # fmt: skip
HEADERS = {
    "Authorization": f"Bearer {AUTH_CANARY}",
    "X-Api-Key": API_KEY_CANARY,
    "Proxy-Authorization": "Basic " + base64.b64encode(f"alice:{BASIC_CANARY}".encode()).decode(),
    "Cookie": f'sid="{COOKIE_CANARY}"; theme=dark',
}
PARAMS = {"api_key": QUERY_CANARY, "trace": "t-4f2a9c"}


@dataclass(frozen=True)
class Scenario:
    server: str
    path: str
    body: dict[str, Any]
    streamed: bool = False


SCENARIOS = {
    "model exception quoting the request": Scenario("agent", "/run", {"mode": "leak"}),
    "model SDK error, adapted": Scenario("agent", "/run", {"mode": "sdk"}),
    "model SDK error, unhandled": Scenario("agent", "/run", {"mode": "sdk_unhandled"}),
    "model failure quoting credential values": Scenario("agent", "/run", {"mode": "quote"}),
    "model provider 503": Scenario("agent", "/run", {"mode": "provider_503"}),
    "model timeout": Scenario("agent", "/run", {"mode": "timeout", "timeout": 0.3}),
    "agent exception quoting the request": Scenario("agent", "/run", {"agent_mode": "leak"}),
    "agent failure quoting credential values": Scenario("agent", "/run", {"agent_mode": "quote"}),
    "episode body the app serializes itself": Scenario("agent", "/run", {"agent_mode": "episode"}),
    "episode body made without validation": Scenario("agent", "/run", {"agent_mode": "episode_constructed"}),
    "success with recovered failures": Scenario(
        "agent", "/run", {"mode": "ok", "model_observe": 1, "observe": 1}
    ),
    "stream consumed, failure quoting credential values": Scenario("agent", "/run-stream", {"mode": "quote"}),
    "stream relayed, failure quoting credential values": Scenario("agent", "/relay", {"mode": "quote"}, True),
    "stream relayed, provider failure": Scenario("agent", "/relay", {"mode": "fail"}, True),
    "direct: model exception quoting the request": Scenario("model", "/v1/responses", {"mode": "leak"}),
    "direct: model SDK error, unhandled": Scenario("model", "/v1/responses", {"mode": "sdk_unhandled"}),
    "direct: model failure quoting credential values": Scenario("model", "/v1/responses", {"mode": "quote"}),
    "direct: model stream quoting credential values": Scenario(
        "model", "/v1/responses/stream", {"mode": "quote"}, True
    ),
}


@dataclass
class Seen:
    """Everything one canary request produced on the collector's side."""

    where: str
    headers: str
    body: bytes
    report: FailureReport | None
    failure: NgFailureEvent | None
    episode_failure: EpisodeFailure | None = None
    """The `EpisodeFailure` of an episode body, which a collector saves as the row's `failure`."""

    @property
    def row(self) -> str:
        fields = FailureReportRow.fields(self.report) if self.report is not None else {}
        if self.episode_failure is not None:
            fields["failure"] = self.episode_failure.model_dump(mode="json")
        return json.dumps(fields)

    @property
    def failure_text(self) -> str:
        if self.failure is None:
            return ""
        return " ".join((str(self.failure), repr(self.failure), repr(self.failure.http_details)))


@dataclass(repr=False)  # a failing test's report shows its own findings, not every log line
class CanaryRun:
    seen: list[Seen] = field(default_factory=list)
    raw_texts: list[str] = field(default_factory=list)
    """What the servers put into their failures before any redaction."""
    logs: dict[str, str] = field(default_factory=dict)


async def _request(collector: Collector, stack: Stack, name: str, scenario: Scenario, index: int) -> Seen:
    base = stack.agent.url if scenario.server == "agent" else stack.model.url
    url = f"{base}{scenario.path}"
    body = {"rid": f"k{index:03d}{collector.name}", **scenario.body}
    where = f"{name} ({collector.name})"
    if scenario.streamed:
        streamed = await collector.stream(url, body, params=PARAMS, headers=HEADERS)
        reader = StreamFailureReportReader()
        for chunk in streamed.chunks:
            reader.feed(chunk)
        headers = b"\n".join(k + b": " + v for k, v in streamed.raw_headers).decode("latin-1")
        return Seen(where, headers, streamed.body, reader.finish(), None)
    reply = await collector.post(url, body, params=PARAMS, headers=HEADERS, boundary=scenario.server)
    headers = b"\n".join(k + b": " + v for k, v in reply.raw_headers).decode("latin-1")
    if str(scenario.body.get("agent_mode", "")).startswith("episode"):
        # A 200 episode body: its report and envelope are in the body, as a collector reads them.
        episode = BaseEpisodeResponse.model_validate_json(reply.body)
        return Seen(where, headers, reply.body, episode.failure_report, reply.failure, episode.failure)
    return Seen(where, headers, reply.body, reply.report, reply.failure)


async def _send_canaries(stack: Stack, run: CanaryRun) -> None:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        httpx.AsyncClient(timeout=60) as client,
    ):
        collectors: list[Collector] = [AiohttpCollector(session), HttpxCollector(client)]
        for collector in collectors:
            for index, (name, scenario) in enumerate(SCENARIOS.items()):
                run.seen.append(await _request(collector, stack, name, scenario, index))
        for server in (stack.model, stack.agent):
            run.raw_texts.extend(json.loads(await collectors[0].get(f"{server.url}/_test/raw-texts")))


@pytest.fixture(scope="module")
def canary_run(tmp_path_factory: pytest.TempPathFactory) -> CanaryRun:
    run = CanaryRun()
    with running_stack(tmp_path_factory.mktemp("canaries")) as stack:
        asyncio.run(_send_canaries(stack, run))
    # Stopped: every line either server will ever log is in its file.
    run.logs = {server.name: server.log_text() for server in (stack.model, stack.agent)}
    return run


def _leaks(text: str | bytes) -> list[str]:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [canary for canary in CANARIES if canary in text]


def test_the_servers_quoted_every_canary_in_a_failure(canary_run: CanaryRun) -> None:
    """The control: without redaction, each canary would have reached a failure."""
    assert sorted({c for text in canary_run.raw_texts for c in _leaks(text)}) == sorted(CANARIES)


def test_every_canary_request_was_answered(canary_run: CanaryRun) -> None:
    assert len(canary_run.seen) == 2 * len(SCENARIOS)
    assert all(seen.report is not None for seen in canary_run.seen), "each scenario reports a failure"


def test_no_canary_in_any_reply_header(canary_run: CanaryRun) -> None:
    assert [(seen.where, _leaks(seen.headers)) for seen in canary_run.seen if _leaks(seen.headers)] == []


def test_no_canary_in_any_reply_body(canary_run: CanaryRun) -> None:
    assert [(seen.where, _leaks(seen.body)) for seen in canary_run.seen if _leaks(seen.body)] == []


def test_no_canary_in_any_saved_row(canary_run: CanaryRun) -> None:
    assert [(seen.where, _leaks(seen.row)) for seen in canary_run.seen if _leaks(seen.row)] == []


def test_no_canary_in_any_rebuilt_failure(canary_run: CanaryRun) -> None:
    leaked = [
        (seen.where, _leaks(seen.failure_text)) for seen in canary_run.seen if _leaks(seen.failure_text)
    ]
    assert leaked == []


def test_the_logs_record_every_failed_request(canary_run: CanaryRun) -> None:
    """The control: the log files hold what the servers logged, so their lines are the ones searched."""
    logs = "".join(canary_run.logs.values())
    failed = [seen.failure.event_id for seen in canary_run.seen if seen.failure is not None]
    assert failed
    assert [event_id for event_id in failed if event_id not in logs] == []


def test_no_canary_in_any_log_line(canary_run: CanaryRun) -> None:
    leaked = [
        (name, line[:200])
        for name, log in canary_run.logs.items()
        for line in log.splitlines()
        if _leaks(line)
    ]
    assert leaked == []
