"""The cause tree of saved rows: a row's failure at the root, its causes below, other observations beside.

A row's report (`FailureReportRow.report`) holds every failure observed for the attempt, across every
hop, each with its origin `event_id`, its boundary and at most one explicit cause. The tree starts at
the report's `failure_id` and follows `cause_id` down. Every other event is an observation (a model
call that was retried, a failure a success recovered from): each observation that nothing else names
as its cause starts a chain of its own, which ends where it reaches an event already shown.

A report marked `omitted` lost events on the way (one was too large to send, or the saved report was
invalid); the explanation says so, and a chain that ends in such a report may have lost its causes.
A kind this version does not register is shown as saved (`unregistered:<kind>`).

Rows are found by line (`line_row`: 1-based, counting every line of the file, blank and invalid ones
included, as editors and `grep -n` count them) or by rollout (`rollout_rows`). A rollout row has a
`result` (a success) or a `failure`; a row with neither (a record a tool wrote beside the rollouts, such
as the demo's injected faults) is no outcome of any rollout: `rollout_rows` skips it, as the gate does,
and `line_row` says what it is (`outcome` `"other"`) rather than calling it a success.

The report is validated when read (`FailureReportRow.report`): every `cause_id` in it names an event of
the same report, and a report with a dangling cause is invalid as a whole and read as omitted with no
events. So every cause the tree follows is there to show.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gym_failures.failure_records import FailureEvent, FailureReport
from gym_failures.failure_transport import FailureReportRow
from gym_failures.rows import is_rollout_row, normalized

__all__ = ["EventNode", "RowExplanation", "explain_row", "line_row", "rollout_rows"]


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
    reward: float | None = None
    failure: dict[str, Any] | None = None
    """The row's `EpisodeFailure` (kind, reason, stage, terminal)."""
    failure_id: str | None = None
    omitted: bool = False
    tree: EventNode | None = None
    """The failure (`failure_id`) and its causes."""
    observations: list[EventNode] = []
    problem: str | None = None
    """Why an invalid, torn or other line is no rollout row."""


def _node(event_id: str, events: Mapping[str, FailureEvent], shown: set[str], omitted: bool) -> EventNode:
    event = events[event_id]
    shown.add(event_id)
    data = event.model_dump(mode="json")
    data["event_id"] = event_id
    cause_id = event.cause_id
    if cause_id is None:
        return EventNode(event=data, causes_may_be_omitted=omitted)
    if cause_id in shown:
        return EventNode(event=data, cause_shown_above=cause_id)
    # A validated report names only causes it holds (see the module docstring).
    return EventNode(event=data, cause=_node(cause_id, events, shown, omitted))


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
            problem="not a rollout row: it has neither a result nor a failure",
        )
    report = FailureReportRow.report(row)
    tree, observations = _tree(report)
    failure = row.get("failure")
    attempt, reward = row.get("attempt"), row.get("reward")
    rollout = row.get("rollout_id")
    return RowExplanation(
        path=path,
        line=line,
        outcome="failure" if "failure" in row else "success",
        rollout_id=rollout if isinstance(rollout, str) else None,
        attempt=attempt if type(attempt) is int else None,
        final=row["final"] if isinstance(row.get("final"), bool) else None,
        final_reason=row["final_reason"] if isinstance(row.get("final_reason"), str) else None,
        reward=float(reward) if isinstance(reward, int | float) and not isinstance(reward, bool) else None,
        failure=dict(failure) if isinstance(failure, Mapping) else None,
        failure_id=report.failure_id,
        omitted=report.omitted,
        tree=tree,
        observations=observations,
    )


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """Every line of `path` with its 1-based number and whether it was terminated."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            yield number, line, line.endswith(b"\n")


def _parsed(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as error:
        return None, f"not JSON ({type(error).__name__})"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an object"
    return value, None


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
        row, problem = _parsed(text)
        if row is None:
            return RowExplanation(path=str(path), line=number, outcome="invalid", problem=problem)
        return explain_row(row, str(path), number)
    return None


def rollout_rows(paths: Iterable[Path], rollout_id: str) -> list[RowExplanation]:
    """The explanations of every row of rollout `rollout_id` in `paths`, by attempt."""
    # Most lines belong to other rollouts: a row that names its rollout id, and whose text lacks this
    # one, is skipped unparsed. Only a plain id is matched as text, since JSON may escape others.
    plain = re.fullmatch(r"[A-Za-z0-9:._-]+", rollout_id) is not None
    needle = b'"' + rollout_id.encode() + b'"'
    found: list[RowExplanation] = []
    for path in paths:
        for number, text, terminated in _lines(path):
            if not terminated or (plain and needle not in text and b'"rollout_id"' in text):
                continue
            row, _ = _parsed(text)
            if row is None:
                continue
            row = normalized(row)
            if row.get("rollout_id") != rollout_id or not is_rollout_row(row):
                continue
            found.append(explain_row(row, str(path), number))
    return sorted(found, key=lambda item: (item.attempt or 0, item.outcome == "success"))
