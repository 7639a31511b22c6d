"""The demo's chaos proxy in front of its resources server, and the agent's retries of that hop.

The end-to-end checks of what the proxy injected (ground truth, rows, summary, gate) are in
`test_demo.py`, on its shared run; these check the pieces on their own: the proxy's draws, its
record, its token, the agent's retry rule, and a run without the proxy.
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from gym_failures.demo import FaultPlan, load_fault_plan, proxy_server, run_demo
from gym_failures.demo._plan import ProxyFaults
from gym_failures.demo._resources_calls import retry_resources_call
from gym_failures.demo._serve import (
    ATTEMPT_HEADER,
    RESOURCES_BUDGET_S,
    RESOURCES_TRIES,
    ROLLOUT_HEADER,
    TOKEN_HEADER,
    TRY_HEADER,
    DemoConfig,
)
from gym_failures.failure_kinds import PROVIDER_UNAVAILABLE, VERIFIER_ERROR
from gym_failures.failure_transport import FailureHeader
from gym_failures.failures import HttpDetails, NgFailureEvent, ResourcesServerFailure
from gym_failures.proxy import INJECTED_TYPE

with warnings.catch_warnings():
    # Starlette 1.x's TestClient prefers `httpx2` and warns when it runs on `httpx` (see test_asgi).
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

TOKEN = "test-token-0123456789abcdefghijklmnop"
UNREACHABLE = "http://127.0.0.1:9"
"""An upstream nobody serves: a request the proxy forwards is answered 502 by the proxy at once."""
PLAN = FaultPlan.model_validate({"proxy": {"unavailable": 0.3, "outage": 0.2}})


def _config(run_dir: Path, plan: FaultPlan = PLAN) -> DemoConfig:
    return DemoConfig(
        run_dir=run_dir,
        seed=3,
        plan=plan,
        model_url=UNREACHABLE,
        resources_url=UNREACHABLE,
        agent_url=UNREACHABLE,
    )


def _identity(rollout: int, attempt: int = 1, try_number: int = 1) -> dict[str, str]:
    return {
        TOKEN_HEADER: TOKEN,
        ROLLOUT_HEADER: f"{rollout}:0",
        ATTEMPT_HEADER: str(attempt),
        TRY_HEADER: str(try_number),
    }


def _recorded(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "proxy.injected.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _verify_all(run_dir: Path, rollouts: list[int]) -> dict[int, int]:
    """POST /verify for each rollout through a fresh proxy; each reply's status by rollout."""
    statuses = {}
    with TestClient(proxy_server.create_app(_config(run_dir), TOKEN)) as client:
        for rollout in rollouts:
            reply = client.post("/verify", json={}, headers=_identity(rollout))
            statuses[rollout] = reply.status_code
    return statuses


# --- The proxy -----------------------------------------------------------------------------------


def test_the_proxys_faults_are_drawn_from_each_requests_identity_whatever_the_order(tmp_path: Path) -> None:
    rollouts = list(range(40))
    for name in ("forward", "backward"):
        (tmp_path / name).mkdir()
    forward = _verify_all(tmp_path / "forward", rollouts)
    backward = _verify_all(tmp_path / "backward", rollouts[::-1])
    assert forward == backward
    first, second = _recorded(tmp_path / "forward"), _recorded(tmp_path / "backward")
    assert sorted((row["rollout_id"], row["fault"]) for row in first) == sorted(
        (row["rollout_id"], row["fault"]) for row in second
    )
    assert {row["fault"] for row in first} == {"proxy.unavailable", "proxy.outage"}
    # Every request the proxy did not fault was forwarded (to an upstream nobody serves: 502).
    assert {forward[int(row["rollout_id"].partition(":")[0])] for row in first} == {503}
    assert sorted(set(forward.values())) == [502, 503]


def test_an_injected_503_is_announced_recorded_and_names_the_proxy(tmp_path: Path) -> None:
    plan = FaultPlan.model_validate({"proxy": {"outage": 1.0}})
    with TestClient(proxy_server.create_app(_config(tmp_path, plan), TOKEN)) as client:
        reply = client.post("/verify", json={}, headers=_identity(7, attempt=2, try_number=3))
    assert reply.status_code == 503
    assert reply.headers["retry-after"] == "60"
    report = FailureHeader.decode(reply.headers)
    assert report is not None
    assert report.failure_id == reply.headers["x-gym-fault-event"]
    event = report.events[report.failure_id]
    assert (event.boundary.value, event.failure_kind, event.http_status) == (
        "resources_server",
        PROVIDER_UNAVAILABLE,
        503,
    )
    assert event.failure_reason.startswith("[proxy] injected 503")
    assert event.exception_type == INJECTED_TYPE
    (row,) = _recorded(tmp_path)
    assert row == {
        **row,
        "fault": "proxy.outage",
        "server": "proxy",
        "rollout_id": "7:0",
        "attempt": 2,
        "try": 3,
        "event_id": report.failure_id,
        "route": "/verify",
        "status": 503,
        "retry_after_s": proxy_server.OUTAGE_RETRY_AFTER_S,
    }


def test_the_proxy_faults_only_verify_calls_that_carry_an_identity_and_ignores_a_callers_fault(
    tmp_path: Path,
) -> None:
    every = FaultPlan.model_validate({"proxy": {"unavailable": 1.0}})
    with TestClient(proxy_server.create_app(_config(tmp_path, every), TOKEN)) as client:
        assert client.post("/seed_session", json={}, headers=_identity(1)).status_code == 502
        assert client.post("/verify", json={}, headers={TOKEN_HEADER: TOKEN}).status_code == 502
    nothing = FaultPlan()
    forced = {**_identity(1), "X-Gym-Fault": "status; code=500"}
    with TestClient(proxy_server.create_app(_config(tmp_path, nothing), TOKEN)) as client:
        assert client.post("/verify", json={}, headers=forced).status_code == 502
    assert _recorded(tmp_path) == []


def test_the_proxy_needs_the_runs_token_on_every_route(tmp_path: Path) -> None:
    with TestClient(proxy_server.create_app(_config(tmp_path), TOKEN)) as client:
        for path in ("/health", "/_gym/health", "/_gym/journal"):
            assert client.get(path).status_code == 403, path
            assert client.get(path, headers={TOKEN_HEADER: TOKEN[:-1] + "x"}).status_code == 403, path
        wrong = {**_identity(1), TOKEN_HEADER: "x" * 40}
        assert client.post("/verify", json={}, headers=wrong).status_code == 403
        assert client.get("/_gym/health", headers={TOKEN_HEADER: TOKEN}).status_code == 200


def test_the_plans_waits_sit_on_either_side_of_the_agents_budget() -> None:
    assert proxy_server.UNAVAILABLE_RETRY_AFTER_S < RESOURCES_BUDGET_S < proxy_server.OUTAGE_RETRY_AFTER_S
    plan, names = proxy_server.proxy_plan(load_fault_plan().proxy, seed=0)
    assert names == ("unavailable", "outage")
    planned = [(fault.fault, fault.route, fault.method) for fault in plan.faults]
    assert planned == [("status", "/verify", "POST")] * 2


# --- The agent's retries -------------------------------------------------------------------------


def _refused(status: int, retry_after_s: float | None) -> ResourcesServerFailure:
    failure = ResourcesServerFailure(
        failure_kind=PROVIDER_UNAVAILABLE if status == 503 else VERIFIER_ERROR,
        failure_reason=f"answered {status}",
        http_status=status,
    )
    failure.http_details = HttpDetails(
        method="POST",
        url="http://127.0.0.1:9/verify",
        status=status,
        retry_after_s=retry_after_s,
        delivery="answered",
    )
    return failure


def _calls(*outcomes: NgFailureEvent | str) -> tuple[list[int], Any]:
    tries: list[int] = []

    async def call(try_number: int) -> str:
        tries.append(try_number)
        outcome = outcomes[len(tries) - 1]
        if isinstance(outcome, NgFailureEvent):
            raise outcome
        return outcome

    return tries, call


def _retried(call: Any) -> Any:
    return asyncio.run(retry_resources_call(call, path="/verify", stage="verification"))


def test_a_503_within_the_budget_is_retried_after_its_retry_after() -> None:
    tries, call = _calls(_refused(503, 0.01), "verified")
    assert _retried(call) == "verified"
    assert tries == [1, 2]


def test_a_retry_after_past_the_budget_ends_the_call_at_once_with_the_refusal_as_its_cause() -> None:
    refusal = _refused(503, 60.0)
    tries, call = _calls(refusal, "never")
    with pytest.raises(ResourcesServerFailure) as raised:
        _retried(call)
    assert tries == [1]
    failure = raised.value
    assert (failure.failure_kind, failure.stage) == (PROVIDER_UNAVAILABLE, "verification")
    assert failure.failure_reason.startswith("/verify was not tried again")
    assert failure.__cause__ is refusal


def test_a_call_still_refused_after_its_tries_gives_up() -> None:
    tries, call = _calls(*[_refused(503, 0.0)] * RESOURCES_TRIES)
    with pytest.raises(ResourcesServerFailure, match=f"still refused after {RESOURCES_TRIES} tries"):
        _retried(call)
    assert tries == list(range(1, RESOURCES_TRIES + 1))


def test_a_failure_that_was_processed_is_not_retried() -> None:
    refusal = _refused(500, None)
    tries, call = _calls(refusal, "never")
    with pytest.raises(ResourcesServerFailure) as raised:
        _retried(call)
    assert raised.value is refusal
    assert tries == [1]


# --- A run without the proxy ---------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux rlimits")
def test_a_run_without_the_proxy_starts_no_proxy_and_injects_none_of_its_faults(tmp_path: Path) -> None:
    run_dir = run_demo(tmp_path, rollouts=3, proxy=False)
    assert set(json.loads((run_dir / "servers.json").read_text())) == {"model", "resources", "agent"}
    assert json.loads((run_dir / "demo_config.json").read_text())["proxy_url"] is None
    summary = json.loads((run_dir / "demo.json").read_text())
    assert summary["proxy"] is False
    assert summary["fault_plan"]["proxy"] == ProxyFaults().model_dump()
    injected = (run_dir / "injected_faults.jsonl").read_text().splitlines()
    assert not [line for line in injected if json.loads(line)["server"] == "proxy"]
