"""The cause tree of saved rows: a row's failure at the root, its causes below, other observations beside.

A row's report (`FailureReportRow.report`) holds every failure observed for the attempt, across every
hop, each with its origin `event_id`, its boundary and at most one explicit cause. The tree starts at
the report's `failure_id` and follows `cause_id` down. Every other event is an observation (a model
call that was retried, a failure a success recovered from): each observation that nothing else names
as its cause starts a chain of its own, which ends where it reaches an event already shown.

A success row whose report names a failure of its own (`failure_id`) is **tainted**
(`RowExplanation.tainted`): the agent answered from a call that ended in failure (a cut stream joined
into its answer), by the rule `gym_failures.gate.tainted_failure` applies, so `explain`, `summarize`
and `gate` agree on which rows are tainted. Its failure and that failure's causes are the row's tree,
as a failure row's are; a success whose report holds events but no failure of its own recovered from
them (`recovered`).

A report marked `omitted` lost events on the way (one was too large to send, or the saved report was
invalid); the explanation says so, and a chain that ends in such a report may have lost its causes.
A kind this version does not register is shown as saved (`unregistered:<kind>`).

Rows are found by line (`line_row`: 1-based, counting every line of the file, blank and invalid ones
included, as editors and `grep -n` count them) or by rollout (`rollout_rows`). A rollout row has a
`result` (a success) or a `failure`; a row with neither (a record a tool wrote beside the rollouts, such
as the demo's injected faults) is no outcome of any rollout: `rollout_rows` skips it, as the gate does,
and `line_row` says what it is (`outcome` `"other"`) rather than calling it a success. The failed
attempt with the longest cause chain of a run (`longest_chain`) is the one the demo and the HTML
report show.

A NeMo Gym collector keeps no headers, so a row it wrote for a failed `/run` call holds no report;
it keeps the reply's body (`_ng_failure_response_body`, at most 2000 characters). When that body is
gym-failures' error body, the failure it names (kind, event id, boundary and reason, redacted and
bounded; as far as a cut body goes) is shown as `reported_failure`
(`gym_failures.nemo_gym.reported_failure`). A server `gym_failures.nemo_gym_server.instrument`
instrumented also puts its report into that body (`failure_report`: `gym_failures._body_report`);
a failure row with no saved events shows the chain that body holds as its tree, through NeMo Gym's
quoting too, with `chain_in_body` set on `reported_failure`. A row's reason is its envelope's,
read from the first of NeMo Gym's reason keys that holds one (`gym_failures.nemo_gym.REASON_KEYS`:
`_ng_failure_message`, `error`, `error_message`, ...).

The report is validated when read (`FailureReportRow.report`): every `cause_id` in it names an event of
the same report, and a report with a dangling cause is invalid as a whole and read as omitted with no
events. So every cause the tree follows is there to show.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gym_failures._body_report import body_report
from gym_failures._injected import is_injected
from gym_failures.failure_records import FailureEvent, FailureReport
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import safe_text
from gym_failures.nemo_gym import FAILURE_RESPONSE_BODY, degraded_kind, reported_failure
from gym_failures.row_keys import RETRY_RULE
from gym_failures.rows import is_not_persisted, is_rollout_row, normalized, parse_line

__all__ = [
    "MAX_TREE_DEPTH",
    "EventNode",
    "RowExplanation",
    "TaintedFailure",
    "explain_row",
    "line_row",
    "longest_chain",
    "rollout_rows",
    "with_retried",
]


class EventNode(BaseModel):
    """One event of the tree, with its cause below it."""

    model_config = ConfigDict(frozen=True)

    event: dict[str, Any]
    """The event as saved (`event_id`, `boundary`, `failure_kind`, ...), fields that are None left out."""
    cause: EventNode | None = None
    cause_shown_above: str | None = None
    """The event id of a cause already shown elsewhere in the tree."""
    causes_may_be_omitted: bool = False
    """The chain ends here in an omitted report: causes may have been lost on the way."""
    causes_cut: int = 0
    """Causes below this event not shown: the chain is deeper than `MAX_TREE_DEPTH`."""
    injected: bool = False
    """The event was injected on purpose, a test's fault (`gym_failures._injected.is_injected`)."""


class TaintedFailure(BaseModel):
    """The failure a tainted success row was built on: its report's own failure event."""

    model_config = ConfigDict(frozen=True)

    failure_kind: str
    """The event's kind; `(unreadable)` when the saved report is invalid (it named a failure, which
    is evidence enough: `gym_failures.gate.tainted_failure`)."""
    failure_class: str
    """Whose responsibility it is (`model`, `evaluation` or `unknown`), as the gate classifies it."""
    failure_id: str | None
    """The failure's event id (`_ng_failure_id`), the root of the row's tree; None when the saved
    report is invalid (read as omitted, with no events)."""


class RowExplanation(BaseModel):
    """What one saved row says about one attempt of one rollout."""

    model_config = ConfigDict(frozen=True)

    path: str
    line: int | None
    """1-based line number in `path` (as `grep -n` counts), when known."""
    outcome: Literal["success", "failure", "other", "invalid", "torn"]
    rollout_id: str | None = None
    attempt: int | None = None
    final: bool | None = None
    final_reason: str | None = None
    retry_rule: str | None = None
    """The retry rule that decided this failure's budget (`_gf_retry_rule`'s `rule`), when one did."""
    closed_on_resume: bool = False
    """The copy of a rollout's last failure a resume saved to close it (no attempt of its own)."""
    retried: bool | None = None
    """For a failure that was not final: whether a later attempt of its rollout is among the rows
    read (`rollout_rows`); False when none is (NeMo Gym's failed `/run` waits for its `--resume`, or
    the run stopped); None when only this row was read."""
    reward: float | None = None
    masked: bool = False
    """A complete result that must not be trained on (NeMo Gym's `mask_sample`)."""
    degraded_kind: str | None = None
    """A result that names this failure kind without `mask_sample`: a valid measurement that degraded."""
    tainted: TaintedFailure | None = None
    """A success built on a call that ended in failure (its report names a failure of its own): that
    failure. None for every failure row and every other success."""
    recovered: bool = False
    """A success whose report holds events and names no failure of its own: it recovered from them
    (its `observations`)."""
    failure: dict[str, Any] | None = None
    """The row's `EpisodeFailure` (kind, reason, stage, terminal)."""
    reported_failure: dict[str, Any] | None = None
    """The failure the failed reply's kept body names (NeMo Gym's `_ng_failure_response_body`), when it
    is gym-failures' error body: `failure_kind`, `event_id`, `boundary`, `failure_reason` as far as
    the body goes, and `truncated`."""
    failure_id: str | None = None
    omitted: bool = False
    tree: EventNode | None = None
    """The failure (`failure_id`) and its causes."""
    observations: list[EventNode] = []
    problem: str | None = None
    """Why an invalid, torn or other line is no rollout row."""

    @property
    def final_label(self) -> str:
        """How a final failure is labelled: why it is final, and the retry rule that decided it."""
        reason = self.final_reason or "final"
        return f" · final ({reason}, rule {self.retry_rule})" if self.retry_rule else f" · final ({reason})"

    @property
    def not_final_label(self) -> str:
        """How a failure that was not final is labelled, by whether a later attempt retried it."""
        if self.retried is False:
            return " · not final, not retried yet (a resume retries it)"
        return " · retried" if self.retried else " · not final"


# A cause chain deeper than this is shown to this depth, the rest counted (`causes_cut`): no real chain
# is (a failure's own projection stops at 64 too), and a saved report can be any depth.
MAX_TREE_DEPTH = 64


def _node(event_id: str, events: Mapping[str, FailureEvent], shown: set[str], omitted: bool) -> EventNode:
    """The chain from `event_id` down, built bottom up: a saved chain can be thousands deep."""
    chain: list[tuple[str, FailureEvent]] = []
    current: str | None = event_id
    while current is not None and current not in shown and len(chain) < MAX_TREE_DEPTH:
        shown.add(current)
        chain.append((current, events[current]))
        # A validated report names only causes it holds (see the module docstring).
        current = events[current].cause_id
    node: EventNode | None = None
    for index, (shown_id, event) in enumerate(reversed(chain)):
        data = event.model_dump(mode="json")
        data["event_id"] = shown_id
        injected = is_injected(event.exception_type, event.failure_reason)
        if index > 0:
            node = EventNode(event=data, cause=node, injected=injected)
        elif current is None:
            node = EventNode(event=data, causes_may_be_omitted=omitted, injected=injected)
        elif current in shown:
            node = EventNode(event=data, cause_shown_above=current, injected=injected)
        else:
            node = EventNode(event=data, causes_cut=_chain_length(current, events, shown), injected=injected)
    assert node is not None
    return node


def _chain_length(event_id: str, events: Mapping[str, FailureEvent], shown: set[str]) -> int:
    """How many events the chain from `event_id` has before it ends or reaches one already shown."""
    seen = set(shown)
    length = 0
    current: str | None = event_id
    while current is not None and current not in seen:
        seen.add(current)
        length += 1
        current = events[current].cause_id
    return length


def _tree(report: FailureReport) -> tuple[EventNode | None, list[EventNode]]:
    shown: set[str] = set()
    events = report.events
    tree = None
    if report.failure_id is not None and report.failure_id in events:
        tree = _node(report.failure_id, events, shown, report.omitted)
    named = {event.cause_id for event in events.values() if event.cause_id is not None}
    observations = [
        _node(event_id, events, shown, report.omitted)
        for event_id in events
        if event_id not in shown and event_id not in named
    ]
    return tree, observations


def explain_row(row: Mapping[str, Any], path: str = "", line: int | None = None) -> RowExplanation:
    """The explanation of one saved row (any supported form)."""
    row = normalized(row)
    if not is_rollout_row(row):
        rollout = row.get("rollout_id")
        return RowExplanation(
            path=path,
            line=line,
            outcome="other",
            rollout_id=rollout if isinstance(rollout, str) else None,
            problem=(
                "marked never to be saved (NeMo Gym's _ng_no_persist or _ng_dispatch_drained)"
                if is_not_persisted(row)
                else "not a rollout row: it has neither a result nor a failure"
            ),
        )
    report = FailureReportRow.report(row)
    success = "failure" not in row
    reported = None if success else reported_failure(row.get(FAILURE_RESPONSE_BODY))
    in_body = None if success or report.events else body_report(row.get(FAILURE_RESPONSE_BODY))
    if in_body is not None:
        report = in_body
        reported = None if reported is None else {**reported, "chain_in_body": True}
    tree, observations = _tree(report)
    failure = row.get("failure")
    tainted = _tainted(row, report.failure_id) if success else None
    attempt, reward = row.get("attempt"), row.get("reward")
    rollout = row.get("rollout_id")
    return RowExplanation(
        path=path,
        line=line,
        outcome="success" if success else "failure",
        rollout_id=rollout if isinstance(rollout, str) else None,
        attempt=attempt if type(attempt) is int else None,
        final=row["final"] if isinstance(row.get("final"), bool) else None,
        final_reason=row["final_reason"] if isinstance(row.get("final_reason"), str) else None,
        closed_on_resume=row.get("closed_on_resume") is True,
        retry_rule=_rule_name(row.get(RETRY_RULE)),
        reward=_reward(reward),
        masked=row.get("masked") is True,
        degraded_kind=safe_text(kind) if (kind := degraded_kind(row)) is not None else None,
        tainted=tainted,
        recovered=success and tainted is None and bool(report.events),
        failure=_envelope(failure),
        reported_failure=reported,
        failure_id=report.failure_id,
        omitted=report.omitted,
        tree=tree,
        observations=observations,
    )


def _tainted(row: Mapping[str, Any], failure_id: str | None) -> TaintedFailure | None:
    """The failure a success `row` was built on, by the gate's rule (`tainted_failure`)."""
    from gym_failures.gate import tainted_failure

    found = tainted_failure(row)
    if found is None:
        return None
    kind, failure_class = found
    return TaintedFailure(failure_kind=safe_text(kind), failure_class=failure_class, failure_id=failure_id)


_ENVELOPE_FIELDS = ("failure_kind", "failure_reason", "stage", "terminal")


def _envelope(failure: object) -> dict[str, Any] | None:
    """The row's `EpisodeFailure` as shown: its four fields, each a string, a bool or None (a saved
    row can hold anything there, nested without end)."""
    if not isinstance(failure, Mapping):
        return None
    shown: dict[str, Any] = {}
    for name in _ENVELOPE_FIELDS:
        value = failure.get(name)
        if isinstance(value, str):
            shown[name] = safe_text(value)
        elif value is None or isinstance(value, bool):
            shown[name] = value
        else:
            shown[name] = f"<not a string: a JSON {type(value).__name__}>"
    return shown


def _reward(value: object) -> float | None:
    """A saved reward as a float; `None` for anything else, an int past a float's range included."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """Every line of `path` with its 1-based number and whether it was terminated."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            yield number, line, line.endswith(b"\n")


def line_row(path: Path, line: int) -> RowExplanation | None:
    """The explanation of line `line` (1-based, every line counted) of `path`; None past its end."""
    for number, text, terminated in _lines(path):
        if number != line:
            continue
        if not terminated:
            return RowExplanation(
                path=str(path),
                line=number,
                outcome="torn",
                problem=f"the last line is unterminated ({len(text)} bytes): a torn append, never a row",
            )
        row, problem = parse_line(text, first_line=number == 1)
        if row is None:
            return RowExplanation(path=str(path), line=number, outcome="invalid", problem=problem)
        return explain_row(row, str(path), number)
    return None


_ESCAPED_ROLLOUT_ID = re.compile(rb'"rollout_id"[\t\n\r ]*:[\t\n\r ]*"[^"]*\\')


def rollout_rows(paths: Iterable[Path], rollout_id: str) -> list[RowExplanation]:
    """The explanations of every row of rollout `rollout_id` in `paths`, by attempt."""
    # Most lines belong to other rollouts: a row that names its rollout id, and whose text lacks this
    # one, is skipped unparsed. Only a plain id is matched as text, since JSON may escape others. A
    # NeMo Gym row's `rollout_id` may be its dataset's (`nemo_gym.written_by_gym_failures`): its
    # rollout is its indices, so a row naming this id's task index is parsed whatever else it names.
    plain = re.fullmatch(r"[A-Za-z0-9:._-]+", rollout_id) is not None
    needle = b'"' + rollout_id.encode() + b'"'
    indices = re.fullmatch(r"([0-9]+):[0-9]+", rollout_id)
    task = (
        None
        if indices is None
        else re.compile(
            rb'"_ng_task_index"[\t\n\r ]*:[\t\n\r ]*' + indices.group(1).encode() + rb"(?![0-9.eE])"
        )
    )
    found: list[RowExplanation] = []
    for path in paths:
        for number, text, terminated in _lines(path):
            if not terminated:
                continue
            if (
                plain
                and needle not in text
                and b'"rollout_id"' in text
                # A value written with escapes ("0\u003a1") is this id to a JSON reader: parsed.
                and not _ESCAPED_ROLLOUT_ID.search(text)
                and (task is None or task.search(text) is None)
            ):
                continue
            row, _ = parse_line(text, first_line=number == 1)
            if row is None:
                continue
            row = normalized(row)
            if row.get("rollout_id") != rollout_id or not is_rollout_row(row):
                continue
            found.append(explain_row(row, str(path), number))
    found.sort(key=lambda item: (item.attempt or 0, item.outcome == "success"))
    # A failure that was not final was retried only when a later attempt of its rollout came: a row
    # after it that is not the copy a resume saved to close the rollout.
    return [
        item.model_copy(
            update={"retried": any(not later.closed_on_resume for later in found[position + 1 :])}
        )
        if item.outcome == "failure" and item.final is False
        else item
        for position, item in enumerate(found)
    ]


def _chain_depth(report: FailureReport) -> int:
    """How many events the chain from `report`'s failure down its causes holds."""
    depth, event_id = 0, report.failure_id
    while event_id is not None and event_id in report.events and depth <= len(report.events):
        depth, event_id = depth + 1, report.events[event_id].cause_id
    return depth


def _rule_name(record: object) -> str | None:
    """The rule a `_gf_retry_rule` record names (bounded, as any text shown), or None."""
    name = record.get("rule") if isinstance(record, Mapping) else None
    return safe_text(name)[:64] if isinstance(name, str) and name else None


def with_retried(explanation: RowExplanation | None, paths: Iterable[Path]) -> RowExplanation | None:
    """`explanation`, a failure that was not final, with `retried` read from every row of its rollout in
    `paths` (a row read alone cannot say whether a later attempt came); any other as it is."""
    if explanation is None or explanation.final is not False or explanation.rollout_id is None:
        return explanation
    for row in rollout_rows(paths, explanation.rollout_id):
        if (row.path, row.line) == (explanation.path, explanation.line):
            return row
    return explanation


def longest_chain(files: Iterable[Path]) -> RowExplanation | None:
    """The failed attempt with the longest cause chain in `files`, a final one on a tie, the first
    one on a further tie; None when no row has a failure event. A row NeMo Gym wrote without a report
    whose kept reply body is gym-failures' error body (`nemo_gym.reported_failure`) has a chain of one,
    the failure that body names."""
    best: tuple[int, bool, int, int] | None = None
    where: tuple[Path, int] | None = None
    for order, path in enumerate(files):
        with path.open("rb") as handle:
            for number, line in enumerate(handle, start=1):
                if b'"failure"' not in line and b"_ng_failure_class" not in line:
                    continue
                row, _ = parse_line(line, first_line=number == 1)
                if row is None:
                    continue
                depth = _chain_depth(FailureReportRow.report(row))
                if not depth and reported_failure(row.get(FAILURE_RESPONSE_BODY)) is not None:
                    in_body = body_report(row.get(FAILURE_RESPONSE_BODY))
                    depth = 1 if in_body is None else _chain_depth(in_body)
                key = (depth, row.get("final") is True, -order, -number)
                if depth and (best is None or key > best):
                    best, where = key, (path, number)
    return None if where is None else line_row(*where)
