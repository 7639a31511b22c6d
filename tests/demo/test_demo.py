"""The demo gym end to end: real servers, real faults, and the rows the collector saved about them.

One reduced run (40 rollouts, a plan with high rates, a fixed seed) is shared by the checks of what it
wrote. The faults each server injected (`injected_faults.jsonl`), the chaos proxy in front of the
resources server included, are the ground truth; the rows must show every one of them under the right
kind, boundary, stage and class, and nothing else. It runs in
a hostile environment: proxy variables that point at a dead port and API keys the scripted demo must
not hand to any server.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from starlette.exceptions import StarletteDeprecationWarning
from starlette.types import ASGIApp

from gym_failures import gate as acceptance
from gym_failures.collection import read_rows
from gym_failures.demo import (
    FaultPlan,
    agent_server,
    launcher,
    load_fault_plan,
    model_server,
    proxy_server,
    run_demo,
)
from gym_failures.demo import resources_server as resources_server_module
from gym_failures.demo.__main__ import main as demo_main
from gym_failures.demo._plan import draw
from gym_failures.demo._responses import SseDecoder, extract_final_answer, message_text, output_text
from gym_failures.demo._serve import API_KEY_ENV, TOKEN_ENV, TOKEN_HEADER, DemoConfig, command_allowed
from gym_failures.demo.model_server import scripted_judge, scripted_policy
from gym_failures.failure_kinds import (
    EMPTY_ANSWER,
    JUDGE_FAILED,
    JUDGE_UNPARSEABLE,
    MODEL_POLICY_RESPONSE_TIMEOUT,
    MODEL_SERVER_ERROR,
    MODEL_TRANSPORT_ERROR,
    PROVIDER_COMMAND_TIMEOUT,
    PROVIDER_OOM_KILLED,
    PROVIDER_QUOTA_EXHAUSTED,
    PROVIDER_REQUEST_FAILED,
    PROVIDER_UNAVAILABLE,
    TRANSPORT_PEER_DROP,
    TRUNCATED_ANSWER,
    VERIFIER_ERROR,
    FailureClass,
    classify_failure,
    quota_reset_text,
)
from gym_failures.failure_records import FailureBoundary
from gym_failures.failure_transport import FailureHeader
from gym_failures.proxy import INJECTED_TYPE
from gym_failures.reporting.summary import summarize
from gym_failures.telemetry import CollectionProgress

with warnings.catch_warnings():
    # Starlette 1.x's TestClient prefers `httpx2` and warns when it runs on `httpx` (see test_asgi).
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the sandbox needs Linux rlimits"
)

ROLLOUTS = 40
SEED = 0

TOKEN = "test-token-0123456789abcdefghijklmnop"
"""The run's token wherever a test chooses it (the launcher makes a random one)."""
DEAD_PROXY = "http://127.0.0.1:9"
"""A proxy nobody serves: a loopback call sent through it never arrives."""
PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
API_KEYS = {
    "GYM_DEMO_MODEL_API_KEY": "sk-demo-model-key-0123456789",
    "OPENAI_API_KEY": "sk-openai-0123456789",
}

# High rates, so that 40 rollouts meet every fault; with this seed each appears at least once. The
# margins (10 s for a scripted reply, 10 s for `python3 -c`) are hang guards: a loaded machine adds no
# fault of its own (2 s and 3 s left it too little room). A slow response and a sandbox timeout cost
# their limit each, in parallel (16 at once).
HIGH_RATE_PLAN: dict[str, Any] = {
    "model": {
        "server_error": 0.08,
        "rate_limit": 0.08,
        "dropped_connection": 0.07,
        "stream_cut": 0.1,
        "slow_response": 0.05,
        "empty_answer": 0.06,
        "truncated_answer": 0.06,
    },
    "sandbox": {"oom": 0.2, "timeout": 0.12},
    "resources_server": {"verifier_exception": 0.1, "judge_unparseable": 0.2},
    "proxy": {"unavailable": 0.25, "outage": 0.1},
    "limits": {
        "policy_timeout_s": 10.0,
        "slow_response_s": 12.0,
        "sandbox_memory_mib": 256,
        "sandbox_wall_s": 10.0,
    },
}

E = FailureClass.EVALUATION
M = FailureClass.MODEL


@dataclass(frozen=True)
class Expected:
    kind: str
    boundary: str
    stage: str | None
    failure_class: FailureClass
    ends_attempt: bool
    """Whether the fault always ends its attempt (else a retry usually recovers from it)."""
    failure_stage: str | None = None
    """The stage of the attempt's failure when the fault ends it, if not the injected event's."""


EXPECTED: dict[str, Expected] = {
    "model.server_error": Expected(MODEL_SERVER_ERROR, "model", "agent", E, ends_attempt=False),
    "model.rate_limit": Expected(PROVIDER_QUOTA_EXHAUSTED, "model", "agent", E, ends_attempt=False),
    "model.dropped_connection": Expected(TRANSPORT_PEER_DROP, "model", "agent", E, ends_attempt=False),
    "model.stream_cut": Expected(MODEL_TRANSPORT_ERROR, "model", "agent", E, ends_attempt=False),
    "model.slow_response": Expected(MODEL_POLICY_RESPONSE_TIMEOUT, "model", "agent", M, ends_attempt=True),
    "sandbox.oom": Expected(PROVIDER_OOM_KILLED, "sandbox", "agent", E, ends_attempt=True),
    "sandbox.timeout": Expected(PROVIDER_COMMAND_TIMEOUT, "sandbox", "agent", E, ends_attempt=True),
    "resources_server.verifier_exception": Expected(
        VERIFIER_ERROR, "resources_server", "verification", E, ends_attempt=True
    ),
    "resources_server.judge_unparseable": Expected(
        JUDGE_UNPARSEABLE, "resources_server", "verification", E, ends_attempt=True
    ),
    # The proxy's 503 names no stage (the proxy cannot know it); the agent's failure when it gives up
    # on /verify does, with the proxy's event as its cause.
    "proxy.unavailable": Expected(PROVIDER_UNAVAILABLE, "resources_server", None, E, ends_attempt=False),
    "proxy.outage": Expected(
        PROVIDER_UNAVAILABLE, "resources_server", None, E, ends_attempt=True, failure_stage="verification"
    ),
}
JUDGE_FAILURE_CAUSES = {MODEL_SERVER_ERROR, PROVIDER_QUOTA_EXHAUSTED, TRANSPORT_PEER_DROP}
"""What a judge call can fail of (the model faults injected into judge calls): `judge_failed`."""
ANSWER_FAULTS = {"model.empty_answer": EMPTY_ANSWER, "model.truncated_answer": TRUNCATED_ANSWER}
TRANSIENT_KINDS = {expected.kind for expected in EXPECTED.values() if not expected.ends_attempt}


@dataclass
class Run:
    path: Path
    successes: list[dict[str, Any]]
    failures: list[dict[str, Any]]
    injected: list[dict[str, Any]]
    server_environments: dict[str, dict[str, str]]
    """Each server's environment, read from /proc while the run collected."""

    def rows_of(self, rollout_id: str, attempt: int) -> list[dict[str, Any]]:
        return [
            row
            for row in self.successes + self.failures
            if row["rollout_id"] == rollout_id and row["attempt"] == attempt
        ]


def _environment(pid: int) -> dict[str, str]:
    """The environment process `pid` started with."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode(errors="replace").partition("=")[::2] for entry in entries if entry)


def _environment_recorder(
    out_dir: Path,
) -> tuple[dict[str, dict[str, str]], Callable[[CollectionProgress], None]]:
    """A progress callback that reads every server's environment the first time it is called, while
    the servers run; and where it puts them."""
    seen: dict[str, dict[str, str]] = {}

    def on_progress(progress: CollectionProgress) -> None:
        if not seen:
            (servers_file,) = out_dir.glob("*/servers.json")
            for name, server in json.loads(servers_file.read_text()).items():
                seen[name] = _environment(server["pid"])

    return seen, on_progress


def _hostile_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in PROXY_VARIABLES:
        monkeypatch.setenv(variable, DEAD_PROXY)
    for variable in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in API_KEYS.items():
        monkeypatch.setenv(variable, value)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    base = tmp_path_factory.mktemp("demo")
    plan = base / "plan.json"
    plan.write_text(json.dumps(HIGH_RATE_PLAN))
    environments, on_progress = _environment_recorder(base / "runs")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _hostile_environment(monkeypatch)
        monkeypatch.setattr(launcher, "_new_token", lambda: TOKEN)
        run_dir = run_demo(
            base / "runs",
            rollouts=ROLLOUTS,
            concurrency=16,
            fault_plan=plan,
            seed=SEED,
            on_progress=on_progress,
        )
    return Run(
        path=run_dir,
        successes=list(read_rows(run_dir / "rollouts.jsonl")),
        failures=list(read_rows(run_dir / "rollouts_failures.jsonl")),
        injected=[json.loads(line) for line in (run_dir / "injected_faults.jsonl").read_text().splitlines()],
        server_environments=environments,
    )


def _events(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    events: dict[str, dict[str, Any]] = row.get("_ng_failure_events") or {}
    return events


def _alive(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return b"gym_failures.demo" in cmdline  # a reused pid is some other program


# --- What the run wrote --------------------------------------------------------------------------


def test_run_directory_holds_every_file(demo_run: Run) -> None:
    names = {path.name for path in demo_run.path.iterdir()}
    assert {
        "tasks.jsonl",
        "rollouts.jsonl",
        "rollouts_failures.jsonl",
        "rollouts.manifest.json",
        "injected_faults.jsonl",
        "model.log",
        "resources.log",
        "agent.log",
        "proxy.log",
        "servers.json",
        "demo.json",
    } <= names
    assert len((demo_run.path / "tasks.jsonl").read_text().splitlines()) == ROLLOUTS


def test_every_fault_of_the_plan_was_injected(demo_run: Run) -> None:
    injected = {row["fault"] for row in demo_run.injected}
    assert injected == set(FaultPlan.model_validate(HIGH_RATE_PLAN).fault_names())


def test_every_rollout_has_exactly_one_final_outcome(demo_run: Run) -> None:
    outcomes: Counter[str] = Counter()
    attempts: defaultdict[str, list[int]] = defaultdict(list)
    for row in demo_run.successes:
        outcomes[row["rollout_id"]] += 1
        attempts[row["rollout_id"]].append(row["attempt"])
    for row in demo_run.failures:
        outcomes[row["rollout_id"]] += row["final"] is True
        attempts[row["rollout_id"]].append(row["attempt"])
    assert outcomes == Counter({f"{index}:0": 1 for index in range(ROLLOUTS)})
    for rollout_id, numbers in attempts.items():
        assert sorted(numbers) == list(range(1, len(numbers) + 1)), rollout_id


def test_failure_rows_have_no_reward_and_successes_hold_no_failure(demo_run: Run) -> None:
    assert demo_run.failures, "the plan's faults must end some attempts"
    assert all("reward" not in row and "result" not in row for row in demo_run.failures)
    for row in demo_run.successes:
        assert row["reward"] in (0.0, 1.0)
        assert row["result"]["verification"]["verdict"] in ("correct", "incorrect")
        # A success keeps only what its retries recovered from, never a failure of its own.
        assert row.get("_ng_failure_id") is None
        assert {event["failure_kind"] for event in _events(row).values()} <= TRANSIENT_KINDS


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_each_injected_fault_is_saved_under_its_kind_boundary_stage_and_class(
    demo_run: Run, fault: str
) -> None:
    expected = EXPECTED[fault]
    injections = [row for row in demo_run.injected if row["fault"] == fault]
    assert injections
    for injection in injections:
        rows = demo_run.rows_of(injection["rollout_id"], injection["attempt"])
        assert len(rows) == 1, injection
        (row,) = rows
        events = _events(row)
        # A model call made while judging is the verification's, not the agent's.
        stage = "verification" if injection.get("call") == "judge" else expected.stage
        wanted = (expected.kind, expected.boundary, stage)
        if "event_id" in injection:
            # The injecting server made the event: the very same id arrived in the row.
            assert injection["event_id"] in events, (injection, events)
            matching = [events[injection["event_id"]]]
        else:
            matching = [
                event
                for event in events.values()
                if (event["failure_kind"], event["boundary"], event.get("stage")) == wanted
            ]
        assert matching, (injection, events)
        for event in matching:
            assert (event["failure_kind"], event["boundary"], event.get("stage")) == wanted
            assert classify_failure(event["failure_kind"], event.get("stage"), event.get("http_status")) is (
                expected.failure_class
            )
        if expected.ends_attempt:
            assert row["failure"]["failure_kind"] == expected.kind
            assert row["failure"]["stage"] == (expected.failure_stage or expected.stage)
            assert events[row["_ng_failure_id"]]["failure_kind"] == expected.kind


def test_injected_transient_faults_were_also_recovered_on_success_rows(demo_run: Run) -> None:
    recovered = {event["failure_kind"] for row in demo_run.successes for event in _events(row).values()}
    assert recovered == TRANSIENT_KINDS


def test_rate_limits_name_their_quota_reset(demo_run: Run) -> None:
    reasons = [
        event["failure_reason"]
        for row in demo_run.successes + demo_run.failures
        for event in _events(row).values()
        if event["failure_kind"] == PROVIDER_QUOTA_EXHAUSTED
    ]
    assert reasons
    assert all(event_reason and quota_reset_text(event_reason) for event_reason in reasons)
    assert all(
        event.get("http_status") == 429
        for row in demo_run.successes + demo_run.failures
        for event in _events(row).values()
        if event["failure_kind"] == PROVIDER_QUOTA_EXHAUSTED
    )


def test_an_oom_is_a_real_one_with_its_exit_code(demo_run: Run) -> None:
    ooms = [
        event
        for row in demo_run.failures
        for event in _events(row).values()
        if event["failure_kind"] == PROVIDER_OOM_KILLED
    ]
    assert ooms
    for event in ooms:
        assert event["details"]["exit_code"] == 1  # CPython's MemoryError exit, under RLIMIT_AS
        assert "RLIMIT_AS=256 MiB" in event["details"]["provider_status_reason"]


def test_policy_answer_faults_are_results_the_gate_can_classify(demo_run: Run) -> None:
    seen: set[str] = set()
    for injection in demo_run.injected:
        gate_kind = ANSWER_FAULTS.get(injection["fault"])
        if gate_kind is None:
            continue
        rows = demo_run.rows_of(injection["rollout_id"], injection["attempt"])
        if not rows or "result" not in rows[0]:
            continue  # a later fault of the same attempt ended it
        result = rows[0]["result"]
        response = result["response"]
        assert result["reward"] == 0.0
        assert result["verification"]["extracted_answer"] is None
        if gate_kind == TRUNCATED_ANSWER:
            assert response["status"] == "incomplete"
            assert response["incomplete_details"]["reason"] == "max_output_tokens"
        else:
            assert response["status"] == "completed"
            assert output_text(response) == ""
        assert classify_failure(gate_kind) is FailureClass.MODEL
        seen.add(gate_kind)
    assert seen == {EMPTY_ANSWER, TRUNCATED_ANSWER}


def test_a_failed_judge_call_keeps_its_cause_from_the_model_server(demo_run: Run) -> None:
    """model server -> resources server -> agent -> collector: the cause survives every hop."""
    judged = [row for row in demo_run.failures if row["failure"]["failure_kind"] == JUDGE_FAILED]
    assert judged
    for row in judged:
        events = _events(row)
        failure = events[row["_ng_failure_id"]]
        assert (failure["boundary"], failure.get("stage")) == ("resources_server", "verification")
        cause = events[failure["cause_id"]]
        assert (cause["boundary"], cause.get("stage")) == ("model", "verification")
        assert cause["failure_kind"] in JUDGE_FAILURE_CAUSES
        assert classify_failure(failure["failure_kind"], failure["stage"]) is FailureClass.EVALUATION


def _proxy_injections(run: Run, fault: str) -> list[dict[str, Any]]:
    return [injection for injection in run.injected if injection["fault"] == fault]


def test_the_proxys_503s_are_failures_of_the_resources_server_hop_that_name_the_proxy(demo_run: Run) -> None:
    """proxy -> agent -> collector: the row holds the very event the proxy announced and wrote down."""
    injections = [injection for injection in demo_run.injected if injection["server"] == "proxy"]
    assert {injection["fault"] for injection in injections} == {"proxy.unavailable", "proxy.outage"}
    for injection in injections:
        assert (injection["route"], injection["status"]) == ("/verify", 503)
        (row,) = demo_run.rows_of(injection["rollout_id"], injection["attempt"])
        event = _events(row)[injection["event_id"]]
        assert (event["boundary"], event["failure_kind"], event["http_status"]) == (
            "resources_server",
            PROVIDER_UNAVAILABLE,
            503,
        )
        assert event["failure_reason"].startswith("[proxy] injected 503")
        assert event["exception_type"] == INJECTED_TYPE


def test_a_proxy_503_with_a_short_retry_after_is_retried_and_recovered_from(demo_run: Run) -> None:
    recovered = 0
    for injection in _proxy_injections(demo_run, "proxy.unavailable"):
        assert injection["retry_after_s"] == proxy_server.UNAVAILABLE_RETRY_AFTER_S
        (row,) = demo_run.rows_of(injection["rollout_id"], injection["attempt"])
        if "failure" in row:
            continue  # a later fault of the same attempt ended it
        # Recovered, not tainted: the success names no failure of its own.
        assert row.get("_ng_failure_id") is None
        recovered += 1
    assert recovered


def test_a_proxy_503_past_the_agents_budget_fails_the_attempt_with_the_proxy_at_its_root(
    demo_run: Run,
) -> None:
    outages = _proxy_injections(demo_run, "proxy.outage")
    assert outages
    for injection in outages:
        assert injection["retry_after_s"] == proxy_server.OUTAGE_RETRY_AFTER_S
        (row,) = demo_run.rows_of(injection["rollout_id"], injection["attempt"])
        events = _events(row)
        failure = events[row["_ng_failure_id"]]
        assert (failure["boundary"], failure.get("stage")) == ("resources_server", "verification")
        assert failure["failure_reason"].startswith("/verify was not tried again")
        # The chain ends at the proxy's event.
        assert failure["cause_id"] == injection["event_id"]
        assert events[injection["event_id"]].get("cause_id") is None
        # Not the policy's doing: the collector tries the rollout again.
        assert row["failure"]["terminal"] is False
        assert row["final"] or demo_run.rows_of(injection["rollout_id"], injection["attempt"] + 1)


def test_the_summary_and_the_gate_count_the_proxys_failures_at_the_resources_server(demo_run: Run) -> None:
    files = [demo_run.path / "rollouts.jsonl", demo_run.path / "rollouts_failures.jsonl"]
    summary = summarize(files)
    outages = len(_proxy_injections(demo_run, "proxy.outage"))
    assert summary.injected_failure_rows == outages
    assert summary.tainted_success_rows == 0
    roots = {
        (root.root_kind, root.root_boundary, root.root_http_status, root.kind): root.count
        for root in summary.by_root_kind
    }
    assert roots[(PROVIDER_UNAVAILABLE, "resources_server", 503, PROVIDER_UNAVAILABLE)] == outages
    coverage = acceptance.read_coverage(files, ROLLOUTS)
    assert coverage.tainted == 0
    verdict = acceptance.check(coverage, acceptance.GateThresholds())
    assert not [reason for reason in verdict.reasons if "tainted" in reason]


def test_no_failure_without_an_injected_fault(demo_run: Run) -> None:
    """Every failure event in the rows is explained by a fault injected into that same attempt."""
    planned: defaultdict[tuple[str, int], set[str]] = defaultdict(set)
    for injection in demo_run.injected:
        expected = EXPECTED.get(injection["fault"])
        if expected is not None:
            planned[(injection["rollout_id"], injection["attempt"])].add(expected.kind)
            if injection.get("call") == "judge":
                planned[(injection["rollout_id"], injection["attempt"])].add(JUDGE_FAILED)
    for row in demo_run.successes + demo_run.failures:
        kinds = {event["failure_kind"] for event in _events(row).values()}
        assert kinds <= planned[(row["rollout_id"], row["attempt"])], row


def test_server_logs_hold_no_traceback_or_warning(demo_run: Run) -> None:
    """Injected faults are logged as failures; a traceback or a warning is something else."""
    for name in ("model", "resources", "proxy", "agent"):
        text = (demo_run.path / f"{name}.log").read_text()
        assert "Started server process" in text
        assert "Traceback" not in text, name
        assert "Warning" not in text, name


def test_no_server_or_sandbox_process_is_left_behind(demo_run: Run) -> None:
    servers = json.loads((demo_run.path / "servers.json").read_text())
    assert set(servers) == {"model", "resources", "proxy", "agent"}
    assert [name for name, server in servers.items() if _alive(server["pid"])] == []
    left = []
    for proc in Path("/proc").iterdir():
        try:
            if os.readlink(proc / "cwd").startswith(str(demo_run.path / "sandbox")):
                left.append(proc.name)
        except OSError:
            continue  # not a process, gone, or not ours to read
    assert left == []


def test_the_run_ignored_dead_proxies_and_gave_no_server_an_api_key(demo_run: Run) -> None:
    """The run above had every proxy variable at a dead port: it finished, so neither the launcher's
    readiness checks nor the servers' own loopback calls went through a proxy. Its scripted policy
    needs no API key, so no server was handed one, though the launcher's environment held two."""
    assert set(demo_run.server_environments) == {"model", "resources", "proxy", "agent"}
    for name, environment in demo_run.server_environments.items():
        assert environment["http_proxy"] == DEAD_PROXY, name
        assert set(API_KEY_ENV) & set(environment) == set(), name
        assert environment[TOKEN_ENV] == TOKEN, name


def test_the_runs_token_is_in_no_file_of_the_run(demo_run: Run) -> None:
    files = [path for path in demo_run.path.rglob("*") if path.is_file()]
    assert "demo_config.json" in {path.name for path in files}
    assert [path.name for path in files if TOKEN.encode() in path.read_bytes()] == []


# --- Who may call the servers --------------------------------------------------------------------


def _config(run_dir: Path) -> DemoConfig:
    unused = "http://127.0.0.1:9"
    return DemoConfig(
        run_dir=run_dir, seed=0, plan=FaultPlan(), model_url=unused, resources_url=unused, agent_url=unused
    )


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


SERVER_APPS: dict[str, tuple[Callable[[DemoConfig, str], ASGIApp], str]] = {
    "model": (model_server.create_app, "/v1/responses"),
    "resources": (resources_server_module.create_app, "/sandbox/run"),
    "agent": (agent_server.create_app, "/run"),
}


@pytest.mark.parametrize("name", sorted(SERVER_APPS))
def test_every_endpoint_refuses_a_caller_without_the_runs_token_or_a_json_body(
    tmp_path: Path, name: str
) -> None:
    create_app, path = SERVER_APPS[name]
    body = {"session_id": "sess_x", "command": "id", "input": "What is 2 + 2?"}
    with TestClient(create_app(_config(tmp_path), TOKEN)) as client:
        for headers in (
            {},
            {TOKEN_HEADER: TOKEN[:-1] + "x"},
            {"Authorization": _basic("demo", TOKEN[:-1] + "x")},
            {"Authorization": f"Bearer {TOKEN}"},
        ):
            assert client.get("/health", headers=headers).status_code == 403, headers
            assert client.post(path, json=body, headers=headers).status_code == 403, headers
        assert client.get("/health", headers={TOKEN_HEADER: TOKEN}).status_code == 200
        # The collector's form: the token as the password of Basic credentials.
        assert client.get("/health", headers={"Authorization": _basic("demo", TOKEN)}).status_code == 200
        # A body a web page could send anywhere without asking (text/plain) is refused.
        plain = {TOKEN_HEADER: TOKEN, "content-type": "text/plain"}
        assert client.post(path, content=json.dumps(body), headers=plain).status_code == 415


def test_the_sandbox_runs_only_allowed_commands_even_for_a_caller_with_the_token(tmp_path: Path) -> None:
    proof = tmp_path / "proof"
    refused = [
        "id",
        f"touch {proof}",
        f'python3 -c "print(6 * 7)"; touch {proof}',
        f'python3 -c "print(6 * 7)"\ntouch {proof}',
        f'python3 -c "print(6 * 7)" && touch {proof}',
        f'python3 -c "print(6 * 7)" > {proof}',
        f'python3 -c "print($(touch {proof}))"',
        f'python3 -c "print(`touch {proof}`)"',
        f"python3 -c \"print(open('{proof}', 'w'))\"",
    ]
    auth = {TOKEN_HEADER: TOKEN}
    with TestClient(resources_server_module.create_app(_config(tmp_path), TOKEN)) as client:
        seeded = client.post("/seed_session", json={"task": {"expected_answer": 42}}, headers=auth)
        session_id = seeded.json()["session_id"]
        for command in refused:
            reply = client.post(
                "/sandbox/run", json={"session_id": session_id, "command": command}, headers=auth
            )
            assert reply.status_code == 500, command
            report = FailureHeader.decode(reply.headers)
            assert report is not None
            assert report.failure_id is not None
            failure = report.events[report.failure_id]
            assert (failure.failure_kind, failure.boundary, failure.stage) == (
                PROVIDER_REQUEST_FAILED,
                FailureBoundary.SANDBOX,
                "agent",
            ), command
            assert classify_failure(failure.failure_kind, failure.stage) is FailureClass.EVALUATION
        allowed = client.post(
            "/sandbox/run",
            json={"session_id": session_id, "command": 'python3 -c "print(6 * 7)"'},
            headers=auth,
        )
    assert not proof.exists()
    assert allowed.status_code == 200
    assert allowed.json()["stdout"] == "42\n"


def test_the_agent_and_the_sandbox_share_one_allowlist() -> None:
    assert command_allowed('python3 -c "print(17 * 23)"')
    assert command_allowed('python3 -c "print((2 + 3) % 4 - 1.5 / 2)"')
    assert not command_allowed(' python3 -c "print(17 * 23)"')  # exactly what is run, or nothing
    assert not command_allowed('python3 -c "print(17 * 23)"\n')


def test_the_readiness_check_goes_straight_to_loopback_whatever_the_proxy_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _hostile_environment(monkeypatch)
    seen: list[str | None] = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get(TOKEN_HEADER))
            self.send_response(200 if self.headers.get(TOKEN_HEADER) == TOKEN else 403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert launcher._healthy(url, TOKEN)
        assert not launcher._healthy(url, "not-the-runs-token-0123456789")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert seen == [TOKEN, "not-the-runs-token-0123456789"]


# --- Interruption --------------------------------------------------------------------------------


def _collecting(out_dir: Path) -> bool:
    """Whether a demo under `out_dir` has saved its first row."""
    return any(path.stat().st_size for path in out_dir.glob("*/rollouts*.jsonl"))


@pytest.mark.parametrize(
    ("signum", "codes"), [(signal.SIGINT, {130, -2}), (signal.SIGTERM, {143})], ids=["SIGINT", "SIGTERM"]
)
def test_an_interrupted_demo_stops_every_server(tmp_path: Path, signum: int, codes: set[int]) -> None:
    # A shell starts a background job with SIGINT ignored, and children inherit that: give the
    # launcher the default Ctrl-C behaviour whatever started this test.
    start = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = ['gym_failures.demo', '--out', {str(tmp_path)!r}, '--rollouts', '5000']; "
        "runpy.run_module('gym_failures.demo', run_name='__main__')"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", start], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60  # a hang guard
        while not _collecting(tmp_path):
            assert launcher.poll() is None, launcher.communicate()[1].decode()
            assert time.monotonic() < deadline, "the demo never started collecting"
            time.sleep(0.05)
        (run_dir,) = tmp_path.iterdir()
        servers = json.loads((run_dir / "servers.json").read_text())
        assert all(_alive(server["pid"]) for server in servers.values())
        launcher.send_signal(signum)
        _, stderr = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode in codes, stderr.decode()
    assert [name for name, server in servers.items() if _alive(server["pid"])] == []


def test_a_server_that_fails_to_start_stops_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(launcher.SERVERS, "agent", "gym_failures.demo.no_such_server")
    with pytest.raises(RuntimeError, match="the agent server exited with status 1 before it was ready"):
        run_demo(tmp_path, rollouts=2)
    (run_dir,) = tmp_path.iterdir()
    servers = json.loads((run_dir / "servers.json").read_text())
    assert set(servers) == {"model", "resources", "proxy", "agent"}
    assert [name for name, server in servers.items() if _alive(server["pid"])] == []


# --- An external policy endpoint ----------------------------------------------------------------


# A stand-in for an external provider: the scripted model server, which needs no token from its
# callers (the shim supplies it) and answers 400 to a call that carries the demo's token, which must
# never leave the demo.
ENDPOINT = """
import sys
from gym_failures.demo import model_server
from gym_failures.demo._serve import TOKEN_HEADER, main

def create_app(config, token):
    app = model_server.create_app(config, token)
    name = TOKEN_HEADER.lower().encode()

    async def provider(scope, receive, send):
        if scope["type"] == "http":
            if any(key == name for key, _ in scope["headers"]):
                await send({"type": "http.response.start", "status": 400, "headers": []})
                await send({"type": "http.response.body", "body": b"the demo's token reached a provider"})
                return
            scope = {**scope, "headers": [*scope["headers"], (name, token.encode())]}
        await app(scope, receive, send)

    return provider

main("endpoint", create_app, sys.argv[1:])
"""


@pytest.fixture
def external_endpoint(tmp_path: Path) -> Iterator[str]:
    """A Responses endpoint in its own process, standing in for an external provider (`ENDPOINT`):
    the scripted model server, which injects nothing into requests without the demo's identity
    headers."""
    config = DemoConfig(
        run_dir=tmp_path,
        seed=0,
        plan=FaultPlan.model_validate({"model": {"server_error": 0.5, "rate_limit": 0.5}}),
        model_url="http://unused",
        resources_url="http://unused",
        agent_url="http://unused",
    )
    config_path = tmp_path / "endpoint.json"
    config_path.write_text(config.model_dump_json())
    sock = socket.create_server(("127.0.0.1", 0))
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            ENDPOINT,
            "--config",
            str(config_path),
            "--fd",
            str(sock.fileno()),
            "--parent-pid",
            str(os.getpid()),
        ],
        pass_fds=(sock.fileno(),),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, TOKEN_ENV: "endpoint-token-0123456789abcdef"},
    )
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    try:
        yield f"{url}/v1"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_an_external_endpoint_serves_the_policy_and_never_sees_a_file_holding_its_key(
    tmp_path: Path, external_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-demo-0123456789abcdefghij"
    monkeypatch.setenv("GYM_DEMO_MODEL_API_KEY", key)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-0123456789abcdefghij")
    environments, on_progress = _environment_recorder(tmp_path / "runs")
    plan = tmp_path / "plan.json"
    # Faults of the policy's own behaviour only: the judge (still the local model server) gets none.
    plan.write_text(json.dumps({"model": {"slow_response": 0.5, "empty_answer": 0.5}}))
    run_dir = run_demo(
        tmp_path / "runs",
        rollouts=6,
        concurrency=3,
        fault_plan=plan,
        policy_base_url=external_endpoint,
        policy_model="external-model",
        policy_timeout_s=10.0,
        on_progress=on_progress,
    )
    rows = list(read_rows(run_dir / "rollouts.jsonl"))
    assert len(rows) == 6
    assert {row["result"]["response"]["model"] for row in rows} == {"external-model"}
    assert all(row["result"]["verification"]["extracted_answer"] is not None for row in rows)
    # The local model server injects only into the demo's own calls, and the endpoint got none of them.
    assert (run_dir / "injected_faults.jsonl").read_text() == ""
    assert [path.name for path in run_dir.iterdir() if key.encode() in path.read_bytes()] == []
    demo = json.loads((run_dir / "demo.json").read_text())
    assert demo["policy"] == {"base_url": external_endpoint, "model": "external-model"}
    assert demo["fault_plan"]["limits"]["policy_timeout_s"] == 10.0
    # Only the agent calls the endpoint, so only the agent holds its key.
    assert environments["agent"]["GYM_DEMO_MODEL_API_KEY"] == key
    for name in ("model", "resources"):
        assert set(API_KEY_ENV) & set(environments[name]) == set(), name


@pytest.mark.parametrize(
    "url",
    [
        "http://user:sk-secret-0123456789@127.0.0.1:9/v1",
        "https://sk-secret-0123456789@api.example.com/v1",
        "http://127.0.0.1:9/v1?api_key=sk-secret-0123456789",
        "http://127.0.0.1:9/v1#sk-secret-0123456789",
    ],
)
def test_a_model_base_url_holding_a_secret_is_refused_before_anything_is_written(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match=r"user info|query string") as refused:
        run_demo(tmp_path / "runs", rollouts=1, policy_base_url=url, policy_model="external-model")
    assert "sk-secret" not in str(refused.value)
    assert not (tmp_path / "runs").exists()
    assert demo_main(["--out", str(tmp_path / "cli"), "--model-base-url", url, "--model-name", "m"]) == 2
    stderr = capsys.readouterr().err
    assert "--model-base-url" in stderr
    assert "sk-secret" not in stderr
    assert not (tmp_path / "cli").exists()
    # Nothing can write such a URL into the servers' configuration either, nor echo it in the error.
    with pytest.raises(ValidationError) as invalid:
        DemoConfig.model_validate({**_config(tmp_path).model_dump(), "policy_base_url": url})
    assert "sk-secret" not in str(invalid.value)


def test_a_policy_timeout_override_keeps_slow_replies_slower_than_it() -> None:
    plan = load_fault_plan().with_policy_timeout(60.0)
    assert plan.limits.policy_timeout_s == 60.0
    assert plan.limits.slow_response_s > 60.0
    assert plan.model == load_fault_plan().model


# --- The fault plan ------------------------------------------------------------------------------


def test_the_packaged_default_plan_loads_and_injects_every_fault() -> None:
    plan = load_fault_plan()
    assert len(plan.fault_names()) == 13
    assert plan.limits.slow_response_s > plan.limits.policy_timeout_s


@pytest.mark.parametrize(
    "bad",
    [
        {"model": {"server_error": 0.7, "rate_limit": 0.4}},
        {"sandbox": {"oom": 0.1, "segfault": 0.1}},
        {"limits": {"policy_timeout_s": 3.0, "slow_response_s": 2.0}},
        {"resources_server": {"judge_unparseable": 1.5}},
        {"proxy": {"unavailable": 0.8, "outage": 0.4}},
        {"proxy": {"slow": 0.1}},
    ],
)
def test_a_plan_that_cannot_be_meant_is_refused(tmp_path: Path, bad: dict[str, Any]) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValidationError):
        load_fault_plan(path)


def test_a_site_maps_one_draw_onto_its_faults_in_order() -> None:
    plan = FaultPlan.model_validate({"model": {"server_error": 0.1, "rate_limit": 0.2, "stream_cut": 0.1}})
    assert plan.model.pick(0.05) == "server_error"
    assert plan.model.pick(0.25) == "rate_limit"
    assert plan.model.pick(0.35) == "stream_cut"
    assert plan.model.pick(0.35, allowed=frozenset({"server_error"})) is None
    assert plan.model.pick(0.45) is None


def test_draws_are_the_same_in_every_process() -> None:
    here = [draw(7, "model", "3:0", 1, "policy.1", 2), draw(7, "sandbox", "3:0", 1, 0)]
    code = (
        "from gym_failures.demo._plan import draw; "
        "print(draw(7, 'model', '3:0', 1, 'policy.1', 2), draw(7, 'sandbox', '3:0', 1, 0))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert [float(value) for value in there.stdout.split()] == here
    assert all(0.0 <= value < 1.0 for value in here)


# --- The scripted policy and judge ---------------------------------------------------------------


def _decision(item: dict[str, Any]) -> str:
    """What the policy decided, without the fresh ids every reply gets."""
    return item["arguments"] if item["type"] == "function_call" else message_text(item)


def test_the_scripted_policy_runs_a_command_or_answers_and_is_mostly_right() -> None:
    prompt = [{"type": "message", "role": "user", "content": "What is 17 * 23?"}]
    outputs = [
        scripted_policy(prompt, seed=0, rollout_id=f"{index}:0", attempt=1, tools=True)[0]
        for index in range(200)
    ]
    calls = [json.loads(item["arguments"]) for item in outputs if item["type"] == "function_call"]
    answers = [extract_final_answer(message_text(item)) for item in outputs if item["type"] == "message"]
    assert 60 <= len(calls) <= 140  # about half first run a command
    assert {call["command"] for call in calls} == {'python3 -c "print(17 * 23)"'}
    assert 0.7 <= answers.count("391") / len(answers) < 1.0  # a sampled policy slips sometimes
    again = scripted_policy(prompt, seed=0, rollout_id="5:0", attempt=1, tools=True)[0]
    assert _decision(again) == _decision(outputs[5])


def test_the_scripted_policy_answers_with_what_the_sandbox_printed() -> None:
    conversation = [
        {"type": "message", "role": "user", "content": "What is 17 * 23?"},
        {"type": "function_call", "call_id": "call_1", "name": "run_shell", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": json.dumps({"exit_code": 0, "stdout": "391\n", "stderr": ""}),
        },
    ]
    (item,) = scripted_policy(conversation, seed=0, rollout_id="0:0", attempt=1, tools=True)
    assert extract_final_answer(message_text(item)) == "391"


@pytest.mark.parametrize(
    ("reference", "candidate", "verdict"),
    [("391", "391", "CORRECT"), ("391", "391.0", "CORRECT"), ("391", "392", "INCORRECT")],
)
def test_the_scripted_judge_compares_answers(reference: str, candidate: str, verdict: str) -> None:
    prompt = f"Reference answer: {reference}\nCandidate answer: {candidate}\nReply with one line."
    assert scripted_judge(prompt) == f"VERDICT: {verdict}"


# --- Responses helpers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Working it out gives 391.\nFinal answer: 391", "391"),
        ("final answer = -12.50", "-12.5"),
        ("Final answer: 3\nwait, Final answer: 4", "4"),
        ("Let me think about", None),
        ("", None),
    ],
)
def test_the_final_answer_is_extracted(text: str, answer: str | None) -> None:
    assert extract_final_answer(text) == answer


def test_sse_decoding_does_not_depend_on_chunk_boundaries() -> None:
    stream = (
        b'event: response.created\r\ndata: {"type":"response.created"}\r\n\r\n'
        b'event: response.output_text.delta\ndata: {"delta":"4"}\n\n'
        b'event: response.completed\rdata: {"response":{}}\r\r'
    )
    whole = SseDecoder().feed(stream)
    assert [name for name, _ in whole] == [
        "response.created",
        "response.output_text.delta",
        "response.completed",
    ]
    decoder = SseDecoder()
    split = [event for index in range(len(stream)) for event in decoder.feed(stream[index : index + 1])]
    assert split == whole
