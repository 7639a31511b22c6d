"""Retry rules (issue 30): matching, precedence, the decision each failure row records, the run-wide
cap's count, and the flags and files rules come from, at every bound and under hypothesis."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gym_failures import nemo_gym
from gym_failures.collection import CollectionConfig
from gym_failures.collection._attempt_row import AttemptSeen
from gym_failures.collection._dispatcher import AttemptDispatcher
from gym_failures.collection._resume import PendingRollout
from gym_failures.collection._retry_rule_inputs import MAX_FILE_BYTES, load_rules_file, parse_rule_flag
from gym_failures.collection._retry_rules import (
    MAX_MESSAGE_CHARS,
    MAX_NAME_CHARS,
    MAX_RULES,
    RETRY_CAP_REACHED,
    FailureFacts,
    RetryCaps,
    RetryRule,
    RetryRuleError,
    RetryRules,
    rules_of,
)
from gym_failures.failure_kinds import FAILURE_KINDS
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure, FailureReport
from gym_failures.failures import ModelFailure
from gym_failures.row_keys import FINAL, FINAL_REASON, RETRY_RULE

T = TypeVar("T")


def _refusal_or(call: Callable[[], T]) -> T | str:
    """What `call` returns, or the message of the `RetryRuleError` it raises."""
    try:
        return call()
    except RetryRuleError as refused:
        return str(refused)


def _rule(**fields: Any) -> RetryRule:
    return RetryRule.model_validate({"max_attempts": 2, **fields})


def _facts(kind: str | None = "agent_run_error", reason: str = "", **fields: Any) -> FailureFacts:
    return FailureFacts(kind, reason, **fields)


# --- Matching -------------------------------------------------------------------------------------


def test_an_empty_matcher_matches_every_failure() -> None:
    rule = _rule()
    assert rule.matches(_facts())
    assert rule.matches(_facts(kind=None))
    assert rule.matches(_facts(status=429))


def test_kind_matches_one_of_its_kinds() -> None:
    rule = _rule(kind=["model_server_error", "transport_timeout"])
    assert rule.matches(_facts("transport_timeout"))
    assert not rule.matches(_facts("agent_run_error"))
    assert not rule.matches(_facts(None))


def test_a_nemo_gym_label_is_read_as_its_kind_on_either_side() -> None:
    # NeMo Gym 0.7.0 writes `timeout_exceeded`, which gym-failures reads as `agent_timeout`.
    assert _rule(kind="timeout_exceeded").kind == ("agent_timeout",)
    assert _rule(kind="agent_timeout").matches(_facts("timeout_exceeded"))
    assert _rule(kind="tau2_agent_error").matches(_facts("tau2:agent_error"))


def test_a_label_no_vocabulary_knows_is_named_unregistered() -> None:
    rule = _rule(kind="unregistered:my_label")
    assert rule.matches(_facts("my_label"))
    with pytest.raises(RetryRuleError, match="'my_label' is no failure kind"):
        rules_of([{"kind": "my_label", "max_attempts": 1}])


def test_failure_class_is_the_classifiers_with_the_failures_status() -> None:
    rule = _rule(failure_class="model")
    assert rule.matches(_facts("agent_timeout"))
    assert not rule.matches(_facts("model_server_error"))
    assert _rule(failure_class=["evaluation", "unknown"]).matches(_facts("model_server_error", status=503))


@pytest.mark.parametrize(
    ("status", "seen", "matches"),
    [
        ("429", 429, True),
        (429, 429, True),
        ("429", 428, False),
        ("4xx", 400, True),
        ("4XX", 499, True),
        ("4xx", 500, False),
        (["429", "5xx"], 503, True),
        (["429", "5xx"], 404, False),
        ("5xx", None, False),
    ],
)
def test_status_matches_an_exact_code_or_a_class(status: Any, seen: int | None, matches: bool) -> None:
    assert _rule(status=status).matches(_facts(status=seen)) is matches


def test_message_is_searched_not_matched_whole() -> None:
    rule = _rule(message="rate.?limit")
    assert rule.matches(_facts(reason="upstream said: rate limit hit"))
    assert not rule.matches(_facts(reason="Rate limit"))
    assert _rule(message="(?i)rate limit").matches(_facts(reason="Rate Limit"))
    assert _rule(message="^down$").matches(_facts(reason="down"))


def test_every_field_a_rule_names_must_match() -> None:
    rule = _rule(kind="model_server_error", status="5xx", message="upstream")
    assert rule.matches(_facts("model_server_error", "upstream 503", status=503))
    assert not rule.matches(_facts("model_server_error", "upstream 503", status=429))
    assert not rule.matches(_facts("model_server_error", "down", status=503))
    assert not rule.matches(_facts("agent_run_error", "upstream 503", status=503))


# --- Precedence and the decision -------------------------------------------------------------------


def test_the_first_rule_that_matches_decides() -> None:
    rules = rules_of(
        [
            {"name": "limits", "status": 429, "max_attempts": 6},
            {"kind": "model_server_error", "max_attempts": 1},
            {"max_retries_per_run": 10},
        ]
    )
    limited = rules.decide(_facts("model_server_error", status=429), 3)
    assert (limited.rule, limited.max_attempts, limited.exhausted) == (
        "limits",
        6,
        "retry_rule_budget_exhausted",
    )
    never = rules.decide(_facts("model_server_error", status=503), 3)
    assert (never.rule, never.max_attempts) == ("#2", 1)
    # A rule without max_attempts keeps the run's budget, and the reason says whose it was.
    capped = rules.decide(_facts("agent_run_error"), 3)
    assert (capped.rule, capped.max_attempts, capped.exhausted) == ("#3", 3, "attempt_budget_exhausted")
    assert capped.record(retry=True) == {
        "rule": "#3",
        "max_attempts": 3,
        "retry": True,
        "max_retries_per_run": 10,
    }


def test_no_rule_matching_keeps_todays_budget() -> None:
    decided = rules_of([{"kind": "model_server_error", "max_attempts": 1}]).decide(_facts(), 4)
    assert (decided.rule, decided.max_attempts, decided.exhausted) == (None, 4, "attempt_budget_exhausted")
    assert decided.record(retry=False) == {"rule": None, "max_attempts": 4, "retry": False}


def test_the_largest_budget_is_the_runs_or_a_rules() -> None:
    rules = rules_of([{"max_attempts": 7}, {"max_retries_per_run": 2}])
    assert rules.largest_budget(3) == 7
    assert rules.largest_budget(9) == 9
    assert RetryRules().largest_budget(3) == 3


def _row(
    tmp_path: Path, rules: list[dict[str, Any]], failure: EpisodeFailure, attempt: int, **seen: Any
) -> dict[str, Any]:
    """The failure row the dispatcher makes of `failure` at `attempt`, with `rules` and a budget of 3."""
    config = CollectionConfig(
        input_path=tmp_path / "tasks.jsonl",
        output_path=tmp_path / "rollouts.jsonl",
        agent_url="http://127.0.0.1:9",
        max_attempts=3,
        retry_rules=rules,
        **{key: seen.pop(key) for key in ("replay_possibly_delivered",) if key in seen},
    )
    seen_as = AttemptSeen(**{"source": "environment", "delivery": "delivered", "http_status": 200, **seen})
    rollout = PendingRollout(0, 0, {}, attempt)
    response = BaseEpisodeResponse(failure=failure)
    return (
        AttemptDispatcher(config, "run").outcome_row(rollout, attempt, response, FailureReport(), seen_as).row
    )


_FLAKY = EpisodeFailure(failure_kind="model_server_error", failure_reason="upstream 503", terminal=False)


@pytest.mark.parametrize(
    ("attempt", "final_reason", "retry"),
    [(1, None, True), (4, None, True), (5, "retry_rule_budget_exhausted", False)],
)
def test_a_rules_budget_decides_when_the_rollout_is_closed(
    tmp_path: Path, attempt: int, final_reason: str | None, retry: bool
) -> None:
    row = _row(
        tmp_path, [{"name": "flaky", "kind": "model_server_error", "max_attempts": 5}], _FLAKY, attempt
    )
    assert (row[FINAL], row[FINAL_REASON]) == (final_reason is not None, final_reason)
    assert row[RETRY_RULE] == {"rule": "flaky", "max_attempts": 5, "retry": retry}
    assert row[nemo_gym.FAILURE_TERMINAL] is (not retry), "NeMo Gym's resume never replays what ours won't"


def test_max_attempts_1_is_never_retried(tmp_path: Path) -> None:
    row = _row(tmp_path, [{"kind": "model_server_error", "max_attempts": 1}], _FLAKY, 1)
    assert row[FINAL_REASON] == "retry_rule_budget_exhausted"
    assert row[RETRY_RULE] == {"rule": "#1", "max_attempts": 1, "retry": False}


def test_a_terminal_failure_stays_final_whatever_a_rule_gives(tmp_path: Path) -> None:
    terminal = _FLAKY.model_copy(update={"terminal": True})
    row = _row(tmp_path, [{"max_attempts": 9}], terminal, 1)
    assert (row[FINAL_REASON], row[RETRY_RULE]["retry"]) == ("terminal", False)


def test_an_attempt_that_may_have_been_delivered_stays_final_without_replay(tmp_path: Path) -> None:
    seen = {"source": "collector", "delivery": "possibly_delivered", "http_status": None}
    row = _row(tmp_path, [{"max_attempts": 9}], _FLAKY, 1, replay_possibly_delivered=False, **seen)
    assert row[FINAL_REASON] == "possibly_delivered"
    replayed = _row(tmp_path, [{"max_attempts": 9}], _FLAKY, 1, **seen)
    assert replayed[FINAL_REASON] is None


def test_the_status_a_rule_sees_is_the_reports_failure_event_before_the_reply(tmp_path: Path) -> None:
    config = CollectionConfig(
        input_path=tmp_path / "tasks.jsonl",
        output_path=tmp_path / "rollouts.jsonl",
        agent_url="http://127.0.0.1:9",
        retry_rules=[{"status": 503, "max_attempts": 1}],
    )
    failed = ModelFailure(failure_kind="model_server_error", failure_reason="upstream", http_status=503)
    report = failed.failure_report()
    seen = AttemptSeen(source="environment", delivery="delivered", http_status=500)
    dispatcher = AttemptDispatcher(config, "run")
    rollout = PendingRollout(0, 0, {}, 1)
    row = dispatcher.outcome_row(rollout, 1, BaseEpisodeResponse(failure=_FLAKY), report, seen).row
    assert row[FINAL_REASON] == "retry_rule_budget_exhausted", "the model's 503, not the agent's 500"
    plain = dispatcher.outcome_row(rollout, 1, BaseEpisodeResponse(failure=_FLAKY), FailureReport(), seen).row
    assert plain[FINAL_REASON] is None
    assert plain[RETRY_RULE]["rule"] is None


def test_without_rules_a_row_has_no_rule_key(tmp_path: Path) -> None:
    row = _row(tmp_path, [], _FLAKY, 3)
    assert RETRY_RULE not in row
    assert row[FINAL_REASON] == "attempt_budget_exhausted"
    assert row[nemo_gym.FAILURE_TERMINAL] is False


# --- The run-wide cap ------------------------------------------------------------------------------


def _retried(rule: str) -> dict[str, Any]:
    return {
        "failure": {},
        nemo_gym.FAILURE_TERMINAL: False,
        FINAL: False,
        FINAL_REASON: None,
        RETRY_RULE: {"rule": rule, "max_attempts": 5, "retry": True, "max_retries_per_run": 2},
    }


def test_the_cap_grants_its_retries_then_closes_the_rest() -> None:
    caps = RetryCaps(
        rules_of([{"name": "capped", "max_attempts": 5, "max_retries_per_run": 2}, {"max_attempts": 5}])
    )
    rows = [_retried("capped") for _ in range(4)]
    assert [caps.allows(row) for row in rows] == [True, True, False, False]
    closed = rows[2]
    assert (closed[FINAL], closed[FINAL_REASON], closed[RETRY_RULE]["retry"]) == (
        True,
        RETRY_CAP_REACHED,
        False,
    )
    assert closed[nemo_gym.FAILURE_TERMINAL] is True
    assert rows[0][FINAL] is False
    # An uncapped rule, no rule, a final row: nothing counted.
    assert all(caps.allows(_retried("#2")) for _ in range(5))
    assert caps.allows({"failure": {}})
    assert caps.allows({RETRY_RULE: {"rule": "capped", "retry": False}})
    assert caps.granted == {"capped": 2}


def test_a_cap_of_0_retries_nothing() -> None:
    caps = RetryCaps(rules_of([{"name": "none", "max_retries_per_run": 0}]))
    assert not caps.allows(_retried("none"))


# --- Bounds -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_retries_per_run": -1}, "max_retries_per_run"),
        ({"message": "x" * (MAX_MESSAGE_CHARS + 1), "max_attempts": 1}, "message"),
        ({"message": "", "max_attempts": 1}, "message"),
        ({"message": "(unclosed", "max_attempts": 1}, "message: no valid regular expression"),
        ({"name": "x" * (MAX_NAME_CHARS + 1), "max_attempts": 1}, "name"),
        ({"name": "#1", "max_attempts": 1}, "name"),
        ({"status": 99, "max_attempts": 1}, "status: '99' is no error status"),
        ({"status": 399, "max_attempts": 1}, "status: '399' is no error status"),
        ({"status": "2xx", "max_attempts": 1}, "status: '2xx' is no error status"),
        ({"status": 600, "max_attempts": 1}, "status: '600'"),
        ({"status": "0xx", "max_attempts": 1}, "status"),
        ({"status": "6xx", "max_attempts": 1}, "status"),
        ({"status": True, "max_attempts": 1}, "status"),
        ({"kind": [], "max_attempts": 1}, "kind: an empty list matches nothing"),
        ({"kind": "judge_derived_nonsense", "max_attempts": 1}, "kind"),
        ({"failure_class": "infrastructure", "max_attempts": 1}, "failure_class"),
        ({"max_attempts": True}, "max_attempts"),
        ({"max_attempts": "3"}, "max_attempts"),
        ({"max_attempts": 1.5}, "max_attempts"),
        ({"kind": "model_server_error"}, "a rule needs max_attempts or max_retries_per_run"),
        ({"max_attempts": 1, "other": 1}, "other"),
    ],
)
def test_a_rule_past_a_bound_is_refused_in_one_line(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(RetryRuleError) as refused:
        rules_of([fields])
    assert problem in str(refused.value)
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith("rule 1")


@pytest.mark.parametrize(
    "fields",
    [
        {"max_attempts": 1},
        {"max_retries_per_run": 0},
        {"message": "x" * MAX_MESSAGE_CHARS, "max_attempts": 1},
        {"name": "n" * MAX_NAME_CHARS, "max_attempts": 1},
        {"status": [400, 599, "4xx", "5xx"], "max_attempts": 1},
        {"kind": sorted(FAILURE_KINDS), "max_attempts": 1},
    ],
)
def test_a_rule_at_a_bound_is_taken(fields: dict[str, Any]) -> None:
    assert len(rules_of([fields]).root) == 1


def test_at_most_max_rules_rules_with_distinct_names() -> None:
    assert len(rules_of([{"max_attempts": 1}] * MAX_RULES).root) == MAX_RULES
    with pytest.raises(RetryRuleError, match=f"at most {MAX_RULES} rules, not {MAX_RULES + 1}"):
        rules_of([{"max_attempts": 1}] * (MAX_RULES + 1))
    with pytest.raises(RetryRuleError, match="two rules are named 'a'"):
        rules_of([{"name": "a", "max_attempts": 1}, {"name": "a", "max_attempts": 2}])
    with pytest.raises(RetryRuleError, match="two rules are named 'a'"):
        rules_of([{"name": "a", "max_attempts": 1}]).joined(rules_of([{"name": "a", "max_attempts": 1}]))


def test_the_config_takes_rules_and_defaults_to_none(tmp_path: Path) -> None:
    base = {"input_path": tmp_path / "t.jsonl", "output_path": tmp_path / "o.jsonl", "agent_url": "http://h"}
    assert CollectionConfig.model_validate(base).retry_rules.root == ()
    config = CollectionConfig.model_validate(
        {**base, "retry_rules": [{"kind": "agent_timeout", "max_attempts": 2}]}
    )
    assert config.retry_rules.root[0].kind == ("agent_timeout",)
    assert CollectionConfig.model_validate_json(config.model_dump_json()) == config


# --- Flags ------------------------------------------------------------------------------------------


def test_a_flag_names_every_field() -> None:
    rule = parse_rule_flag(
        " name=limits , kind=provider_quota_exhausted|timeout_exceeded, failure_class=evaluation|model,"
        "status=429|5XX,max_attempts=6,max_retries_per_run=0,message=quota, (used|spent)"
    )
    assert rule == RetryRule(
        name="limits",
        kind=("provider_quota_exhausted", "agent_timeout"),
        failure_class=("evaluation", "model"),
        status=("429", "5xx"),
        max_attempts=6,
        max_retries_per_run=0,
        message="quota, (used|spent)",
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "an empty field"),
        ("max_attempts=2,", "an empty field"),
        ("kind", "'kind' is no KEY=VALUE field"),
        ("colour=red,max_attempts=1", "unknown key 'colour'"),
        ("kind=agent_timeout,kind=agent_timeout,max_attempts=1", "kind is given twice"),
        ("kind=,max_attempts=1", "kind has no value"),
        ("max_attempts=0", "max_attempts: Input should be greater than or equal to 1"),
        ("max_attempts=-1", "max_attempts must be a whole number"),
        ("max_attempts=1.5", "max_attempts must be a whole number"),
        ("max_attempts=٣", "max_attempts must be a whole number"),
        ("max_retries_per_run=" + "9" * 5000, "max_retries_per_run must be a whole number"),
        ("kind=nope,max_attempts=1", "kind: 'nope' is no failure kind"),
        ("kind=agent_timeout||transport_timeout,max_attempts=1", "kind"),
        ("status=600,max_attempts=1", "status: '600' is no error status"),
        ("max_attempts=1,message=a{99999999999}", "no valid regular expression"),
        ("message=(,max_attempts=1", "message: no valid regular expression"),
        ("kind=agent_timeout", "a rule needs max_attempts or max_retries_per_run"),
    ],
)
def test_a_bad_flag_is_refused_in_one_line(text: str, problem: str) -> None:
    with pytest.raises(RetryRuleError) as refused:
        parse_rule_flag(text)
    assert problem in str(refused.value)
    assert "\n" not in str(refused.value)


def test_message_takes_the_rest_of_the_flag() -> None:
    rule = parse_rule_flag("max_attempts=2,message=a,b=c|d")
    assert (rule.message, rule.max_attempts) == ("a,b=c|d", 2)


_NAMES = st.from_regex(re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{MAX_NAME_CHARS - 1}}}"), fullmatch=True)
_STATUSES = st.one_of(st.integers(400, 599).map(str), st.sampled_from(["4xx", "5xx"]))
_RULE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.none() | _NAMES,
    "kind": st.none() | st.lists(st.sampled_from(sorted(FAILURE_KINDS)), min_size=1, max_size=3),
    "failure_class": st.none()
    | st.lists(st.sampled_from(["model", "evaluation", "unknown"]), min_size=1, max_size=3),
    "status": st.none() | st.lists(_STATUSES, min_size=1, max_size=3),
    "message": st.none() | st.text(alphabet="ab ,=|:", min_size=1, max_size=MAX_MESSAGE_CHARS),
    "max_attempts": st.none() | st.integers(1, 10**12),
    "max_retries_per_run": st.none() | st.integers(0, 10**12),
}
_RULES: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(_RULE_FIELDS).filter(
    lambda rule: rule["max_attempts"] is not None or rule["max_retries_per_run"] is not None
)


def _flag(fields: dict[str, Any], order: list[str]) -> str:
    """`fields` written as a `--retry-rule` value, in `order` (`message` last: it takes the rest)."""
    given_fields = [key for key in order if fields[key] is not None and key != "message"]
    parts = [
        f"{key}={'|'.join(map(str, value)) if isinstance(value, list) else value}"
        for key, value in ((key, fields[key]) for key in given_fields)
    ]
    if fields["message"] is not None:
        parts.append(f"message={fields['message']}")
    return ",".join(parts)


@given(
    _RULES,
    st.permutations(["name", "kind", "failure_class", "status", "max_attempts", "max_retries_per_run"]),
)
def test_a_rule_written_as_a_flag_reads_back_as_itself(fields: dict[str, Any], order: list[str]) -> None:
    rule = rules_of([{key: value for key, value in fields.items() if value is not None}]).root[0]
    assert parse_rule_flag(_flag(fields, order)) == rule


@given(st.text(max_size=200) | st.text(alphabet="=,|kindmax_attemptsstatus4xx09 ", max_size=80))
def test_any_flag_text_is_a_rule_or_one_line_of_refusal(text: str) -> None:
    outcome = _refusal_or(lambda: parse_rule_flag(text))
    if isinstance(outcome, str):
        assert outcome
        assert "\n" not in outcome
    else:
        assert isinstance(outcome, RetryRule)


# --- Files ------------------------------------------------------------------------------------------

TOML = """
[[rules]]
name = "limits"
kind = ["provider_quota_exhausted", "timeout_exceeded"]
status = [429, "5xx"]
max_attempts = 6
max_retries_per_run = 100

[[rules]]
message = "^tool run"
max_attempts = 1
"""


def test_a_toml_file_and_its_json_twin_give_the_same_rules(tmp_path: Path) -> None:
    (tmp_path / "rules.toml").write_text(TOML)
    document = {
        "rules": [
            {
                "name": "limits",
                "kind": ["provider_quota_exhausted", "timeout_exceeded"],
                "status": [429, "5xx"],
                "max_attempts": 6,
                "max_retries_per_run": 100,
            },
            {"message": "^tool run", "max_attempts": 1},
        ]
    }
    (tmp_path / "rules.json").write_text(json.dumps(document))
    from_toml = load_rules_file(tmp_path / "rules.toml")
    assert from_toml == load_rules_file(tmp_path / "rules.json")
    assert [from_toml.label(index) for index in range(2)] == ["limits", "#2"]
    assert from_toml.root[0].kind == ("provider_quota_exhausted", "agent_timeout")


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("rules.yaml", "rules: []", "name a .json or .toml file"),
        ("missing.json", None, "cannot be read (No such file or directory)"),
        ("rules.json", "{", "is no valid JSON"),
        ("rules.toml", "[[rules]\n", "is no valid TOML"),
        ("rules.toml", "\udcff", "is no valid TOML"),
        ("rules.json", "[]", 'holds no "rules" list'),
        ("rules.json", '{"rules": {}}', 'holds no "rules" list'),
        ("rules.json", '{"rules": [], "version": 1}', "has a key 'version' beside \"rules\""),
        ("rules.json", '{"rules": [{"max_attempts": 0}]}', "rule 1, max_attempts"),
        ("rules.json", '{"rules": [{"max_attempts": 1}, {"max_attempts": NaN}]}', "rule 2, max_attempts"),
        (
            "rules.toml",
            "[[rules]]\nmax_attempts = 1\n[[rules]]\nkind = 'nope'\nmax_attempts = 1\n",
            "rule 2, kind",
        ),
        ("rules.json", "[" * 100_000, "is no valid JSON"),
    ],
)
def test_a_bad_file_is_refused_in_one_line(
    tmp_path: Path, name: str, content: str | None, problem: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(RetryRuleError) as refused:
        load_rules_file(path)
    assert problem in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("length", [64, 65])
def test_an_unknown_keys_name_is_shown_up_to_64_characters(tmp_path: Path, length: int) -> None:
    key = "k" * length
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": [{"max_attempts": 1, key: 1}]}))
    with pytest.raises(RetryRuleError) as refused:
        load_rules_file(path)
    assert f"rule 1, {'k' * 64}" in str(refused.value)
    assert "k" * 65 not in str(refused.value)


def test_a_file_of_at_most_1_mib_is_read(tmp_path: Path) -> None:
    body = json.dumps({"rules": [{"max_attempts": 1}]})
    path = tmp_path / "rules.json"
    path.write_text(body + " " * (MAX_FILE_BYTES - len(body)))
    assert len(load_rules_file(path).root) == 1
    path.write_text(body + " " * (MAX_FILE_BYTES - len(body) + 1))
    with pytest.raises(RetryRuleError, match="is over 1024 KiB"):
        load_rules_file(path)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
_RULE_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=70) | _NAMES,
        "kind": st.sampled_from(["agent_timeout", "nope", "tau2_agent_error"]) | _JSON,
        "status": _STATUSES | st.integers(-10, 1000) | _JSON,
        "message": st.text(max_size=300) | _JSON,
        "max_attempts": st.integers(-2, 5) | _JSON,
        "max_retries_per_run": st.integers(-2, 5) | _JSON,
        "failure_class": st.sampled_from(["model", "evaluation", "x"]) | _JSON,
    },
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(_JSON, st.fixed_dictionaries({"rules": st.lists(_RULE_LIKE | _JSON, max_size=4)})))
@example({"rules": [{"\n": None}]})  # a key with a newline: once two lines of refusal
def test_any_json_file_is_rules_or_one_line_of_refusal(tmp_path: Path, document: Any) -> None:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(document))
    outcome = _refusal_or(lambda: load_rules_file(path))
    if isinstance(outcome, str):
        assert outcome
        assert "\n" not in outcome
    else:
        assert isinstance(outcome, RetryRules)
        assert len(outcome.root) == len(document["rules"])


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_RULES, max_size=5))
def test_rules_saved_as_json_read_back_as_themselves(tmp_path: Path, rules: list[dict[str, Any]]) -> None:
    given_rules = [{key: value for key, value in rule.items() if value is not None} for rule in rules]
    names = [rule.get("name") for rule in given_rules if rule.get("name") is not None]
    if len(names) != len(set(names)):
        return
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": given_rules}))
    assert load_rules_file(path) == rules_of(given_rules)
