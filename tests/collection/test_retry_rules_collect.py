"""Retry rules in a real collection (issue 30): against the test agent server (a real uvicorn process,
`tests.collection.agent_app`) that fails in different ways, rules change which rollouts are retried
and how often, the rows say why, a rule's run-wide cap holds, and a resume plans with the rules'
budgets, NeMo Gym 0.7.0's own run directories included."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gym_failures import nemo_gym
from gym_failures.collection import CollectionConfig, collect, read_rows
from gym_failures.collection._retry_rules import RetryRules, rules_of
from gym_failures.row_keys import RETRY_RULE

TASKS: list[dict[str, Any]] = [
    {"mode": "raise"},  # model_server_error; its report's event says 503, the reply 500
    {"mode": "fail_as", "kind": "model_server_error"},  # no status
    {"mode": "always_fail"},  # agent_run_error, "tool run failed"
    {"mode": "terminal"},  # the same, marked terminal
    {"mode": "fail_as", "kind": "provider_unavailable", "boundary": "sandbox"},  # evaluation side
    {"mode": "fail_as", "kind": "agent_timeout", "boundary": "agent"},  # model side: no rule matches
    {"mode": "ok"},
]
RULES: list[dict[str, Any]] = [
    {"name": "model_503", "status": 503, "max_attempts": 2},
    {"name": "model_never", "kind": "model_server_error", "max_attempts": 1},
    {"name": "tool_runs", "message": "^tool run", "max_attempts": 5},
    {"name": "evaluation_side", "failure_class": "evaluation", "max_retries_per_run": 100},
]


def _config(tmp_path: Path, agent_url: str, tasks: list[dict[str, Any]], **options: Any) -> CollectionConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return CollectionConfig(
        input_path=tmp_path / "tasks.jsonl",
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url=agent_url,
        breaker_attempts=0,
        **{"max_attempts": 3, **options},
    )


def _failures(config: CollectionConfig) -> dict[str, list[dict[str, Any]]]:
    """Every rollout's failure rows, as saved (the `_gf_` keys themselves), in attempt order."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for line in config.failures_path.read_bytes().splitlines():
        row = json.loads(line)
        rows.setdefault(row["rollout_id"], []).append(row)
    return {
        key: sorted(found, key=lambda row: row.get(nemo_gym.ATTEMPT_INDEX, 0)) for key, found in rows.items()
    }


def _final(rows: list[dict[str, Any]]) -> tuple[int, str | None, Any]:
    """How many attempts a rollout's failure rows are, and what its last says: why, by which rule."""
    last = rows[-1]
    return len(rows), last["_gf_final_reason"], last.get(RETRY_RULE)


async def test_rules_change_what_is_retried_and_the_rows_say_why(tmp_path: Path, agent_url: str) -> None:
    plain = _config(tmp_path / "plain", agent_url, TASKS)
    ruled = _config(tmp_path / "ruled", agent_url, TASKS, retry_rules=RULES)
    await collect(plain)
    summary = await collect(ruled)
    # Today's behaviour without rules: every failure the agent did not mark terminal has 3 attempts.
    assert {key: _final(rows)[:2] for key, rows in _failures(plain).items()} == {
        "0:0": (3, "attempt_budget_exhausted"),
        "1:0": (3, "attempt_budget_exhausted"),
        "2:0": (3, "attempt_budget_exhausted"),
        "3:0": (1, "terminal"),
        "4:0": (3, "attempt_budget_exhausted"),
        "5:0": (3, "attempt_budget_exhausted"),
    }
    assert not any(RETRY_RULE in row for rows in _failures(plain).values() for row in rows)
    rule = {
        name: {"rule": name, "max_attempts": budget}
        for name, budget in [("model_503", 2), ("model_never", 1)]
    }
    assert {key: _final(rows) for key, rows in _failures(ruled).items()} == {
        # The model's 503 (the report's failure event, not the agent's 500): the first rule, before
        # the second, which would match its kind too.
        "0:0": (2, "retry_rule_budget_exhausted", {**rule["model_503"], "retry": False}),
        "1:0": (1, "retry_rule_budget_exhausted", {**rule["model_never"], "retry": False}),
        "2:0": (5, "retry_rule_budget_exhausted", {"rule": "tool_runs", "max_attempts": 5, "retry": False}),
        # Terminal stays final, whatever the rule that matched gives.
        "3:0": (1, "terminal", {"rule": "tool_runs", "max_attempts": 5, "retry": False}),
        # A rule without a budget of its own keeps --max-attempts, and the reason says so.
        "4:0": (
            3,
            "attempt_budget_exhausted",
            {"rule": "evaluation_side", "max_attempts": 3, "retry": False, "max_retries_per_run": 100},
        ),
        "5:0": (3, "attempt_budget_exhausted", {"rule": None, "max_attempts": 3, "retry": False}),
    }
    retried = _failures(ruled)["2:0"][:-1]
    assert [row[RETRY_RULE]["retry"] for row in retried] == [True] * 4
    assert all(row["_gf_final"] is False and "_gf_retry_wait_s" in row for row in retried)
    assert _failures(ruled)["2:0"][-1][nemo_gym.FAILURE_TERMINAL] is True, "NeMo Gym won't retry it either"
    assert _failures(ruled)["5:0"][-1][nemo_gym.FAILURE_TERMINAL] is False, "a raised budget reopens it"
    (success,) = [json.loads(line) for line in ruled.output_path.read_bytes().splitlines()]
    assert RETRY_RULE not in success, "a success row says no rule"
    assert (summary.attempts, summary.succeeded, summary.failed_final) == (2 + 1 + 5 + 1 + 3 + 3 + 1, 1, 6)


@pytest.mark.parametrize("cap", [0, 1, 3])
async def test_a_rules_run_wide_cap_bounds_the_retries_it_grants(
    tmp_path: Path, agent_url: str, cap: int
) -> None:
    """4 rollouts that always fail, a rule giving each 5 attempts but at most `cap` retries in all:
    whatever the order the attempts come back in, `cap` retries are granted, and every rollout is
    then closed by the cap."""
    rules = [{"name": "capped", "message": "tool run", "max_attempts": 5, "max_retries_per_run": cap}]
    config = _config(tmp_path, agent_url, [{"mode": "always_fail"}], num_repeats=4, retry_rules=rules)
    summary = await collect(config)
    rows = [row for found in _failures(config).values() for row in found]
    assert summary.attempts == len(rows) == 4 + cap
    assert sum(row[RETRY_RULE]["retry"] for row in rows) == cap
    finals = [row for row in rows if row["_gf_final"]]
    assert len(finals) == summary.failed_final == 4
    assert {row["_gf_final_reason"] for row in finals} == {"retry_cap_reached"}
    assert all(row[nemo_gym.FAILURE_TERMINAL] is True for row in finals)
    record = {"rule": "capped", "max_attempts": 5, "retry": False, "max_retries_per_run": cap}
    assert all(row[RETRY_RULE] == record for row in finals)


async def test_a_cap_is_counted_afresh_by_each_collect(tmp_path: Path, agent_url: str) -> None:
    rules = [{"name": "capped", "max_attempts": 3, "max_retries_per_run": 1}]
    config = _config(tmp_path, agent_url, [{"mode": "always_fail"}], num_repeats=2, retry_rules=rules)
    await collect(config)
    # One retry granted, both rollouts then closed by the cap: a resume has nothing to do.
    assert (await collect(config)).attempts == 0
    reasons = Counter(row["final_reason"] for row in read_rows(config.failures_path) if row["final"])
    assert reasons == {"retry_cap_reached": 2}


def _cut_to(config: CollectionConfig, attempts: int) -> None:
    """The failures file as if the run had been killed after each rollout's first `attempts`."""
    lines = config.failures_path.read_bytes().splitlines(keepends=True)
    kept = [
        line
        for line, row in zip(lines, read_rows(config.failures_path), strict=True)
        if row["attempt"] <= attempts
    ]
    config.failures_path.write_bytes(b"".join(kept))


async def test_a_resume_keeps_open_a_rollout_a_rule_gives_more_than_max_attempts(
    tmp_path: Path, agent_url: str
) -> None:
    rules = [{"name": "tool_runs", "message": "tool run", "max_attempts": 5}]
    config = _config(tmp_path, agent_url, [{"mode": "always_fail"}], retry_rules=rules)
    await collect(config)
    _cut_to(config, 3)  # killed with 3 attempts made, --max-attempts' worth: the rule gives 2 more
    summary = await collect(config)
    assert (summary.attempts, summary.closed_on_resume, summary.reopened) == (2, 0, 0)
    rows = list(read_rows(config.failures_path))
    assert [row["attempt"] for row in rows] == [1, 2, 3, 4, 5]
    assert rows[-1]["final_reason"] == "retry_rule_budget_exhausted"
    # Without the rule, the same run is closed on resume at --max-attempts, as before.
    _cut_to(config, 3)
    plain = await collect(config.model_copy(update={"retry_rules": RetryRules()}))
    assert (plain.attempts, plain.closed_on_resume) == (0, 1)


async def test_a_rule_raising_a_budget_reopens_the_rollouts_max_attempts_closed(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(
        tmp_path, agent_url, [{"mode": "always_fail"}, {"mode": "fail_as", "kind": "agent_timeout"}]
    )
    await collect(config)
    rules = rules_of([{"name": "more", "message": "tool run", "max_attempts": 4}])
    ruled = config.model_copy(update={"retry_rules": rules})
    summary = await collect(ruled)
    # Only the rollout the rule matches is reopened; the other keeps its budget, and stays closed.
    assert (summary.reopened, summary.attempts, summary.already_done) == (1, 1, 1)
    last = max(read_rows(ruled.failures_path), key=lambda row: (row["rollout_id"] == "0:0", row["attempt"]))
    assert (last["rollout_id"], last["attempt"], last["final_reason"]) == (
        "0:0",
        4,
        "retry_rule_budget_exhausted",
    )


NEMO_GYM_RUNS = Path(__file__).resolve().parents[2] / "examples" / "nemo_gym_runs"


@pytest.mark.parametrize(
    ("rule", "dispatched"),
    [
        ({"kind": "timeout_exceeded", "max_attempts": 5}, {"1:0": 4}),  # NeMo Gym's label, as written
        ({"kind": "agent_timeout", "max_attempts": 5}, {"1:0": 4}),  # the kind gym-failures reads it as
        ({"message": "ran past its 600 s", "max_attempts": 4}, {"1:0": 4}),
        ({"kind": "model_server_error", "max_attempts": 5}, {}),  # no match: NeMo Gym's budget, spent
        ({"kind": "timeout_exceeded", "max_attempts": 3}, {}),  # no more than it had
    ],
)
async def test_rules_read_the_failure_rows_nemo_gym_wrote(
    tmp_path: Path, agent_url: str, rule: dict[str, Any], dispatched: dict[str, int]
) -> None:
    """NeMo Gym 0.7.0's own run (examples/nemo_gym_runs/exhausted: a rollout failed three times with
    `timeout_exceeded`, its budget spent; written by NeMo Gym's collector), resumed by ours with a
    rule: a rule matching NeMo Gym's rows reopens the rollout at its fourth attempt."""
    run = tmp_path / "exhausted"
    shutil.copytree(NEMO_GYM_RUNS / "exhausted", run)
    before = set(run.joinpath("rollouts.jsonl").read_text().splitlines())
    config = CollectionConfig(
        input_path=run / "input" / "tasks.jsonl",
        output_path=run / "rollouts.jsonl",
        agent_url=agent_url,
        max_attempts=3,
        retry_rules=[rule],
    )
    summary = await collect(config)
    new = [
        row
        for line in run.joinpath("rollouts.jsonl").read_text().splitlines()
        if line not in before
        for row in [json.loads(line)]
    ]
    assert {row["rollout_id"]: row[nemo_gym.ATTEMPT_INDEX] + 1 for row in new} == dispatched
    assert summary.reopened == len(dispatched)
    assert summary.closed_on_resume == 0
