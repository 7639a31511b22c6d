"""The coverage table as data: its columns, its rows and the lines around it, computed once from a
`Coverage` for both front ends (`gym-failures gate`'s terminal table and the HTML report's), which
only draw them.

The two had drawn their own tables and drifted apart; these are the rules both now follow:

- The columns are `COVERAGE_COLUMNS`: what a row counts, its count of rollouts, its share of
  `expected`.
- The rows come in one order: expected, scored (then its parts, degraded, and tainted when tainted
  results were scored), masked, tainted (results built on a call that ended in failure) when there
  are any and they were not scored, the final failures by class, the gate-derived outcomes by
  class (each in `FailureClass` order), unscored when there are any, missing (then its part, the
  rollouts that left no row, when there are any), unexpected when there are any.
- Every class has its failed and its gate-derived row, a zero included: "failed, unknown 0" is an
  answer too (the HTML report used to leave a zero unknown out).
- `expected` and `unexpected` have no share (`CoverageRow.share` is None, drawn empty): the shares
  are of `expected`, and an unexpected outcome is no part of it (the terminal used to print 100.0%
  and a share of unexpected outcomes).
- A row that is a part of the row above it (`of which ...`) says so (`CoverageRow.part`); each front
  end indents it its own way, and its label is the same words.

Below the table, both print the same lines (`coverage_remarks`), the outcomes by kind
(`outcomes_by_kind`) and one note of retried attempts and skipped lines (`coverage_note`,
`skipped_text`). This module imports nothing beyond the gate's own types, so printing a verdict
loads nothing more.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gym_failures.failure_kinds import FailureClass
from gym_failures.gate._coverage import Coverage
from gym_failures.gate._groups import GroupCoverage

__all__ = [
    "COVERAGE_COLUMNS",
    "CoverageRow",
    "coverage_cells",
    "coverage_note",
    "coverage_remarks",
    "coverage_rows",
    "failures_by_root",
    "group_cells",
    "outcomes_by_kind",
    "skipped_text",
]

COVERAGE_COLUMNS = ("rollouts", "count", "share")
"""The coverage table's column headings: what a row counts, how many rollouts, their share."""

RowKey = Literal[
    "expected",
    "scored",
    "degraded",
    "masked",
    "tainted",
    "failed",
    "gate_derived",
    "unscored",
    "missing",
    "left_no_row",
    "unexpected",
]


@dataclass(frozen=True)
class CoverageRow:
    """One row of the coverage table."""

    key: RowKey
    """What the row counts, as the `Coverage` field it reads (`failed` and `gate_derived` once per
    class)."""
    label: str
    """The row's words, the same in every front end (`failed, model`, `of which degraded`)."""
    count: int
    """Rollouts."""
    share: float | None
    """`count`'s share of `expected` (`Coverage.share`); None where a share means nothing."""
    part: bool = False
    """The row counts a part of the row above it (an `of which` row), drawn indented."""
    failure_class: str | None = None
    """The responsibility a failed or gate-derived row counts (`model`, `evaluation`, `unknown`)."""

    @property
    def cells(self) -> tuple[str, str, str]:
        """The row's three cells as text: its label, its count, its share as a percentage (`44.4%`)
        or empty."""
        return (self.label, str(self.count), "" if self.share is None else f"{self.share:.1%}")


def coverage_rows(coverage: Coverage) -> tuple[CoverageRow, ...]:
    """The coverage table's rows, in the order and with the rules of this module's docstring."""

    def row(
        key: RowKey, label: str, count: int, *, part: bool = False, cls: str | None = None
    ) -> CoverageRow:
        return CoverageRow(key, label, count, coverage.share(count), part, cls)

    rows = [
        CoverageRow("expected", "expected", coverage.expected, None),
        row("scored", "scored", coverage.scored),
        row("degraded", "of which degraded", coverage.degraded, part=True),
    ]
    if coverage.tainted and coverage.tainted_scored:
        rows.append(row("tainted", "of which tainted (built on a failed call)", coverage.tainted, part=True))
    rows.append(row("masked", "masked", coverage.masked))
    if coverage.tainted and not coverage.tainted_scored:
        rows.append(row("tainted", "tainted (built on a failed call)", coverage.tainted))
    outcomes: tuple[tuple[RowKey, str, Mapping[str, int]], ...] = (
        ("failed", "failed", coverage.failed),
        ("gate_derived", "gate-derived", coverage.gate_derived),
    )
    for key, words, counts in outcomes:
        for cls in FailureClass:
            rows.append(row(key, f"{words}, {cls.value}", counts.get(cls.value, 0), cls=cls.value))
    if coverage.unscored:
        rows.append(row("unscored", "unscored (no verdict)", coverage.unscored))
    rows.append(row("missing", "missing", coverage.missing))
    if coverage.left_no_row:
        rows.append(row("left_no_row", "of which left no row", coverage.left_no_row, part=True))
    if coverage.unexpected:
        rows.append(CoverageRow("unexpected", "unexpected", coverage.unexpected, None))
    return tuple(rows)


def coverage_cells(coverage: Coverage) -> list[tuple[str, str, str]]:
    """Every row's cells as text (`CoverageRow.cells`): what each front end must show, cell for cell."""
    return [row.cells for row in coverage_rows(coverage)]


def coverage_remarks(coverage: Coverage) -> list[str]:
    """The lines printed below the table: where `expected` came from (a manifest or the materialized
    inputs), the missing rollouts named (the first ones, and how many more), the degraded results by
    kind. Each starts lower-case; a page may capitalize it as a sentence."""
    remarks = []
    if coverage.expected_source in ("manifest", "materialized_inputs"):
        remarks.append(f"expected from {', '.join(coverage.manifests)}")
    if coverage.missing_rollouts:
        more = coverage.missing - len(coverage.missing_rollouts)
        remarks.append(
            f"missing rollouts: {', '.join(coverage.missing_rollouts)}"
            + (f" and {more} more" if more > 0 else "")
        )
    if coverage.degraded_by_kind:
        degraded = ", ".join(f"{kind} {count}" for kind, count in coverage.degraded_by_kind.items())
        remarks.append(f"degraded (scored, a failure kind named): {degraded}")
    if coverage.tainted_by_kind:
        tainted = ", ".join(f"{kind} {count}" for kind, count in coverage.tainted_by_kind.items())
        scored = "scored as asked" if coverage.tainted_scored else "not scored"
        remarks.append(f"tainted (a success built on a call that ended in failure, {scored}): {tainted}")
    return remarks


def group_cells(groups: GroupCoverage) -> list[tuple[str, str]]:
    """The groups table's rows (what a row counts, how many), the same in every front end: groups by
    how many valid members they have, then their members by outcome, then the waste."""
    cells = [
        ("groups", str(groups.groups)),
        (f"complete (at least {groups.min_valid} valid)", str(groups.complete)),
        (f"short (under {groups.min_valid} valid)", str(groups.short)),
        ("  of which lost (none valid)", str(groups.lost)),
        ("members valid", str(groups.valid)),
        ("members masked", str(groups.masked)),
        ("members failed", str(groups.failed)),
        ("members missing", str(groups.missing)),
        ("valid rollouts wasted in short groups", str(groups.wasted)),
    ]
    sizes = ", ".join(f"{count} of {size}" for size, count in groups.sizes.items())
    if sizes:
        cells.append(("group sizes (groups of members)", sizes))
    return cells


def failures_by_root(coverage: Coverage) -> list[tuple[str, int]]:
    """The final failures by their root cause's kind, the most common first (then by kind); empty
    when every failure is its own root (the outcomes by kind already say it all)."""
    if coverage.failed_by_root_kind == coverage.failed_by_kind:
        return []
    return sorted(coverage.failed_by_root_kind.items(), key=lambda item: (-item[1], item[0]))


def outcomes_by_kind(coverage: Coverage) -> list[tuple[str, int]]:
    """The outcomes by failure kind, final failures and gate-derived alike, the most common first
    (then by kind)."""
    kinds = Counter(coverage.failed_by_kind) + Counter(coverage.gate_derived_by_kind)
    return sorted(kinds.items(), key=lambda item: (-item[1], item[0]))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def skipped_text(invalid_lines: int, torn_tails: int, other_rows: int = 0) -> str:
    """What a reader skipped, its nonzero parts only: "2 invalid lines and the torn last lines of 2
    files skipped" (a file has one last line), "" when nothing was skipped."""
    parts = [_plural(invalid_lines, "invalid line")] if invalid_lines else []
    if torn_tails:
        parts.append("a torn last line" if torn_tails == 1 else f"the torn last lines of {torn_tails} files")
    if other_rows:
        parts.append(_plural(other_rows, "other row"))
    if not parts:
        return ""
    return f"{', '.join(parts[:-1])} and {parts[-1]} skipped" if len(parts) > 1 else f"{parts[0]} skipped"


def coverage_note(coverage: Coverage) -> str:
    """The note below the outcomes: retried attempts and attempts not retried yet (which are no
    outcomes), and the lines skipped."""
    notes = [f"{_plural(coverage.retried_attempts, 'retried attempt')} (not outcomes)"]
    if coverage.unfinished_attempts:
        waiting = _plural(coverage.unfinished_attempts, "failed attempt")
        notes.append(f"{waiting} not retried yet (not final: a resume retries them)")
    skipped = skipped_text(coverage.invalid_lines, coverage.torn_tails, coverage.other_rows)
    if skipped:
        notes.append(skipped)
    return "; ".join(notes)
