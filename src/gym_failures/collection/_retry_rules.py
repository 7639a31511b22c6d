"""Retry rules: which failed attempts `collect` retries, and how often (`RetryRule`, `RetryRules`).

`--max-attempts` is one budget for every failure; a rule gives the failures it matches a budget of
their own, and optionally a cap on the retries it grants in the whole run (issue 30, after verifiers
0.4.0's retry rules). Decisions (docs/decisions.md, "Retry rules"):

- A rule matches on the failure's kind (`kind`: one or a list; a NeMo Gym label is read as its kind,
  and a label neither knows as `unregistered:<label>`), its responsibility class (`failure_class`:
  `model`, `evaluation`, `unknown`, as `classify_failure` gives it), its HTTP status (`status`: an exact
  code such as `429`, or a class such as `5xx`) and its reason (`message`: a regular expression,
  searched, at most 256 characters, compiled once). Every field it names must match; a rule that
  names none matches every failure.
- The status a rule sees is the failure's own: the status of the event the attempt's report names as
  its failure (the model's 429 behind an agent's failure), else the `/run` reply's error status. A
  failure with neither has no status, and matches no rule that names one.
- Rules are an ordered list; the first that matches decides. Its `max_attempts` is the rollout's
  budget for that failure (1: never retried); without one, `--max-attempts` stays the budget. Its
  `max_retries_per_run` caps the retries it grants in the run. A failure no rule matches has today's
  budget, `max_attempts`. A rule needs at least one of the two.
- What still wins over a rule: a failure the agent marked `terminal` is final, and one that may have
  been delivered is final when `replay_possibly_delivered` is False.
- The row says what was decided, under `_gf_retry_rule` (`row_keys.RETRY_RULE`, `RuleDecision.record`):
  the rule (its name, else `#N`, its 1-based place in the list; null when none matched), the budget
  applied, the cap, and whether the rollout is retried. A rollout a rule's budget closed says
  `final_reason` `retry_rule_budget_exhausted`; one its cap closed, `retry_cap_reached`; one closed by
  `max_attempts` still says `attempt_budget_exhausted`. With no rules (the default) no row has the key:
  the rows are what they were.
- The cap is counted where every row is saved, the collector's `record_attempt` (`RetryCaps`), so it
  holds on Ray too; it counts the retries granted by this `collect`: a resume counts afresh.
- Rules come from a JSON or TOML file and from `--retry-rule` flags
  (`gym_failures.collection._retry_rule_inputs`); the flags' rules come first, so a flag wins over
  the file for the failures both match. Any bad input is a `RetryRuleError`, one line.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    RootModel,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gym_failures import nemo_gym
from gym_failures.failure_kinds import FailureStage, classify_failure, require_failure_kind, wire_failure_kind
from gym_failures.row_keys import FINAL, FINAL_REASON, RETRY_RULE

RETRY_RULE_BUDGET_EXHAUSTED: Final = "retry_rule_budget_exhausted"
RETRY_CAP_REACHED: Final = "retry_cap_reached"
NOT_REPLAYED: Final = ("terminal", "possibly_delivered", RETRY_RULE_BUDGET_EXHAUSTED, RETRY_CAP_REACHED)
"""The final reasons no resume reopens (`retry_terminal` aside): NeMo Gym's `_ng_failure_terminal`."""
MAX_RULES: Final = 100
MAX_MESSAGE_CHARS: Final = 256
MAX_NAME_CHARS: Final = 64

FailureClassName = Literal["model", "evaluation", "unknown"]
_STATUS = re.compile(r"[45](?:[0-9][0-9]|xx)")
"""An error status (a failure has no other): a code 400-599, or a class, `4xx` or `5xx`."""
_NAME = rf"[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{MAX_NAME_CHARS - 1}}}"
_STAGES = frozenset(get_args(FailureStage))


class RetryRuleError(ValueError):
    """A retry rule, flag or file that cannot be used: its message is one line."""


def canonical_kind(kind: object) -> str | None:
    """A failure's kind as a rule names it: a NeMo Gym label read as its kind, a plain name the
    vocabulary does not know as `unregistered:<name>`; None for no kind, or one no name can be."""
    label = nemo_gym.nemo_label(kind)
    if label is None:
        return None
    try:
        return wire_failure_kind(label)
    except ValueError:
        return None


@dataclass(frozen=True)
class FailureFacts:
    """What a rule matches a failed attempt on."""

    kind: str | None
    reason: str
    stage: str | None = None
    status: int | None = None

    @functools.cached_property
    def failure_class(self) -> str:
        stage: Any = self.stage if self.stage in _STAGES else None
        return classify_failure(self.kind, stage, self.status).value

    @functools.cached_property
    def rule_kind(self) -> str | None:
        return canonical_kind(self.kind)


class RetryRule(BaseModel):
    """One retry rule: what it matches (each field optional) and the budget it gives."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    name: str | None = None
    kind: tuple[str, ...] | None = None
    failure_class: tuple[FailureClassName, ...] | None = None
    status: tuple[str, ...] | None = None
    message: str | None = Field(default=None, min_length=1, max_length=MAX_MESSAGE_CHARS)
    max_attempts: int | None = Field(default=None, ge=1, strict=True)
    max_retries_per_run: int | None = Field(default=None, ge=0, strict=True)
    _pattern: re.Pattern[str] | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(_NAME, value):
            raise ValueError(
                f"name must be 1 to {MAX_NAME_CHARS} letters, digits or _ . : -, the first a letter or digit"
            )
        return value

    @field_validator("kind", "failure_class", "status", mode="before")
    @classmethod
    def _listed(cls, value: object, info: ValidationInfo) -> object:
        # One value, or a non-empty list of them; a status as its text ("429", "5xx").
        if isinstance(value, str | int) and not isinstance(value, bool):
            value = (value,)
        if not isinstance(value, list | tuple):
            return value
        if not value:
            raise ValueError("an empty list matches nothing; leave the field out to match all")
        if info.field_name != "status":
            return value
        statuses = []
        for item in value:
            text = str(item).lower() if type(item) in (int, str) else ""
            if not _STATUS.fullmatch(text):
                raise ValueError(
                    f"{str(item)[:16]!r} is no error status: write a code (400-599) or a class (4xx, 5xx)"
                )
            statuses.append(text)
        return tuple(statuses)

    @field_validator("kind")
    @classmethod
    def _kinds(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        kinds = []
        for text in value:
            try:
                # A NeMo Gym label as its kind; a plain name the vocabulary does not know is refused
                # (a typo would match nothing), `unregistered:<label>` is how a rule names one.
                kinds.append(require_failure_kind(nemo_gym.nemo_label(text)))
            except (ValueError, TypeError):
                raise ValueError(
                    f"{text[:MAX_NAME_CHARS]!r} is no failure kind: name a registered kind, a "
                    "<server>:<kind>, a NeMo Gym label, or unregistered:<label>"
                ) from None
        return tuple(kinds)

    @field_validator("message")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except (re.error, OverflowError, RecursionError) as error:
                # A repeat count past the engine's limit is an OverflowError, not an `re.error`.
                raise ValueError(f"no valid regular expression ({error})") from None
        return value

    @model_validator(mode="after")
    def _decides_something(self) -> RetryRule:
        if self.max_attempts is None and self.max_retries_per_run is None:
            raise ValueError("a rule needs max_attempts or max_retries_per_run")
        return self

    def model_post_init(self, context: Any, /) -> None:
        self._pattern = None if self.message is None else re.compile(self.message)

    def matches(self, facts: FailureFacts) -> bool:
        """Whether every field this rule names matches `facts`."""
        if self.kind is not None and facts.rule_kind not in self.kind:
            return False
        if self.failure_class is not None and facts.failure_class not in self.failure_class:
            return False
        if self.status is not None and not _status_matches(self.status, facts.status):
            return False
        return self._pattern is None or self._pattern.search(facts.reason) is not None


def _status_matches(statuses: tuple[str, ...], status: int | None) -> bool:
    """Whether `status` is one of `statuses` (codes such as `429`, classes such as `5xx`)."""
    return status is not None and (str(status) in statuses or f"{status // 100}xx" in statuses)


@dataclass(frozen=True)
class RuleDecision:
    """The rule that decided a failure's budget (`rule` None: none matched, `max_attempts` applies)."""

    rule: str | None
    max_attempts: int
    own_budget: bool
    """The budget is the rule's own `max_attempts` (else the run's `max_attempts`)."""
    max_retries_per_run: int | None = None

    @property
    def exhausted(self) -> str:
        """The final reason of a failure at its budget."""
        return RETRY_RULE_BUDGET_EXHAUSTED if self.own_budget else "attempt_budget_exhausted"

    def record(self, retry: bool) -> dict[str, Any]:
        """The row's `_gf_retry_rule`."""
        record: dict[str, Any] = {"rule": self.rule, "max_attempts": self.max_attempts, "retry": retry}
        if self.max_retries_per_run is not None:
            record["max_retries_per_run"] = self.max_retries_per_run
        return record


class RetryRules(RootModel[tuple[RetryRule, ...]]):
    """The run's rules, in order: the first that matches decides. Empty (the default): none."""

    model_config = ConfigDict(frozen=True)

    root: tuple[RetryRule, ...] = ()

    @model_validator(mode="after")
    def _names_unique(self) -> RetryRules:
        if len(self.root) > MAX_RULES:
            raise ValueError(f"at most {MAX_RULES} rules, not {len(self.root)}")
        names = Counter(rule.name for rule in self.root if rule.name is not None)
        twice = sorted(name for name, count in names.items() if count > 1)
        if twice:
            raise ValueError(f"two rules are named {twice[0]!r}")
        return self

    def label(self, index: int) -> str:
        """How rows name the rule at `index`: its name, else `#N` (its 1-based place)."""
        rule = self.root[index]
        return rule.name if rule.name is not None else f"#{index + 1}"

    def find(self, label: object) -> RetryRule | None:
        """The rule rows name `label`, if any."""
        for index in range(len(self.root)):
            if self.label(index) == label:
                return self.root[index]
        return None

    def largest_budget(self, max_attempts: int) -> int:
        """The largest budget any failure can have: `max_attempts`, or a rule's when larger."""
        return max([max_attempts, *(rule.max_attempts or 0 for rule in self.root)])

    def decide(self, facts: FailureFacts, max_attempts: int) -> RuleDecision:
        """The budget `facts`' failure has (the first rule that matches, else `max_attempts`)."""
        for index, rule in enumerate(self.root):
            if rule.matches(facts):
                own = rule.max_attempts is not None
                budget = rule.max_attempts if rule.max_attempts is not None else max_attempts
                return RuleDecision(self.label(index), budget, own, rule.max_retries_per_run)
        return RuleDecision(None, max_attempts, False)

    def joined(self, other: RetryRules) -> RetryRules:
        """These rules, then `other`'s (a `RetryRuleError` for a repeated name or too many)."""
        return rules_of([*self.root, *other.root])


def rules_of(rules: Sequence[RetryRule | Mapping[str, Any]]) -> RetryRules:
    """`rules` as the run's `RetryRules`; a `RetryRuleError` naming the first problem."""
    try:
        return RetryRules.model_validate(tuple(rules))
    except ValidationError as error:
        raise RetryRuleError(one_line(error)) from None


class RetryCaps:
    """The retries each capped rule granted in this run, counted where every row is saved."""

    def __init__(self, rules: RetryRules) -> None:
        self.rules = rules
        self.granted: Counter[str] = Counter()

    def allows(self, row: dict[str, Any]) -> bool:
        """Count the retry `row` (a failed attempt its rule retries) takes from its rule's cap. When
        the cap is spent, False, and `row` is closed: `retry_cap_reached`."""
        record = row.get(RETRY_RULE)
        if not isinstance(record, dict) or record.get("retry") is not True:
            return True
        rule = self.rules.find(record.get("rule"))
        if rule is None or rule.max_retries_per_run is None:
            return True
        label = str(record["rule"])
        if self.granted[label] < rule.max_retries_per_run:
            self.granted[label] += 1
            return True
        row[FINAL] = True
        row[FINAL_REASON] = RETRY_CAP_REACHED
        row[RETRY_RULE] = {**record, "retry": False}
        # Never retried by NeMo Gym's resume either, in either row form (a NeMo Gym agent's flat row
        # included: the cap closed it, whatever flag the agent sent).
        row[nemo_gym.FAILURE_TERMINAL] = True
        return False


def one_line(error: ValidationError) -> str:
    """A validation error's first problem, as one line naming where it is (never the input)."""
    item = error.errors(include_url=False, include_input=False)[0]
    loc = list(item["loc"])
    # `(0, "kind", 1)`: rule 1's kind (which of its values the message says).
    first = loc[0] if loc else None
    place = [f"rule {first + 1}"] if isinstance(first, int) else []
    loc = loc[1:] if place else loc
    # A key is the file's own text: one that is not printable is shown quoted (a newline in a key must
    # not make the refusal two lines).
    keys = [part if part.isprintable() else repr(part) for part in loc if isinstance(part, str)]
    where = ", ".join([*place, *(key[:64] for key in keys)])
    cause = (item.get("ctx") or {}).get("error")
    text = str(cause) if item["type"] == "value_error" and cause is not None else str(item["msg"])
    text = " ".join(text.split())
    return f"{where}: {text}" if where else text
