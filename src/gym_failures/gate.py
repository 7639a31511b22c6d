"""The acceptance gate: whether a run's saved rows are complete and clean enough to train or report on.

The gate reads the rows Collection saved (`gym_failures.collection`, any supported form, legacy
sidecar rows included), counts each rollout once by its final outcome, derives the gate classes
(`GATE_DERIVED_KINDS`) from success rows, and checks the counts against `GateThresholds`.

Success-row contract (what the default rules read from a success row's `result`):

- `result["reward"]`: a float, or None.
- `result["response"]`: the policy's final response, either
  - an OpenAI Responses object: `status` (`"completed"`, `"incomplete"`, ...),
    `incomplete_details.reason` (`"max_output_tokens"`, ...), and `output`, a list of items whose
    `message` items hold `content` parts; the parts of type `output_text` carry the answer in `text`.
    A top-level `output_text` string (the SDK's own join of those parts) is accepted when the items
    hold no text; or
  - a chat completion: `choices[0].finish_reason` (`"stop"`, `"length"`, ...) and
    `choices[0].message.content` (a string, or a list of parts with `text`).
  A result without a response in either shape gives the answer rules no evidence: they return None,
  and only the verification is judged.
- `result["verification"]`: the verifier's account, a mapping with `verdict` (a bool, a number or a
  non-empty string; None or absent when no verdict was reached) and, for a verifier that extracts
  answers, `extracted_answer` (the extracted text, or None when extraction failed; a verifier that
  does not extract leaves the key out).

Rules (`DEFAULT_RULES`, in this order; the first that returns a kind wins):

1. `truncated_answer`: a Responses object with status `incomplete` and reason `max_output_tokens`,
   or a chat `finish_reason` of `length`.
2. `empty_answer`: a response with no final output text (whitespace only counts as none).
3. `malformed_answer`: a verification with `extracted_answer` None while the output text is not empty.
4. `grading_without_verdict`: no verdict, because the verification is missing or its verdict is None.

The order puts cause before symptom, following the pipeline (generation, extraction, grading): an
answer cut off by the token limit is often empty (reasoning used the budget) and cannot be parsed; an
empty answer leaves nothing to extract; and a verifier handed no answer returns no verdict. Reporting
the earliest fault names the policy's own behaviour (model-side) rather than its evaluation-side
symptom, which would otherwise be blamed on the grader. A rule is any callable from a row to a kind
or None; pass your own list to replace or extend these (for an environment whose `reward` is its
verdict, for instance, drop `grading_without_verdict`).

Coverage (`Coverage`): every rollout (`rollout_id`) is counted once, by its final outcome: a success
row if it has one (a success settles the rollout, whatever failed before), else its final failure row
(the highest attempt when there are several). A failure row that is not final is an attempt that was
retried, never an outcome; a rollout with only such rows has no outcome yet and is missing. A row
without a rollout id (some legacy rows) is a rollout of its own. A success row is `scored` when it has a
verdict and no gate class; one with a gate class is counted under it, by the class's responsibility
(`classify_failure`); a final failure row is counted by the responsibility of its kind, stage and the
HTTP status of its failure event. A row with neither `result` nor `failure` is no rollout row and is
skipped (`other_rows`).

`expected`, the rollouts the run should have, comes from the caller when given (`expected_source`
`"given"`); else, for `read_coverage`, from the collection manifests beside the row files
(`<output>.manifest.json`, `expected_rollouts`: tasks times `num_repeats`; several runs' files sum
their runs', `"manifest"`); else it is the number of distinct rollouts seen (`"rows_seen"`). The last
cannot count a rollout that left no row at all as missing, so the verdict then carries a warning
(`GateVerdict.warnings`); it does not fail the run by itself.

A row is read, never trusted: a value of the wrong type (a list where a string belongs, a number for
a mapping) is no evidence, and no row makes the gate raise.

This module imports pydantic, the standard library and the row reader only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, computed_field

from gym_failures.failure_kinds import (
    EMPTY_ANSWER,
    GRADING_WITHOUT_VERDICT,
    MALFORMED_ANSWER,
    TRUNCATED_ANSWER,
    FailureClass,
    FailureClassificationConfig,
    FailureStage,
    classify_failure,
)
from gym_failures.failure_transport import FailureReportRow
from gym_failures.rows import JsonlScan, manifest_expected_rollouts, normalized, read_rows

__all__ = [
    "DEFAULT_RULES",
    "Coverage",
    "GateRule",
    "GateThresholds",
    "GateVerdict",
    "check",
    "derive_gate_kind",
    "empty_answer",
    "grading_without_verdict",
    "has_verdict",
    "malformed_answer",
    "output_text",
    "read_coverage",
    "rollout_coverage",
    "truncated_answer",
]

GateRule = Callable[[Mapping[str, Any]], str | None]
"""A rule: a success row (normalized) to the gate class it derives, or None."""

_STAGES: frozenset[str] = frozenset(get_args(FailureStage))

# The stage each gate class arises in, as classification evidence: the answer faults are the
# policy's generation (agent), a missing verdict is the grader's (verification).
_GATE_KIND_STAGE: dict[str, FailureStage] = {
    TRUNCATED_ANSWER: "agent",
    EMPTY_ANSWER: "agent",
    MALFORMED_ANSWER: "agent",
    GRADING_WITHOUT_VERDICT: "verification",
}


# --- Reading a success row ---------------------------------------------------------------------


def _mapping(value: object) -> Mapping[str, Any] | None:
    # Rows come from json.loads: a dict is the common case, and an ABC check costs ten times more.
    if type(value) is dict:
        return value
    return value if isinstance(value, Mapping) else None


def _result(row: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(row.get("result")) or {}


def _response(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    response = _mapping(_result(row).get("response"))
    if response is None:
        return None
    if isinstance(response.get("output"), list) or "status" in response or "output_text" in response:
        return response
    if _first_choice(response) is not None:
        return response
    return None


def _first_choice(response: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = response.get("choices")
    if isinstance(choices, list) and choices:
        return _mapping(choices[0])
    return None


def _text_parts(content: object, part_types: frozenset[str]) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    texts = []
    for part in content:
        part = _mapping(part)
        if part is None:
            continue
        kind = part.get("type")
        if isinstance(kind, str) and kind in part_types and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return texts


def output_text(response: Mapping[str, Any]) -> str:
    """The final output text of a Responses object or a chat completion; "" when it has none."""
    choice = _first_choice(response)
    if choice is not None:
        message = _mapping(choice.get("message")) or {}
        return "".join(_text_parts(message.get("content"), frozenset({"text", "output_text"})))
    texts: list[str] = []
    output = response.get("output")
    if isinstance(output, list):
        for item in output:
            item = _mapping(item)
            if item is not None and item.get("type") == "message":
                texts.extend(_text_parts(item.get("content"), frozenset({"output_text"})))
    if not "".join(texts).strip() and isinstance(response.get("output_text"), str):
        return str(response["output_text"])
    return "".join(texts)


def _verification(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return _mapping(_result(row).get("verification"))


def has_verdict(row: Mapping[str, Any]) -> bool:
    """Whether a success row's verification reached a verdict (`False` and `0` are verdicts)."""
    verification = _verification(row)
    if verification is None:
        return False
    verdict = verification.get("verdict")
    if isinstance(verdict, str):
        return bool(verdict.strip())
    return isinstance(verdict, bool | int | float)


# --- The rules ---------------------------------------------------------------------------------


def truncated_answer(row: Mapping[str, Any]) -> str | None:
    """`truncated_answer` when the response stopped at its output-token limit."""
    response = _response(row)
    if response is None:
        return None
    choice = _first_choice(response)
    if choice is not None:
        return TRUNCATED_ANSWER if choice.get("finish_reason") == "length" else None
    details = _mapping(response.get("incomplete_details")) or {}
    if response.get("status") == "incomplete" and details.get("reason") == "max_output_tokens":
        return TRUNCATED_ANSWER
    return None


def empty_answer(row: Mapping[str, Any]) -> str | None:
    """`empty_answer` when the response holds no final output text."""
    response = _response(row)
    if response is None:
        return None
    return EMPTY_ANSWER if not output_text(response).strip() else None


def malformed_answer(row: Mapping[str, Any]) -> str | None:
    """`malformed_answer` when the verifier could not extract an answer from non-empty output."""
    response = _response(row)
    verification = _verification(row)
    if response is None or verification is None or "extracted_answer" not in verification:
        return None
    if verification["extracted_answer"] is None and output_text(response).strip():
        return MALFORMED_ANSWER
    return None


def grading_without_verdict(row: Mapping[str, Any]) -> str | None:
    """`grading_without_verdict` when the verification is missing or reached no verdict."""
    return None if has_verdict(row) else GRADING_WITHOUT_VERDICT


DEFAULT_RULES: tuple[GateRule, ...] = (
    truncated_answer,
    empty_answer,
    malformed_answer,
    grading_without_verdict,
)
"""The default rules, in precedence order (see the module docstring for why)."""


def derive_gate_kind(row: Mapping[str, Any], rules: Sequence[GateRule] = DEFAULT_RULES) -> str | None:
    """The gate class of a success row: the first kind a rule returns, else None."""
    for rule in rules:
        kind = rule(row)
        if kind is not None:
            return kind
    return None


# --- Coverage ----------------------------------------------------------------------------------


def _class_counts() -> dict[str, int]:
    return {failure_class.value: 0 for failure_class in FailureClass}


class Coverage(BaseModel):
    """What a run's saved rows cover: every expected rollout is scored, gate-derived, failed,
    unscored or missing (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    expected: int
    seen: int
    """Distinct rollouts with any row."""
    scored: int
    """Success rows with a verdict and no gate class."""
    unscored: int = 0
    """Success rows with neither a verdict nor a gate class (only with rules that let them pass)."""
    failed: dict[str, int] = Field(default_factory=_class_counts)
    """Final failure outcomes by class (model, evaluation, unknown)."""
    failed_by_kind: dict[str, int] = Field(default_factory=dict)
    gate_derived: dict[str, int] = Field(default_factory=_class_counts)
    """Gate-derived outcomes by class."""
    gate_derived_by_kind: dict[str, int] = Field(default_factory=dict)
    retried_attempts: int = 0
    """Failure rows that were not final: attempts a later one replaced."""
    missing: int
    """Expected rollouts without a final outcome."""
    unexpected: int = 0
    """Outcomes beyond `expected` (a wrong `expected`, or runs mixed together)."""
    other_rows: int = 0
    """Rows with neither a `result` nor a `failure`: not rollout rows, skipped."""
    invalid_lines: int = 0
    torn_tails: int = 0
    expected_source: Literal["given", "manifest", "rows_seen"] = "given"
    """Where `expected` came from: the caller, the collection manifests, or the rollouts seen."""
    manifests: list[str] = Field(default_factory=list)
    """The manifests `expected` was read from."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def outcomes(self) -> int:
        """Rollouts with a final outcome."""
        return self.scored + self.unscored + sum(self.failed.values()) + sum(self.gate_derived.values())

    @computed_field  # type: ignore[prop-decorator]
    @property
    def line(self) -> str:
        """ "N of M scored"."""
        return f"{self.scored} of {self.expected} scored"

    def share(self, count: int) -> float:
        """`count` as a share of the expected rollouts (0 when none are expected)."""
        return count / self.expected if self.expected else 0.0

    def by_class(self, failure_class: FailureClass) -> int:
        """Failed and gate-derived outcomes of one class."""
        return self.failed[failure_class.value] + self.gate_derived[failure_class.value]


@dataclass
class _Outcome:
    rank: int  # a success (1) settles a rollout over a final failure (0)
    attempt: int
    category: str  # "scored", "unscored", "failed" or "gate"
    kind: str | None = None
    failure_class: str | None = None


def _attempt(row: Mapping[str, Any]) -> int:
    attempt = row.get("attempt")
    return attempt if type(attempt) is int else 1


def _failure_evidence(row: Mapping[str, Any]) -> tuple[str | None, FailureStage | None, int | None]:
    """The kind, stage and HTTP status of a failure row: the `EpisodeFailure`'s own kind and stage,
    else its failure event's; the HTTP status is the failure event's."""
    failure = _mapping(row.get("failure")) or {}
    report = FailureReportRow.report(row)
    event = report.events.get(report.failure_id) if report.failure_id is not None else None
    kind = failure.get("failure_kind")
    if not isinstance(kind, str):
        kind = event.failure_kind if event is not None else None
    stage = failure.get("stage")
    if not (isinstance(stage, str) and stage in _STAGES):
        stage = event.stage if event is not None else None
    status = event.http_status if event is not None else None
    return kind, cast(FailureStage | None, stage), status


def _outcome(
    row: Mapping[str, Any], rules: Sequence[GateRule], config: FailureClassificationConfig | None
) -> _Outcome | None:
    """The outcome `row` records, or None for an attempt that was retried."""
    if "failure" not in row:
        kind = derive_gate_kind(row, rules)
        if kind is not None:
            failure_class = classify_failure(kind, _GATE_KIND_STAGE.get(kind), config=config).value
            return _Outcome(1, _attempt(row), "gate", kind, failure_class)
        return _Outcome(1, _attempt(row), "scored" if has_verdict(row) else "unscored")
    if row.get("final") is not True:
        return None
    kind, stage, status = _failure_evidence(row)
    failure_class = classify_failure(kind, stage, status, config=config).value
    return _Outcome(0, _attempt(row), "failed", kind, failure_class)


def rollout_coverage(
    rows: Iterable[Mapping[str, Any]],
    expected: int | None = None,
    rules: Sequence[GateRule] = DEFAULT_RULES,
    config: FailureClassificationConfig | None = None,
) -> Coverage:
    """The coverage of `rows` (in any supported form; each is normalized first)."""
    outcomes: dict[str, _Outcome] = {}
    seen: set[str] = set()
    retried = other = 0
    for index, raw in enumerate(rows):
        row = normalized(raw)
        if "failure" not in row and "result" not in row:
            other += 1
            continue
        key = row.get("rollout_id")
        key = key if isinstance(key, str) else f"<row {index}>"
        seen.add(key)
        outcome = _outcome(row, rules, config)
        if outcome is None:
            retried += 1
            continue
        current = outcomes.get(key)
        if current is None or (outcome.rank, outcome.attempt) >= (current.rank, current.attempt):
            outcomes[key] = outcome
    return _coverage(outcomes, len(seen), retried, other, expected)


def _coverage(
    outcomes: Mapping[str, _Outcome], seen: int, retried: int, other: int, expected: int | None
) -> Coverage:
    categories: Counter[str] = Counter(outcome.category for outcome in outcomes.values())
    failed, gate_derived = _class_counts(), _class_counts()
    failed_by_kind: Counter[str] = Counter()
    gate_by_kind: Counter[str] = Counter()
    for outcome in outcomes.values():
        if outcome.category == "failed":
            assert outcome.failure_class is not None
            failed[outcome.failure_class] += 1
            failed_by_kind[outcome.kind or "(none)"] += 1
        elif outcome.category == "gate":
            assert outcome.failure_class is not None
            assert outcome.kind is not None
            gate_derived[outcome.failure_class] += 1
            gate_by_kind[outcome.kind] += 1
    source: Literal["given", "rows_seen"] = "rows_seen" if expected is None else "given"
    expected = seen if expected is None else expected
    return Coverage(
        expected=expected,
        expected_source=source,
        seen=seen,
        scored=categories["scored"],
        unscored=categories["unscored"],
        failed=failed,
        failed_by_kind=dict(failed_by_kind.most_common()),
        gate_derived=gate_derived,
        gate_derived_by_kind=dict(gate_by_kind.most_common()),
        retried_attempts=retried,
        missing=max(0, expected - len(outcomes)),
        unexpected=max(0, len(outcomes) - expected),
        other_rows=other,
    )


def read_coverage(
    paths: Iterable[Path],
    expected: int | None = None,
    rules: Sequence[GateRule] = DEFAULT_RULES,
    config: FailureClassificationConfig | None = None,
) -> Coverage:
    """The coverage of the rows in `paths` (success and failure files, in any order).

    Without `expected`, the collection manifests beside the files give it (see the module docstring).
    Invalid lines and a torn last line are skipped and counted, as `read_rows` reads them.
    """
    paths = list(paths)
    manifests: list[Path] = []
    if expected is None:
        expected, manifests = manifest_expected_rollouts(paths)
    scans: list[JsonlScan] = []

    def rows() -> Iterable[dict[str, Any]]:
        for path in paths:
            scan = JsonlScan(path)
            scans.append(scan)
            yield from read_rows(path, scan)

    coverage = rollout_coverage(rows(), expected, rules, config)
    update: dict[str, Any] = {
        "invalid_lines": sum(len(scan.invalid_lines) for scan in scans),
        "torn_tails": sum(scan.torn_tail is not None for scan in scans),
    }
    if manifests:
        update.update(expected_source="manifest", manifests=[str(path) for path in manifests])
    return coverage.model_copy(update=update)


# --- The verdict -------------------------------------------------------------------------------


class GateThresholds(BaseModel):
    """What a run must meet to pass. The defaults are conservative: they fail a run rather than let
    an evaluation fault be trained on as a reward.

    - `min_scored_share` 0.95: at least 95% of the expected rollouts scored. Model-side outcomes are
      legitimate samples, but more than 5% of them usually means a configuration fault (a token
      budget too small for the task) worth a look before training.
    - `max_evaluation_share` 0.02: at most 2% evaluation-side outcomes (failed or gate-derived),
      the rate at which a rerun of the failed rollouts is cheaper than doubting the run.
    - `max_unknown_share` 0.0: every failure must be attributable; an unknown one could be either side.
    - `max_missing` 0: every expected rollout has a final outcome.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_scored_share: float = Field(default=0.95, ge=0.0, le=1.0)
    max_evaluation_share: float = Field(default=0.02, ge=0.0, le=1.0)
    max_unknown_share: float = Field(default=0.0, ge=0.0, le=1.0)
    max_missing: int = Field(default=0, ge=0)


class GateVerdict(BaseModel):
    """The gate's answer: `passed`, each threshold the coverage failed, and what weakens the answer."""

    model_config = ConfigDict(frozen=True)

    passed: bool
    reasons: list[str]
    coverage: Coverage
    thresholds: GateThresholds
    warnings: list[str] = Field(default_factory=list)
    """What the verdict could not check (such as an `expected` taken from the rows seen)."""


def check(coverage: Coverage, thresholds: GateThresholds | None = None) -> GateVerdict:
    """`coverage` against `thresholds` (the defaults when None)."""
    thresholds = thresholds or GateThresholds()
    reasons: list[str] = []
    if coverage.expected == 0:
        reasons.append("no rollouts expected or seen")
    else:
        scored = coverage.share(coverage.scored)
        if scored < thresholds.min_scored_share:
            reasons.append(
                f"scored share {scored:.2%} is below the minimum {thresholds.min_scored_share:.2%}"
            )
        evaluation = coverage.share(coverage.by_class(FailureClass.EVALUATION))
        if evaluation > thresholds.max_evaluation_share:
            reasons.append(
                f"evaluation-side share {evaluation:.2%} is above the maximum "
                f"{thresholds.max_evaluation_share:.2%}"
            )
        unknown = coverage.share(coverage.by_class(FailureClass.UNKNOWN))
        if unknown > thresholds.max_unknown_share:
            reasons.append(
                f"unknown-class share {unknown:.2%} is above the maximum {thresholds.max_unknown_share:.2%}"
            )
    if coverage.missing > thresholds.max_missing:
        reasons.append(f"{coverage.missing} rollouts missing (maximum {thresholds.max_missing})")
    if coverage.unexpected:
        reasons.append(f"{coverage.unexpected} more outcomes than the {coverage.expected} expected")
    warnings: list[str] = []
    if coverage.expected_source == "rows_seen":
        warnings.append(
            f"expected was taken from the {coverage.seen} distinct rollouts seen (no expected count was "
            "given and no collection manifest sits beside the rows): a rollout that left no row at all "
            "is not counted as missing"
        )
    return GateVerdict(
        passed=not reasons, reasons=reasons, coverage=coverage, thresholds=thresholds, warnings=warnings
    )
