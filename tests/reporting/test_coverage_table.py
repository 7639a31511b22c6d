"""The gate's coverage table is data (`gym_failures.gate.coverage_rows`) that both front ends draw:
`gym-failures gate`'s terminal table and the HTML report's show the same cells for the same input."""

from __future__ import annotations

import html
import re

import pytest

from gym_failures.cli._tables import print_verdict
from gym_failures.gate import (
    COVERAGE_COLUMNS,
    Coverage,
    GateThresholds,
    check,
    coverage_cells,
    coverage_note,
    coverage_remarks,
    coverage_rows,
)
from gym_failures.reporting.html import _verdict_section

EVERY_ROW = Coverage(
    expected=20,
    seen=19,
    scored=9,
    degraded=2,
    degraded_by_kind={"judge_failed": 2},
    masked=1,
    unscored=1,
    failed={"model": 2, "evaluation": 1, "unknown": 0},
    failed_by_kind={"model_server_error": 2, "sandbox_oom": 1},
    gate_derived={"model": 1, "evaluation": 0, "unknown": 1},
    gate_derived_by_kind={"truncated_answer": 1, "grading_without_verdict": 1},
    retried_attempts=3,
    missing=4,
    left_no_row=2,
    missing_rollouts=["17:0", "18:0"],
    unexpected=1,
    invalid_lines=2,
    torn_tails=1,
    expected_source="materialized_inputs",
    manifests=["runs/a/rollouts_materialized_inputs.jsonl"],
)
"""A coverage with a nonzero count in every row that is shown only when nonzero."""

FEWEST_ROWS = Coverage(expected=3, seen=3, scored=3, missing=0)
"""A clean run: only the rows that are always shown."""


def _terminal_cells(coverage: Coverage, capsys: pytest.CaptureFixture[str]) -> list[tuple[str, ...]]:
    """The cells of the terminal's Coverage table, as rich drew them (piped: a fixed width)."""
    print_verdict(check(coverage, GateThresholds()))
    out = capsys.readouterr().out
    table = out[out.index("Coverage") : out.index("Outcomes by kind") if "Outcomes by kind" in out else None]
    rows = [line for line in table.splitlines() if line.startswith(("┃", "│"))]
    return [tuple(cell.strip() for cell in re.split("[│┃]", line.strip("│┃"))) for line in rows]


def _html_cells(coverage: Coverage) -> list[tuple[str, ...]]:
    """The cells of the HTML report's coverage table (the section's first table)."""
    section = _verdict_section(check(coverage, GateThresholds()))
    table = section[section.index("<table>") : section.index("</table>")]
    cells = []
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table):
        found = re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)
        cells.append(tuple(html.unescape(cell.replace("<wbr>", "")) for cell in found))
    return cells


@pytest.mark.parametrize("coverage", [EVERY_ROW, FEWEST_ROWS], ids=["every row", "fewest rows"])
def test_the_terminal_and_the_html_report_show_the_same_coverage_cells(
    coverage: Coverage, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = coverage_cells(coverage)
    terminal = _terminal_cells(coverage, capsys)
    page = _html_cells(coverage)
    assert terminal[0] == page[0] == COVERAGE_COLUMNS
    assert terminal[1:] == page[1:] == expected


def test_the_rows_follow_one_order_and_every_class_is_shown() -> None:
    labels = [row.label for row in coverage_rows(FEWEST_ROWS)]
    assert labels == [
        "expected",
        "scored",
        "of which degraded",
        "masked",
        "failed, model",
        "failed, evaluation",
        "failed, unknown",
        "gate-derived, model",
        "gate-derived, evaluation",
        "gate-derived, unknown",
        "missing",
    ]
    every = [row.label for row in coverage_rows(EVERY_ROW)]
    assert every[-4:] == ["unscored (no verdict)", "missing", "of which left no row", "unexpected"]


def test_expected_and_unexpected_have_no_share_and_parts_say_so() -> None:
    rows = {row.label: row for row in coverage_rows(EVERY_ROW)}
    assert rows["expected"].cells == ("expected", "20", "")
    assert rows["unexpected"].cells == ("unexpected", "1", "")
    assert rows["scored"].cells == ("scored", "9", "45.0%")
    assert [label for label, row in rows.items() if row.part] == ["of which degraded", "of which left no row"]
    assert (rows["failed, model"].failure_class, rows["failed, model"].key) == ("model", "failed")


def test_both_front_ends_print_the_same_lines_around_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    print_verdict(check(EVERY_ROW, GateThresholds()))
    terminal = " ".join(capsys.readouterr().out.split())
    section = _verdict_section(check(EVERY_ROW, GateThresholds()))
    page = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", section.replace("<wbr>", ""))).split())
    lines = [*coverage_remarks(EVERY_ROW), coverage_note(EVERY_ROW)]
    assert lines == [
        "expected from runs/a/rollouts_materialized_inputs.jsonl",
        "missing rollouts: 17:0, 18:0 and 2 more",
        "degraded (scored, a failure kind named): judge_failed 2",
        "3 retried attempts (not outcomes); 2 invalid lines and a torn last line skipped",
    ]
    for line in lines:
        assert line in terminal
        assert line[0].upper() + line[1:] in page  # a sentence on the page
