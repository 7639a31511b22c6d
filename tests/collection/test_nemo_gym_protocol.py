"""The `nemo-gym` agent protocol's parts (`gym_failures.collection._nemo_gym_protocol`, `_protocols`), and
the collector speaking it to a small in-process agent. Against NeMo Gym's own agent server:
tests/nemo_gym_peer/test_collect_from_nemo_gym_agents.py."""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from gym_failures.collection import CollectionConfig, collect
from gym_failures.collection._nemo_gym_protocol import nemo_gym_row, read_run_reply, run_request
from gym_failures.collection._protocols import AGENT_PROTOCOLS, default_protocol
from gym_failures.failure_kinds import ENVIRONMENT_PROTOCOL_VIOLATION
from gym_failures.failures import CollectionFailure
from tests.cli.invoke import run_cli

URL = "http://127.0.0.1:1/agent?token=hunter2"
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


def _materialized(**fields: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "2 + 2?"},
        "id": "t-0",
        "agent_ref": {"name": "simple_agent", "type": "responses_api_agents"},
        "_ng_task_index": 3,
        "_ng_rollout_index": 1,
        **fields,
    }


def test_the_protocols_are_named() -> None:
    assert AGENT_PROTOCOLS == ("gym-failures", "nemo-gym")
    assert CollectionConfig.model_fields["agent_protocol"].default == "gym-failures"


# run_request


def test_the_first_attempt_sends_the_materialized_row_as_it_is() -> None:
    row = _materialized()
    assert run_request(row, 1) == row
    assert run_request(row, 1) is not row


def test_a_retry_carries_nemo_gyms_attempt_index_and_its_reuse_flag() -> None:
    row = _materialized()
    assert run_request(row, 2) == row | {"_ng_attempt_index": 1}
    assert run_request(row, 3, reuse_cached_deliverable=True) == row | {
        "_ng_attempt_index": 2,
        "reuse_cached_deliverable": True,
    }
    assert "_ng_attempt_index" not in row, "the materialized row is never changed"


@given(
    st.dictionaries(st.text(max_size=12), JSON_VALUES, max_size=6), st.integers(min_value=1, max_value=10**6)
)
def test_a_request_is_the_row_and_at_most_the_attempt_index(row: dict[str, Any], attempt: int) -> None:
    before = json.dumps(row, sort_keys=True)
    body = run_request(row, attempt)
    assert json.dumps(row, sort_keys=True) == before
    assert {key: value for key, value in body.items() if key != "_ng_attempt_index"} == {
        key: value for key, value in row.items() if key != "_ng_attempt_index"
    }
    assert body.get("_ng_attempt_index") == (attempt - 1 if attempt > 1 else row.get("_ng_attempt_index"))


# read_run_reply


def test_a_flat_reply_is_read_as_it_came() -> None:
    reply = {"reward": 1.0, "response": {"output": []}, "mask_sample": False, "extra": [1, 2]}
    assert read_run_reply(json.dumps(reply).encode(), URL) == reply


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[1, 2]", "not an object (list)"),
        (b"null", "not an object (NoneType)"),
        (b'{"reward": NaN}', "not JSON"),
        (b'{"reward": Infinity}', "not JSON"),
        (b'{"reward": 1e309}', "not JSON"),
        (b'{"deep": {"x": [-1e400]}}', "not JSON"),
        (b'{"text": "\\ud800"}', "not JSON"),
        (b'{"text": "\xed\xa0\x80"}', "not JSON"),
        (b"<html>hunter2</html>", "not JSON"),
        (b"", "not JSON"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_a_reply_that_is_no_flat_result_is_a_protocol_violation(body: bytes, says: str) -> None:
    with pytest.raises(CollectionFailure) as caught:
        read_run_reply(body, URL)
    assert caught.value.failure_kind == ENVIRONMENT_PROTOCOL_VIOLATION
    assert says in caught.value.failure_reason
    assert "hunter2" not in caught.value.failure_reason, "neither the body nor the URL's secret is quoted"


def test_the_largest_finite_number_and_a_surrogate_pair_are_json() -> None:
    reply = read_run_reply(b'{"reward": 1.7976931348623157e308, "text": "\\ud83d\\ude00"}', URL)
    assert reply == {"reward": 1.7976931348623157e308, "text": "\U0001f600"}


@given(st.binary(max_size=64) | JSON_VALUES.map(lambda value: json.dumps(value).encode()))
def test_any_reply_is_read_or_refused_as_a_protocol_violation(body: bytes) -> None:
    refused: CollectionFailure | None = None
    try:
        reply: object = read_run_reply(body, URL)
    except CollectionFailure as failure:
        refused, reply = failure, None
    if refused is None:
        assert isinstance(reply, dict)
    else:
        assert refused.failure_kind == ENVIRONMENT_PROTOCOL_VIOLATION
        assert "hunter2" not in refused.failure_reason


# nemo_gym_row


def test_a_row_is_the_reply_with_nemo_gyms_stamps_from_the_request_over_it() -> None:
    request = run_request(_materialized(task_source="math", skills_ref={"hash": "h"}), 2)
    reply = {"reward": 0.5, "_ng_task_index": 99, "agent_ref": {"name": "other"}, "id": "echoed"}
    assert nemo_gym_row(reply, request) == {
        "reward": 0.5,
        "_ng_task_index": 3,
        "_ng_rollout_index": 1,
        "agent_ref": {"name": "simple_agent", "type": "responses_api_agents"},
        "id": "echoed",
        "task_source": "math",
        "skills_ref": {"hash": "h"},
        "_ng_attempt_index": 1,
    }


def test_a_first_attempts_row_keeps_an_attempt_index_the_reply_has_as_nemo_gym_does() -> None:
    # NeMo Gym copies `_ng_attempt_index` only when the request has it (the first attempt's has none).
    assert nemo_gym_row({"_ng_attempt_index": 4}, run_request(_materialized(), 1))["_ng_attempt_index"] == 4


# default_protocol


def _manifest(rows: Path, text: str | bytes) -> None:
    path = rows.with_name(f"{rows.stem}.manifest.json")
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def test_a_fresh_run_speaks_gym_failures(tmp_path: Path) -> None:
    assert default_protocol(tmp_path / "rollouts.jsonl") == "gym-failures"


def test_a_run_keeps_the_protocol_its_manifest_names(tmp_path: Path) -> None:
    rows = tmp_path / "rollouts.jsonl"
    _manifest(rows, json.dumps({"version": 3, "agent_protocol": "nemo-gym"}))
    assert default_protocol(rows) == "nemo-gym"
    _manifest(rows, json.dumps({"version": 3}))  # a run collected before the option
    assert default_protocol(rows) == "gym-failures"


def test_a_run_nemo_gym_wrote_speaks_nemo_gym(tmp_path: Path) -> None:
    rows = tmp_path / "rollouts.jsonl"
    rows.write_text(json.dumps({"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}) + "\n")
    assert default_protocol(rows) == "nemo-gym"
    rows.write_text(json.dumps({"_ng_task_index": 0, "rollout_id": "0:0"}) + "\n")  # ours, unmanifested
    assert default_protocol(rows) == "gym-failures"
    (tmp_path / "rollouts_materialized_inputs.jsonl").write_text("{}\n")
    assert default_protocol(rows) == "nemo-gym"


def test_a_manifest_over_its_bound_is_not_read(tmp_path: Path) -> None:
    rows = tmp_path / "rollouts.jsonl"
    document = json.dumps({"agent_protocol": "nemo-gym"})
    at_bound = document.encode().ljust(1 << 20)
    _manifest(rows, at_bound)
    assert default_protocol(rows) == "nemo-gym"
    _manifest(rows, at_bound + b" ")
    assert default_protocol(rows) == "gym-failures"


@given(st.binary(max_size=128))
def test_any_manifest_or_row_gives_a_protocol(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        rows = Path(directory) / "rollouts.jsonl"
        rows.write_bytes(content)
        assert default_protocol(rows) in AGENT_PROTOCOLS
        _manifest(rows, content)
        assert default_protocol(rows) in AGENT_PROTOCOLS


# The collector speaking it


@pytest.fixture
async def nemo_gym_agent() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A NeMo Gym-style agent: `/run` answers each row's `reply` (a JSON text) with `status`."""
    received: list[dict[str, Any]] = []

    async def run(request: web.Request) -> web.Response:
        row = await request.json()
        received.append(row)
        if "responses_create_params" not in row:
            return web.json_response({"detail": [{"msg": "Field required"}]}, status=422)
        attempt = row.get("_ng_attempt_index", 0)
        replies = row["replies"]
        return web.Response(text=replies[min(attempt, len(replies) - 1)], content_type="application/json")

    app = web.Application()
    app.router.add_post("/run", run)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        await runner.cleanup()


def _tasks(path: Path, *replies: list[Any]) -> Path:
    rows = [
        {"responses_create_params": {"input": str(n)}, "replies": [json.dumps(r) for r in reply]}
        for n, reply in enumerate(replies)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_the_collector_sends_the_row_and_stores_the_flat_reply(
    tmp_path: Path, nemo_gym_agent: tuple[str, list[dict[str, Any]]]
) -> None:
    url, received = nemo_gym_agent
    failure = {"_ng_failure_class": "remote_agent_error", "error": "exit 1", "reuse_cached_deliverable": True}
    tasks = _tasks(tmp_path / "tasks.jsonl", [{"reward": 1.0}], [failure, {"reward": 0.0}], [[1]])
    config = CollectionConfig(
        input_path=tasks, output_path=tmp_path / "rows.jsonl", agent_url=url, agent_protocol="nemo-gym"
    )
    summary = await collect(config)
    assert (summary.succeeded, summary.failed_final, summary.attempts) == (2, 1, 6)
    assert [(row["_ng_task_index"], row.get("_ng_attempt_index")) for row in received[:3]] == [
        (0, None),
        (1, None),
        (2, None),
    ]
    retry = next(row for row in received if row["_ng_task_index"] == 1 and row.get("_ng_attempt_index") == 1)
    assert retry["reuse_cached_deliverable"] is True, "the failure row's flag, sent on the retry"
    successes = {row["_ng_task_index"]: row for row in _lines(config.output_path)}
    assert successes[0]["reward"] == 1.0
    assert "result" not in successes[0]
    assert successes[1]["_ng_attempt_index"] == 1
    failures = _lines(config.failures_path)
    flat = [row for row in failures if row["_ng_task_index"] == 1]
    assert flat[0]["_ng_failure_class"] == "remote_agent_error"
    assert flat[0]["_gf_final"] is False
    garbage = [row for row in failures if row["_ng_task_index"] == 2]
    assert len(garbage) == 3
    assert garbage[-1]["failure"]["failure_kind"] == ENVIRONMENT_PROTOCOL_VIOLATION


async def test_a_kill_shaped_reply_is_saved_nowhere_and_sent_again_on_resume(
    tmp_path: Path, nemo_gym_agent: tuple[str, list[dict[str, Any]]]
) -> None:
    url, received = nemo_gym_agent
    tasks = _tasks(tmp_path / "tasks.jsonl", [{"_ng_failure_class": "kill_shaped", "_ng_no_persist": True}])
    config = CollectionConfig(
        input_path=tasks, output_path=tmp_path / "rows.jsonl", agent_url=url, agent_protocol="nemo-gym"
    )
    summary = await collect(config)
    assert (summary.omitted, summary.attempts, summary.succeeded, summary.failed_final) == (1, 1, 0, 0)
    assert _lines(config.output_path) == _lines(config.failures_path) == []
    again = await collect(config)
    assert (again.already_done, again.omitted) == (0, 1)
    assert [row.get("_ng_attempt_index") for row in received] == [None, None], "the same attempt, as NeMo Gym"


async def test_the_gym_failures_protocol_is_what_a_nemo_gym_agent_refuses(
    tmp_path: Path, nemo_gym_agent: tuple[str, list[dict[str, Any]]]
) -> None:
    """The gap: our episode request has no `responses_create_params`."""
    url, _ = nemo_gym_agent
    tasks = _tasks(tmp_path / "tasks.jsonl", [{"reward": 1.0}])
    config = CollectionConfig(
        input_path=tasks, output_path=tmp_path / "rows.jsonl", agent_url=url, max_attempts=1
    )
    await collect(config)
    (row,) = _lines(config.failures_path)
    assert row["_ng_failure_http_status"] == 422


def test_the_command_line_names_the_protocols(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path / "tasks.jsonl", [{"reward": 1.0}])
    code, _, err = run_cli(
        "collect",
        tasks,
        "--agent-url",
        "http://127.0.0.1:1",
        "--output",
        tmp_path / "o",
        "--agent-protocol",
        "x",
    )
    assert code == 2
    assert "gym-failures" in err
    assert "nemo-gym" in err


# Any 2xx reply becomes a row


FLAT_REPLIES = st.fixed_dictionaries(
    {},
    optional={
        "reward": JSON_VALUES,
        "_ng_failure_class": JSON_VALUES,
        "_ng_failure_terminal": JSON_VALUES,
        "_ng_failure_stage": JSON_VALUES,
        "_ng_no_persist": JSON_VALUES,
        "error": JSON_VALUES,
        "failure_reason": st.text(max_size=3000),
        "reuse_cached_deliverable": JSON_VALUES,
        "_ng_task_index": JSON_VALUES,
    },
).flatmap(lambda fixed: st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3).map(fixed.__or__))


@given(FLAT_REPLIES, st.integers(min_value=1, max_value=4))
def test_any_flat_reply_is_a_row_in_the_file_nemo_gym_would_write(
    reply: dict[str, Any], attempt: int
) -> None:
    from gym_failures.collection._attempt_row import AttemptSeen
    from gym_failures.collection._nemo_gym_protocol import NemoGymDispatcher
    from gym_failures.collection._resume import PendingRollout
    from gym_failures.failure_records import BaseEpisodeResponse, FailureReport

    with tempfile.TemporaryDirectory() as directory:
        tasks = Path(directory) / "tasks.jsonl"
        tasks.write_text("{}\n")
        config = CollectionConfig(
            input_path=tasks, output_path=Path(directory) / "rows.jsonl", agent_url=URL, max_attempts=3
        )
        dispatcher = NemoGymDispatcher(config, "run")
        rollout = PendingRollout(3, 1, {"id": "t-0"}, attempt, "simple_agent", _materialized())
        seen = AttemptSeen(source="environment", delivery="delivered", http_status=200)
        outcome = dispatcher.outcome_row(
            rollout, attempt, BaseEpisodeResponse(result=reply), FailureReport(), seen
        )
    row = outcome.row
    json.dumps(row, allow_nan=False)
    assert (row["_ng_task_index"], row["_ng_rollout_index"], row["rollout_id"]) == (3, 1, "3:1")
    if reply.get("_ng_no_persist"):
        assert not outcome.persisted
    elif reply.get("_ng_failure_class") is None:
        assert (outcome.succeeded, outcome.final) == (True, True)
    else:
        assert not outcome.succeeded
        final = reply.get("_ng_failure_terminal") is True or attempt >= 3
        assert (outcome.final, row["_gf_final"]) == (final, final)
        assert row["rollout_failure"]["failure"]["terminal"] is (reply.get("_ng_failure_terminal") is True)


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ({"kind": "agent_timeout", "max_attempts": 1}, "retry_rule_budget_exhausted"),
        ({"kind": "agent_timeout", "max_retries_per_run": 0}, "retry_cap_reached"),
    ],
)
async def test_a_flat_row_a_retry_rule_closes_is_terminal_to_nemo_gyms_resume_too(
    tmp_path: Path, nemo_gym_agent: tuple[str, list[dict[str, Any]]], rule: dict[str, Any], reason: str
) -> None:
    """A rule closed it: NeMo Gym's resume, which reads `_ng_failure_terminal`, must not send it again
    (the agent's own flag said false)."""
    url, received = nemo_gym_agent
    timeout = {"_ng_failure_class": "timeout_exceeded", "_ng_failure_terminal": False, "error": "slow"}
    tasks = _tasks(tmp_path / "tasks.jsonl", [timeout, {"reward": 1.0}])
    config = CollectionConfig(
        input_path=tasks,
        output_path=tmp_path / "rows.jsonl",
        agent_url=url,
        agent_protocol="nemo-gym",
        max_attempts=3,
        retry_rules=[rule],
    )
    summary = await collect(config)
    assert (summary.attempts, summary.failed_final) == (1, 1)
    (row,) = _lines(config.failures_path)
    assert (row["_gf_final"], row["_gf_final_reason"], row["_ng_failure_terminal"]) == (True, reason, True)
    assert len(received) == 1


async def test_a_flat_failure_row_retried_is_counted_as_a_failed_attempt_not_a_success(
    tmp_path: Path, nemo_gym_agent: tuple[str, list[dict[str, Any]]]
) -> None:
    """The live view read a flat failure row (no `failure` key) as a success that holds no measurement,
    and closed its group's member before the retry succeeded."""
    url, _ = nemo_gym_agent
    timeout = {"_ng_failure_class": "timeout_exceeded", "_ng_failure_terminal": False, "error": "slow"}
    tasks = _tasks(tmp_path / "tasks.jsonl", [timeout, {"reward": 1.0}], [{"reward": 1.0}])
    config = CollectionConfig(
        input_path=tasks,
        output_path=tmp_path / "rows.jsonl",
        agent_url=url,
        agent_protocol="nemo-gym",
        num_repeats=1,
        max_attempts=3,
    )
    seen: list[Any] = []
    summary = await collect(config, seen.append)
    assert (summary.succeeded, summary.attempts) == (2, 3)
    last = seen[-1]
    assert (last.succeeded, last.scored, last.gate_derived, last.retried) == (2, 2, {}, 1)
    assert last.failed_attempts_by_kind == {"agent_timeout": 1}
