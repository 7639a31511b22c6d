"""Coverage: what a run's saved rows cover, every rollout counted once by its final outcome.

Every rollout (`rollout_id`) is counted once (`Coverage`), by its final outcome: a success
row if it has one (a success settles the rollout, whatever failed before), else its final failure row
(the highest attempt when there are several). A failure row that is not final is an attempt that was
retried, never an outcome; a rollout with only such rows has no outcome yet and is missing. A row
without a rollout id (some legacy rows) is a rollout of its own. A success row is `scored` when it has a
verdict and no gate class; one with a gate class is counted under it, by the class's responsibility
(`classify_failure`); a final failure row is counted by the responsibility of its kind, stage and the
HTTP status of its failure event (else the row's `_ng_failure_http_status`). A masked success (NeMo
Gym's `mask_sample` true: a complete result that must not be trained on) is an outcome counted as
`masked`, never scored and never a failure. A degraded success (a `failure_kind` named, `mask_sample`
not true) is a valid measurement, as NeMo Gym reads it: scored like any other success, and counted
again, apart, as `degraded` (by kind in `degraded_by_kind`), so a run that degraded says so. A row
with neither `result` nor `failure` is no rollout row and is skipped (`other_rows`); a row NeMo Gym
marked never to be saved is skipped and counted apart
(`not_persisted_rows`). Rows in NeMo Gym's own forms are read as `gym_failures.rows.normalized` reads
them; a rollout whose NeMo Gym failure rows are as many as the attempt budget (older rows carry no
attempt index) ends in its last one, as NeMo Gym's resume counts it.

`expected`, the rollouts the run should have, comes from the caller when given (`expected_source`
`"given"`); else, for `read_coverage`, from the materialized inputs beside the row files
(`<output>_materialized_inputs.jsonl`, one line per rollout owed, which NeMo Gym writes and counts its
coverage against: `nemo_gym/rollout_collection.py` `_coverage_report`; `"materialized_inputs"`); else
from the collection manifests (`<output>.manifest.json`, `expected_rollouts`: tasks times
`num_repeats`; several runs' files sum their runs', `"manifest"`); else it is the number of distinct
rollouts seen (`"rows_seen"`). The last cannot count a rollout that left no row at all as missing,
so the verdict then carries a warning (`GateVerdict.warnings`); it does not fail the run by itself.
Each run is counted by its own: its materialized inputs if it has them, else its manifest, else the
rollouts it shows; several runs are counted apart and added up (`gym_failures.gate._runs`).

With the materialized inputs, the gate knows which rollouts are owed, not only how many: a rollout in
them that left no row at all (killed mid-flight: NeMo Gym's kill-shaped rows are never saved; or
drained, never started) is missing and named (`missing_rollouts`, the first `MAX_LISTED_MISSING`
by task and rollout; `left_no_row` counts them, NeMo Gym's `_missing_rollout_rows_counted_as_zero`),
and an outcome of a rollout they do not hold is `unexpected`.

A success row whose saved report names a failure of its own (`_ng_failure_id`) is **tainted**: the
agent answered, but a call its answer was built on ended in failure (a cut stream joined into the
answer, a call whose retries ran out and was caught; `gym_failures.calls`). Seen is not handled: a
tainted result is not a clean measurement. It is an outcome of its own (`tainted`, by the failure's
kind in `tainted_by_kind`), never scored unless the caller asks (`score_tainted=True`, `gate
--score-tainted`: then it is judged as any success and counted apart as `tainted`, as `degraded` is),
and it counts against its failure's responsibility class like a failed outcome (`by_class`), so the
evaluation-side share sees an infrastructure failure that an agent absorbed. A masked result stays
masked (it is not trained on either way).

A row is read, never trusted: a value of the wrong type (a list where a string belongs, a number for
a mapping) is no evidence, and no row makes the gate raise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, cast, get_args

from gym_failures import failure_kinds

# The module, for the annotations: `failure_kinds.FailureClassificationConfig` loads on first use, so
# `typing.get_type_hints` on these functions loads it rather than failing on a name never imported.
from gym_failures._http_status import http_status
from gym_failures.failure_kinds import (
    EMPTY_ANSWER,
    GRADING_WITHOUT_VERDICT,
    MALFORMED_ANSWER,
    TRUNCATED_ANSWER,
    FailureClass,
    FailureStage,
    classify_failure,
    http_status_can_change_class,
)
from gym_failures.gate._answers import DEFAULT_RULES, GateRule, derive_gate_kind, has_verdict
from gym_failures.gate._groups import GroupCoverage, group_coverage
from gym_failures.nemo_gym import FAILURE_HTTP_STATUS, Inventory, degraded_kind, max_rollout_attempts
from gym_failures.rows import (
    is_not_persisted,
    is_rollout_row,
    normalized,
    rollout_id,
)

_STAGES: frozenset[str] = frozenset(get_args(FailureStage))

ExpectedSource = Literal["given", "materialized_inputs", "manifest", "rows_seen"]

# `FailureReportRow.FAILURE_ID`, named here so the gate starts without the transport modules.
_FAILURE_ID_KEY = "_ng_failure_id"

MAX_LISTED_MISSING = 100
"""How many missing rollouts `Coverage.missing_rollouts` names; `missing` counts them all."""
_EXPECTED_SOURCES: frozenset[str] = frozenset(get_args(ExpectedSource))

# The stage each gate class arises in, as classification evidence: the answer faults are the
# policy's generation (agent), a missing verdict is the grader's (verification).
_GATE_KIND_STAGE: dict[str, FailureStage] = {
    TRUNCATED_ANSWER: "agent",
    EMPTY_ANSWER: "agent",
    MALFORMED_ANSWER: "agent",
    GRADING_WITHOUT_VERDICT: "verification",
}


def gate_kind_class(kind: str, config: failure_kinds.FailureClassificationConfig | None = None) -> str:
    """The responsibility class of a gate-derived kind (`classify_failure` with the stage it arises in)."""
    return classify_failure(kind, _GATE_KIND_STAGE.get(kind), config=config).value


def _class_counts() -> dict[str, int]:
    return {failure_class.value: 0 for failure_class in FailureClass}


@dataclass(frozen=True, kw_only=True)
class Coverage:
    """What a run's saved rows cover: every expected rollout is scored, gate-derived, failed,
    unscored or missing (see the module docstring). Counts are ints; a value of another type is
    refused (`TypeError`), so a coverage is always what `as_dict` can print."""

    expected: int
    seen: int
    """Distinct rollouts with any row."""
    scored: int
    """Success rows with a verdict and no gate class."""
    unscored: int = 0
    """Success rows with neither a verdict nor a gate class (only with rules that let them pass)."""
    masked: int = 0
    """Success rows whose result must not be trained on (NeMo Gym's `mask_sample`): outcomes, not scored."""
    degraded: int = 0
    """Of `scored`, the results that name a `failure_kind` without `mask_sample`: valid measurements
    that degraded on the way, as NeMo Gym reads them."""
    degraded_by_kind: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=_class_counts)
    """Final failure outcomes by class (model, evaluation, unknown)."""
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    failed_by_root_kind: dict[str, int] = field(default_factory=dict)
    """Final failure outcomes by their root cause's kind: the origin of the failure's cause chain (a
    wrapped model failure's own kind), read from the saved report or, in a NeMo Gym row, from the
    innermost error body it kept (`gym_failures.reporting._roots.row_root`); the failure's own kind
    when it is its own root or nothing names one."""
    gate_derived: dict[str, int] = field(default_factory=_class_counts)
    """Gate-derived outcomes by class."""
    gate_derived_by_kind: dict[str, int] = field(default_factory=dict)
    tainted: int = 0
    """Success rows built on a call that ended in failure (their report names a failure of its own):
    outcomes, not scored (unless `tainted_scored`)."""
    tainted_by_class: dict[str, int] = field(default_factory=_class_counts)
    """Tainted outcomes by the responsibility class of the failure they name."""
    tainted_by_kind: dict[str, int] = field(default_factory=dict)
    tainted_scored: bool = False
    """Whether tainted results were judged as any success (`score_tainted`): then `tainted` counts a
    part of the other outcomes, as `degraded` does."""
    retried_attempts: int = 0
    """Failure rows that were not final and that a later attempt of their rollout replaced."""
    unfinished_attempts: int = 0
    """Failure rows that were not final and are still their rollout's last attempt: nothing retried
    them yet (NeMo Gym's failed `/run` waiting for its `--resume`, or a run stopped early). Neither
    retried nor outcomes: their rollouts are missing until a resume settles them."""
    missing: int
    """Expected rollouts without a final outcome."""
    left_no_row: int = 0
    """Of `missing`, the rollouts the materialized inputs owe that left no row at all (0 without them)."""
    missing_rollouts: list[str] = field(default_factory=list)
    """The missing rollouts' ids (`<task>:<rollout>`), the first `MAX_LISTED_MISSING` by task and
    rollout; known only from the materialized inputs (empty without them)."""
    unexpected: int = 0
    """Outcomes beyond `expected` (a wrong `expected`, or runs mixed together)."""
    other_rows: int = 0
    """Rows with neither a `result` nor a `failure`: not rollout rows, skipped."""
    not_persisted_rows: int = 0
    """Rows NeMo Gym marked never to be saved (`_ng_no_persist`, `_ng_dispatch_drained`): skipped."""
    invalid_lines: int = 0
    inventory_invalid_lines: int = 0
    """Lines of the materialized inputs that name no rollout (not an object with both indices)."""
    torn_tails: int = 0
    expected_source: ExpectedSource = "given"
    """Where `expected` came from: the caller, the materialized inputs, the collection manifests (also
    when some runs had materialized inputs and others only a manifest), or the rollouts seen."""
    manifests: list[str] = field(default_factory=list)
    """The manifests, or the materialized inputs, `expected` was read from."""
    groups: GroupCoverage | None = None
    """The prompt groups against a minimum of valid members each, when one was asked for
    (`min_valid_per_group`; `gym_failures.gate._groups`)."""

    def __post_init__(self) -> None:
        # The annotations are strings here (`from __future__ import annotations`).
        for item in fields(self):
            value = getattr(self, item.name)
            if item.type == "int":
                _require_int(item.name, value)
            elif item.type == "dict[str, int]":
                if not isinstance(value, dict):
                    raise TypeError(f"Coverage.{item.name} is a dict, not {type(value).__name__}")
                for key, count in value.items():
                    _require_int(f"{item.name}[{key!r}]", count)
        if self.expected_source not in _EXPECTED_SOURCES:
            raise ValueError(f"Coverage.expected_source is one of {sorted(_EXPECTED_SOURCES)}")

    @property
    def outcomes(self) -> int:
        """Rollouts with a final outcome."""
        return (
            self.scored
            + self.unscored
            + self.masked
            + sum(self.failed.values())
            + sum(self.gate_derived.values())
            + (0 if self.tainted_scored else self.tainted)
        )

    @property
    def line(self) -> str:
        """ "N of M scored"."""
        return f"{self.scored} of {self.expected} scored"

    def share(self, count: int) -> float:
        """`count` as a share of the expected rollouts (0 when none are expected)."""
        return count / self.expected if self.expected else 0.0

    def by_class(self, failure_class: FailureClass) -> int:
        """Failed, gate-derived and (unless scored) tainted outcomes of one class."""
        tainted = 0 if self.tainted_scored else self.tainted_by_class.get(failure_class.value, 0)
        return self.failed[failure_class.value] + self.gate_derived[failure_class.value] + tainted

    def as_dict(self) -> dict[str, Any]:
        """Every field, then `outcomes` and `line`: JSON-ready (`gym-failures gate --json`)."""
        return {**asdict(self), "outcomes": self.outcomes, "line": self.line}


def _require_int(name: str, value: object) -> None:
    if type(value) is not int:
        raise TypeError(f"Coverage.{name} is an int, not {type(value).__name__}")


@dataclass
class _Outcome:
    rank: int  # a success (1) settles a rollout over a final failure (0)
    attempt: int
    category: str  # "scored", "unscored", "masked", "failed", "gate" or "tainted"
    kind: str | None = None
    failure_class: str | None = None
    degraded: str | None = None  # a scored result's degraded kind
    tainted: tuple[str, str] | None = None  # a tainted result's failure: its kind and class
    root: str | None = None  # a final failure's root cause's kind


def _attempt(row: Mapping[str, Any]) -> int:
    attempt = row.get("attempt")
    return attempt if type(attempt) is int else 1


def _failure_evidence(
    row: Mapping[str, Any], config: failure_kinds.FailureClassificationConfig | None
) -> tuple[str | None, FailureStage | None, int | None]:
    """The kind, stage and HTTP status of a failure row: the `EpisodeFailure`'s own kind and stage,
    else its failure event's; the HTTP status is the failure event's, else the row's.

    The saved report is read (and validated) only when the row's own kind and stage leave something
    to find in it: a row with both whose status cannot change its class
    (`http_status_can_change_class`) is classified alike whatever its report holds, so its status is
    not looked up (None). tests/gate/test_gate_startup.py checks this against reading every report.
    """
    failure = row.get("failure")
    failure = failure if isinstance(failure, Mapping) else {}
    kind = failure.get("failure_kind")
    kind = kind if isinstance(kind, str) else None
    stage = failure.get("stage")
    stage = stage if isinstance(stage, str) and stage in _STAGES else None
    if kind is not None and stage is not None and not http_status_can_change_class(kind, config):
        return kind, cast(FailureStage, stage), None
    # Imported here: the report's models and the transport modules are the gate's largest start-up
    # cost, and most failure rows are classified without them (see above).
    from gym_failures.failure_transport import FailureReportRow

    report = FailureReportRow.report(row)
    event = report.events.get(report.failure_id) if report.failure_id is not None else None
    if kind is None and event is not None:
        kind = event.failure_kind
    if stage is None and event is not None:
        stage = event.stage
    status = event.http_status if event is not None else None
    if status is None:
        # NeMo Gym's own key for the status, which gym-failures writes too (docs/rows.md).
        saved = row.get(FAILURE_HTTP_STATUS)
        status = http_status(saved)
    return kind, cast(FailureStage | None, stage), status


def tainted_failure(
    row: Mapping[str, Any], config: failure_kinds.FailureClassificationConfig | None = None
) -> tuple[str, str] | None:
    """The failure a success row was built on (its report's own failure: kind and responsibility
    class), or None for a row whose report names none (see the module docstring)."""
    named = row.get(_FAILURE_ID_KEY)
    if named is None:
        return None
    if not isinstance(named, str):
        # Not an id: the row was changed after it was saved; it named a failure, as `summarize` reads it.
        return ("(unreadable)", FailureClass.UNKNOWN.value)
    # Imported here, as in `_failure_evidence`: most rows name no failure of their own.
    from gym_failures.failure_transport import FailureReportRow

    report = FailureReportRow.report(row)
    event = report.events.get(report.failure_id) if report.failure_id is not None else None
    if event is None:
        # An invalid saved report (read as omitted): it named a failure, which is evidence enough.
        return ("(unreadable)", FailureClass.UNKNOWN.value)
    failure_class = classify_failure(event.failure_kind, event.stage, event.http_status, config=config)
    return (event.failure_kind, failure_class.value)


def _outcome(
    row: Mapping[str, Any],
    rules: Sequence[GateRule],
    config: failure_kinds.FailureClassificationConfig | None,
    score_tainted: bool = False,
) -> _Outcome | None:
    """The outcome `row` records, or None for an attempt that was retried."""
    if "failure" not in row:
        if row.get("masked") is True:
            return _Outcome(1, _attempt(row), "masked")
        tainted = tainted_failure(row, config)
        if tainted is not None and not score_tainted:
            return _Outcome(1, _attempt(row), "tainted", tainted[0], tainted[1], tainted=tainted)
        kind = derive_gate_kind(row, rules)
        if kind is not None:
            return _Outcome(1, _attempt(row), "gate", kind, gate_kind_class(kind, config), tainted=tainted)
        if not has_verdict(row):
            return _Outcome(1, _attempt(row), "unscored", tainted=tainted)
        return _Outcome(1, _attempt(row), "scored", degraded=degraded_kind(row), tainted=tainted)
    if row.get("final") is not True:
        return None
    kind, stage, status = _failure_evidence(row, config)
    failure_class = classify_failure(kind, stage, status, config=config).value
    # Imported here: read for final failures only (no pydantic, no DuckDB on its path).
    from gym_failures.reporting._roots import row_root

    found = row_root(row)
    root = found.failure_kind if found is not None and found.failure_kind else kind
    return _Outcome(0, _attempt(row), "failed", kind, failure_class, root=root)


def rollout_coverage(
    rows: Iterable[Mapping[str, Any]],
    expected: int | None = None,
    rules: Sequence[GateRule] = DEFAULT_RULES,
    config: failure_kinds.FailureClassificationConfig | None = None,
    max_attempts: int | None = None,
    inventory: Inventory | None = None,
    score_tainted: bool = False,
    min_valid_per_group: int | None = None,
) -> Coverage:
    """The coverage of `rows` (in any supported form; each is normalized first, `max_attempts` being
    the budget that makes a NeMo Gym failure row final: NeMo Gym's own when None). With an
    `inventory` (the run's materialized inputs) and no `expected`, the inventory's rollouts are the
    rollouts expected (see the module docstring); with both, the inventory still names each group's
    members. `score_tainted` judges a tainted result as any
    success (counted apart all the same). With `min_valid_per_group`, the prompt groups are counted
    against that many valid members each (`Coverage.groups`)."""
    outcomes: dict[str, _Outcome] = {}
    seen: set[str] = set()
    other = not_persisted = 0
    # Per rollout: its rows' attempts that were not final, its latest attempt (only a later one retries).
    not_final: dict[str, list[int]] = {}
    latest: dict[str, int] = {}
    closed_copy: set[str] = set()  # the rollouts a resume closed with a copy of their last failure
    # NeMo Gym's own failure rows, per rollout: one attempt a row, whatever their attempt indices say.
    nemo_failures: dict[str, list[Mapping[str, Any]]] = {}
    for index, raw in enumerate(rows):
        row = normalized(raw, max_attempts)
        if is_not_persisted(row):
            not_persisted += 1
            continue
        if not is_rollout_row(row):
            other += 1
            continue
        key = row.get("rollout_id")
        key = key if isinstance(key, str) else f"<row {index}>"
        seen.add(key)
        attempt = _attempt(row)
        latest[key] = max(latest.get(key, attempt), attempt)
        if row.get("closed_on_resume") is True:
            closed_copy.add(key)
        outcome = _outcome(row, rules, config, score_tainted)
        if outcome is None:
            not_final.setdefault(key, []).append(attempt)
            if row.get("from_nemo_gym") is True:
                nemo_failures.setdefault(key, []).append(row)
            continue
        current = outcomes.get(key)
        if current is None or (outcome.rank, outcome.attempt) >= (current.rank, current.attempt):
            outcomes[key] = outcome
    budget = max_rollout_attempts() if max_attempts is None else max_attempts
    for key, failures in nemo_failures.items():
        if key not in outcomes and len(failures) >= budget:
            # Older rows carry no attempt index: the budget is spent by count, as NeMo Gym's resume
            # counts it, and the last row is the final failure (no longer a retried attempt).
            closing = {**failures[-1], "final": True, "final_reason": "attempt_budget_exhausted"}
            outcomes[key] = cast(_Outcome, _outcome(closing, rules, config))
            not_final[key].pop()
    retried = unfinished = 0
    for key, attempts in not_final.items():
        # A rollout has one last attempt (rows that carry no attempt index: the last of them); a
        # resume's closing copy of it is no later attempt: the attempt was closed, never retried.
        last = int(
            bool(attempts) and max(attempts) == latest[key] and (key not in outcomes or key in closed_copy)
        )
        unfinished += last if key not in outcomes else 0
        retried += len(attempts) - last
    coverage = _coverage(outcomes, len(seen), retried, other, expected, score_tainted)
    coverage = replace(coverage, unfinished_attempts=unfinished)
    owed = None
    if inventory is not None:
        owed = [rollout_id(*key) for key in inventory.keys]
        if expected is None:
            coverage = _against_inventory(coverage, outcomes, seen, inventory)
    if min_valid_per_group is not None:
        categories = {key: outcome.category for key, outcome in outcomes.items()}
        groups = group_coverage(categories, min_valid_per_group, owed, seen=seen)
        coverage = replace(coverage, groups=groups)
    return replace(coverage, not_persisted_rows=not_persisted) if not_persisted else coverage


def _against_inventory(
    coverage: Coverage, outcomes: Mapping[str, _Outcome], seen: set[str], inventory: Inventory
) -> Coverage:
    """`coverage` counted against the rollouts the inventory owes."""
    owed = {rollout_id(*key): key for key in inventory.keys}
    missing = sorted((key for rollout, key in owed.items() if rollout not in outcomes))
    return replace(
        coverage,
        expected=len(owed),
        expected_source="materialized_inputs",
        manifests=[str(path) for path in inventory.paths],
        missing=len(missing),
        left_no_row=sum(rollout_id(*key) not in seen for key in missing),
        missing_rollouts=[rollout_id(*key) for key in missing[:MAX_LISTED_MISSING]],
        unexpected=sum(rollout not in owed for rollout in outcomes),
        inventory_invalid_lines=inventory.invalid_lines,
    )


def _coverage(
    outcomes: Mapping[str, _Outcome],
    seen: int,
    retried: int,
    other: int,
    expected: int | None,
    score_tainted: bool = False,
) -> Coverage:
    categories: Counter[str] = Counter(outcome.category for outcome in outcomes.values())
    failed, gate_derived, tainted = _class_counts(), _class_counts(), _class_counts()
    failed_by_kind: Counter[str] = Counter()
    failed_by_root: Counter[str] = Counter()
    gate_by_kind: Counter[str] = Counter()
    degraded_by_kind: Counter[str] = Counter()
    tainted_by_kind: Counter[str] = Counter()
    for outcome in outcomes.values():
        if outcome.degraded is not None:
            degraded_by_kind[outcome.degraded] += 1
        if outcome.tainted is not None:
            tainted_by_kind[outcome.tainted[0]] += 1
            tainted[outcome.tainted[1]] += 1
        if outcome.category == "failed":
            assert outcome.failure_class is not None
            failed[outcome.failure_class] += 1
            failed_by_kind[outcome.kind or "(none)"] += 1
            failed_by_root[outcome.root or "(none)"] += 1
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
        masked=categories["masked"],
        degraded=sum(degraded_by_kind.values()),
        degraded_by_kind=dict(degraded_by_kind.most_common()),
        failed=failed,
        failed_by_kind=dict(failed_by_kind.most_common()),
        failed_by_root_kind=dict(failed_by_root.most_common()),
        gate_derived=gate_derived,
        gate_derived_by_kind=dict(gate_by_kind.most_common()),
        tainted=sum(tainted_by_kind.values()),
        tainted_by_class=tainted,
        tainted_by_kind=dict(tainted_by_kind.most_common()),
        tainted_scored=score_tainted,
        retried_attempts=retried,
        missing=max(0, expected - len(outcomes)),
        unexpected=max(0, len(outcomes) - expected),
        other_rows=other,
    )
