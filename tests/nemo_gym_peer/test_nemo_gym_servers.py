"""Real NeMo Gym 0.7.0 servers with gym-failures' one call, on real uvicorn, called through NeMo Gym's
own `ServerClient` and `raise_for_status` (`peer/gf_servers.py`, `peer/nemo_gym_servers.py`).

The agent's call sites are NeMo Gym's (`await raise_for_status(response)`), unchanged: its reply is
the agent's own failure (each instrumented hop adds its event: issue 31) caused by the resources
server's failure with the ids the resources server made (and the agent's own failure is caused by
it too when the agent raises a `RuntimeError` or a gym-failures `AgentFailure` from NeMo Gym's
error). A canary
secret in the collector's request header and one in the resources server's config reach no header,
body or log line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gym_failures.failure_records import FailureReport
from gym_failures.telemetry import SERVER_FAILURES
from tests.nemo_gym_peer.peer_process import NEMO_GYM_VERSION, run_peer

HEADER_CANARY = "CANARYhdr-7d41c0ffee"
CONFIG_CANARY = "CANARYcfg-3b9a5eed42"
CALLS = ("agent_chain", "agent_wrapped", "agent_typed", "agent_plain", "agent_ok", "resources_chain")


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work: Path = tmp_path_factory.mktemp("nemo_gym_servers")
    result: dict[str, Any] = run_peer("nemo_gym_servers", str(work), HEADER_CANARY, CONFIG_CANARY, cwd=work)
    return result


def _report(call: dict[str, Any]) -> FailureReport:
    return FailureReport.model_validate(call["report"])


def test_the_agents_reply_carries_the_resources_failure_with_its_ids(peer: dict[str, Any]) -> None:
    """NeMo Gym's `ClientResponseError` escaped the agent's handler: the agent replies with its own
    failure (the upstream failure's kind, the agent's boundary), caused by the resources server's
    failure, ids and causes as the resources server made them."""
    call = peer["agent_chain"]
    assert call["status"] == 500
    report = _report(call)
    made = peer["events"][0]  # what the resources server raised, in its own process
    assert report.failure_id is not None
    agent = report.events[report.failure_id]
    assert (agent.boundary.value, agent.failure_kind, agent.cause_id) == (
        "agent",
        "verifier_error",
        made["event_id"],
    )
    upstream = report.events[made["event_id"]]
    assert (upstream.boundary.value, upstream.failure_kind) == ("resources_server", "verifier_error")
    assert upstream.cause_id == made["cause_id"]
    judge = report.events[made["cause_id"]]
    assert (judge.boundary.value, judge.failure_kind) == ("model", "model_server_error")


def test_an_exception_raised_from_nemo_gyms_error_is_the_agents_caused_by_the_upstream(
    peer: dict[str, Any],
) -> None:
    report = _report(peer["agent_wrapped"])
    assert report.failure_id is not None
    agent = report.events[report.failure_id]
    assert agent.boundary.value == "agent"
    assert (agent.exception_type, agent.failure_reason) == (
        "RuntimeError",
        # Its type, never its text: `str()` of a foreign exception is never read (docs/decisions.md).
        "RuntimeError raised in the handler (its message is never sent: it may quote the request)",
    )
    made = peer["events"][1]
    assert agent.cause_id == made["event_id"]
    assert report.events[made["event_id"]].failure_kind == "verifier_error"
    assert report.events[made["event_id"]].cause_id == made["cause_id"]


def test_a_gym_failure_raised_from_nemo_gyms_error_is_caused_by_the_upstream_with_its_ids(
    peer: dict[str, Any],
) -> None:
    """`raise AgentFailure(...) from error`, `error` NeMo Gym's own `ClientResponseError`: the reply
    is the agent's typed failure, its cause the resources server's failure with the ids that server
    made, and that failure's cause the judge model's."""
    call = peer["agent_typed"]
    assert call["status"] == 500
    report = _report(call)
    assert report.failure_id is not None
    agent = report.events[report.failure_id]
    assert (agent.boundary.value, agent.failure_kind, agent.failure_reason) == (
        "agent",
        "agent_request_failed",
        "the verification failed",
    )
    made = peer["events"][2]
    assert agent.cause_id == made["event_id"]
    upstream = report.events[made["event_id"]]
    assert (upstream.boundary.value, upstream.failure_kind) == ("resources_server", "verifier_error")
    assert upstream.cause_id == made["cause_id"]
    judge = report.events[made["cause_id"]]
    assert (judge.boundary.value, judge.failure_kind) == ("model", "model_server_error")
    assert json.loads(call["body"])["event_id"] == report.failure_id


def test_a_plain_exception_upstream_arrives_as_the_cause_of_the_agents_failure(peer: dict[str, Any]) -> None:
    report = _report(peer["agent_plain"])
    assert report.failure_id is not None
    agent = report.events[report.failure_id]
    assert agent.boundary.value == "agent"
    assert agent.cause_id is not None
    upstream = report.events[agent.cause_id]
    assert (upstream.boundary.value, upstream.exception_type) == ("resources_server", "RuntimeError")
    assert agent.failure_kind == upstream.failure_kind


def test_nemo_gyms_exception_middleware_leaves_our_replies_alone(peer: dict[str, Any]) -> None:
    """NeMo Gym's own exception middleware is in the stack, outside ours: it sees our reply as a
    response, so the body is ours (naming the reply's failure), never its `"Hit an exception in ..."`."""
    stack = peer["agent_middleware"]
    ours = stack.index("gym_failures.nemo_gym_server.NemoGymFailureMiddleware")
    assert stack.index("BaseHTTPMiddleware(exception_handling_middleware)") < ours
    for name in ("agent_chain", "agent_plain", "resources_chain"):
        body = json.loads(peer[name]["body"])
        assert body["event_id"] == _report(peer[name]).failure_id


def test_a_success_passes_unchanged(peer: dict[str, Any]) -> None:
    call = peer["agent_ok"]
    assert call["status"] == 200
    assert call["report"] is None
    assert json.loads(call["body"])["reward"] == 1.0


def test_no_canary_reaches_a_header_a_body_or_a_log(peer: dict[str, Any]) -> None:
    texts = [json.dumps(peer[name]["headers"]) + peer[name]["body"] for name in CALLS]
    texts += [log for logs in peer["logs"].values() for log in logs.values()]
    for canary in (HEADER_CANARY, CONFIG_CANARY):
        assert [text for text in texts if canary in text] == []
    # Not vacuous: the reason quoted both, bare, and the servers' failure log lines were captured.
    resources = _report(peer["resources_chain"])
    reason = resources.events[resources.failure_id or ""].failure_reason
    assert reason == "the judge refused [REDACTED] for the caller's [REDACTED]"
    assert "request failed: verifier_error" in peer["logs"]["gf_resources"]["stderr"]
    assert "request failed: infrastructure_error (agent" in peer["logs"]["gf_agent"]["stderr"]


def test_our_failure_metric_is_on_nemo_gyms_resource_in_its_server_process(peer: dict[str, Any]) -> None:
    """The resources server's failures are counted by our instrument, on the one resource that carries
    NeMo Gym's attributes for that server, beside NeMo Gym's own `http.server.*` metrics."""
    [resource] = peer["resources_metrics"]["resource_metrics"]
    attributes = resource["resource"]["attributes"]
    assert attributes["nemo.gym.server.name"] == "gf_resources"
    assert attributes["nemo.gym.server.type"] == "resources_servers"
    assert attributes["nemo.gym.version"] == NEMO_GYM_VERSION
    metrics = {metric["name"]: metric for scope in resource["scope_metrics"] for metric in scope["metrics"]}
    points = metrics[SERVER_FAILURES]["data"]["data_points"]
    by_kind = {point["attributes"]["nemo.gym.failure_kind"]: point["value"] for point in points}
    assert by_kind["verifier_error"] >= 4  # chain, wrapped, typed (through the agent) and the direct call
    assert by_kind["infrastructure_error"] >= 1
