"""The tables the commands print on a terminal, with rich: a summary's (`print_summary`), the gate's
verdict (`print_verdict`, drawing the coverage table `gym_failures.gate.coverage_rows` computes for
the HTML report too) and a collection's figures (`print_collection`).

Every value from the rows reaches rich as a cleaned `Text` (`gym_failures.cli._console.cell`). A
column with nothing to show (no root names a boundary, no row is tainted) is left out, as a grouping
with nothing to show is.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gym_failures.cli._console import cell, stdout
from gym_failures.cli._text import clean as _clean
from gym_failures.cli._text import plural
from gym_failures.failure_kinds import FailureClass

if TYPE_CHECKING:  # annotations only: printing a verdict never loads duckdb
    from gym_failures.gate import GateVerdict
    from gym_failures.reporting._cost import Cost
    from gym_failures.reporting.summary import GroupCount, KindCount, Summary

__all__ = ["print_collection", "print_summary", "print_verdict"]

_CLASS_STYLES = {"model": "blue", "evaluation": "red", "unknown": "yellow"}


# --- summarize ---------------------------------------------------------------------------------


def _group_table(title: str, groups: Sequence[GroupCount]) -> Table | Text:
    from gym_failures.reporting.summary import nothing_to_show

    if nothing_to_show(groups):
        return Text(f"Failures by {title}: no failure row names its {title}.")
    table = Table(title=f"Failures by {title}", title_justify="left")
    table.add_column(title, overflow="fold")
    for name in ("failure rows", "final", "share"):
        table.add_column(name, justify="right")
    for group in groups:
        table.add_row(cell(group.value), str(group.count), str(group.final), f"{group.share:.1%}")
    return table


def _injected(summary: Summary) -> str:
    count = summary.injected_failure_rows
    return f", {count} injected on purpose: a test's fault at their root" if count else ""


def _print_totals(console: Console, summary: Summary) -> None:
    """The summary's first lines: its row counts, and the rollouts the materialized inputs owe."""
    console.print(
        Text(
            f"{plural(summary.rows, 'row')}: {plural(summary.success_rows, 'success row')} "
            f"({summary.recovered_success_rows} recovered from failures, "
            f"{summary.tainted_success_rows} tainted: built on a call that ended in failure, "
            f"{summary.masked_success_rows} masked, {summary.degraded_success_rows} degraded), "
            f"{plural(summary.failure_rows, 'failure row')} ({summary.final_failure_rows} final"
            f"{_injected(summary)}), {plural(summary.other_rows, 'other line')}"
        ),
        soft_wrap=True,  # one line, as long as it is: scripts and tests read it whole
    )
    if summary.expected_rollouts is not None:
        sources = ", ".join([*summary.materialized_inputs, *summary.manifests])
        owed = "in the materialized inputs" if not summary.manifests else "expected"
        no_row = (
            f", {summary.missing_rollouts} left no row at all" if summary.missing_rollouts is not None else ""
        )
        console.print(
            cell(
                f"{plural(summary.expected_rollouts, 'rollout')} {owed}{no_row} ({sources})",
                style="yellow" if summary.missing_rollouts else "",
            )
        )


def _kinds_table(kinds: Sequence[KindCount], tainted: bool) -> Table:
    table = Table(title="Failures by kind", title_justify="left")
    table.add_column("kind", overflow="fold")
    table.add_column("class")
    for name in ("failure rows", "final", "share", *(("tainted",) if tainted else ())):
        table.add_column(name, justify="right")
    for kind in kinds:
        table.add_row(
            cell(kind.value),
            cell(kind.failure_class, style=_CLASS_STYLES.get(kind.failure_class, "")),
            str(kind.count),
            str(kind.final),
            f"{kind.share:.1%}",
            *((str(kind.tainted),) if tainted else ()),
        )
    return table


def _roots_table(summary: Summary) -> Table:
    """Failures by root cause: the root's kind, class, boundary and status beside the failure's own
    kind (columns every root leaves empty, and the tainted column of a run with none, left out)."""
    roots = summary.by_root_kind
    boundary = any(root.root_boundary is not None for root in roots)
    status = any(root.root_http_status is not None for root in roots)
    tainted = bool(summary.tainted_success_rows)
    table = Table(title="Failures by root cause", title_justify="left")
    table.add_column("root kind", overflow="fold")
    table.add_column("class")
    if boundary:
        table.add_column("boundary")
    if status:
        table.add_column("HTTP status", justify="right")
    table.add_column("the failure's kind", overflow="fold")
    for name in ("failure rows", "final", "share", *(("tainted",) if tainted else ())):
        table.add_column(name, justify="right")
    for root in roots:
        table.add_row(
            cell(root.root_kind),
            cell(root.failure_class, style=_CLASS_STYLES.get(root.failure_class, "")),
            *((cell(root.root_boundary),) if boundary else ()),
            *((cell(root.root_http_status),) if status else ()),
            cell(root.kind),
            str(root.count),
            str(root.final),
            f"{root.share:.1%}",
            *((str(root.tainted),) if tainted else ()),
        )
    return table


def _statuses_table(summary: Summary) -> Table | Text:
    """Failures by HTTP status, the root cause's status beside the reply's."""
    statuses = summary.by_http_status_and_root
    if all(item.http_status is None and item.root_http_status is None for item in statuses):
        return Text("Failures by HTTP status: no failure row names its HTTP status.")
    table = Table(title="Failures by HTTP status", title_justify="left")
    for name in ("HTTP status", "root's HTTP status", "failure rows", "final", "share"):
        table.add_column(name, justify="right")
    for item in statuses:
        table.add_row(
            cell(item.http_status),
            cell(item.root_http_status),
            str(item.count),
            str(item.final),
            f"{item.share:.1%}",
        )
    return table


def _reasons_table(summary: Summary) -> Table | Text:
    """The most common reasons, normalized; under each, one real example where it differs."""
    if not summary.top_reasons:
        return Text("No failure row gives a reason.")
    reasons = Table(title="Most common reasons", title_justify="left")
    reasons.add_column("count", justify="right")
    reasons.add_column("kind")
    reasons.add_column("reason", overflow="fold")
    for reason in summary.top_reasons:
        shown = cell(reason.reason)
        if reason.example is not None and reason.example != reason.reason:
            shown.append_text(Text("\ne.g. ", style="dim")).append_text(cell(reason.example, style="dim"))
        reasons.add_row(str(reason.count), cell(reason.kind), shown)
    return reasons


def _print_tainted_only(console: Console, summary: Summary) -> None:
    """A run without failure rows: nothing to group, unless success rows are tainted; then their
    failures by kind and by root cause (the tables' tainted column), as a run with failure rows
    shows them beside its failure rows."""
    if not summary.tainted_success_rows:
        console.print(Text("No failure rows: nothing to group."))
        return
    console.print(Text(_tainted_only_line(summary.tainted_success_rows)), soft_wrap=True)
    console.print(_kinds_table(summary.by_kind, tainted=True))
    if summary.by_root_kind:
        console.print(_roots_table(summary))


def _tainted_only_line(tainted: int) -> str:
    """The line above the tables of a run whose only failures are those its tainted rows were built on
    (the HTML report says the same: `gym_failures.reporting.html`)."""
    return (
        f"No failure rows, but {plural(tainted, 'tainted success row')} (built on a call that ended in "
        "failure): by that failure's kind and root cause, in the tables' tainted column."
    )


def _cost_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], names: int) -> Table:
    """A table of `gym_failures.reporting._cost`'s cells: the first `names` columns are names, the
    last of them a class; a figure not reported is dim."""
    from gym_failures.reporting._cost import NOT_REPORTED

    table = Table(title=title, title_justify="left")
    for index, name in enumerate(header):
        if index < names:
            table.add_column(name, overflow="fold")
        else:
            table.add_column(name, justify="right")
    for row in rows:
        styles = [
            _CLASS_STYLES.get(value, "") if index == names - 1 else "" for index, value in enumerate(row)
        ]
        table.add_row(
            *(
                cell(value, style=styles[index] or ("dim" if value == NOT_REPORTED else ""))
                for index, value in enumerate(row)
            )
        )
    return table


def _print_cost(console: Console, cost: Cost) -> None:
    """What the attempts cost: the totals, the failed attempts by class, kind and root cause (the
    last when a root differs from its failure's kind), and the amplification of model attempts."""
    from gym_failures.reporting._cost import (
        GROUP_HEADER,
        TOTALS_HEADER,
        amplification_lines,
        group_cells,
        total_cells,
    )

    console.print(_cost_table("Cost (shares of the whole run)", TOTALS_HEADER, total_cells(cost), 1))
    if cost.failed_by_class:
        console.print(
            _cost_table("Failed attempts' cost by class", GROUP_HEADER, group_cells(cost.failed_by_class), 1)
        )
        kind_header = ("kind", *GROUP_HEADER)
        console.print(
            _cost_table("Failed attempts' cost by kind", kind_header, group_cells(cost.failed_by_kind), 2)
        )
        if [line.kind for line in cost.failed_by_root_kind] != [line.kind for line in cost.failed_by_kind]:
            roots = group_cells(cost.failed_by_root_kind)
            console.print(
                _cost_table("Failed attempts' cost by root cause", ("root kind", *GROUP_HEADER), roots, 2)
            )
    from gym_failures.reporting._cost_html import COST_NOTE

    console.print(Text(COST_NOTE, style="dim"))
    for line in amplification_lines(cost.amplification):
        console.print(Text(line), soft_wrap=True)
    amplification = cost.amplification
    if amplification.distribution:
        buckets = Table(title="Model attempts per rollout attempt", title_justify="left")
        buckets.add_column("model attempts", justify="right")
        buckets.add_column("rollout attempts", justify="right")
        for bucket in amplification.distribution:
            buckets.add_row(bucket.model_attempts, str(bucket.attempts))
        console.print(buckets)
    if amplification.largest:
        largest = Table(title="Largest amplifications (model attempts per rollout)", title_justify="left")
        largest.add_column("rollout", overflow="fold")
        for name in ("attempts", "model calls", "model attempts"):
            largest.add_column(name, justify="right")
        for item in amplification.largest:
            largest.add_row(
                cell(item.rollout_id), str(item.attempts), str(item.model_calls), str(item.model_attempts)
            )
        console.print(largest)


def print_summary(summary: Summary) -> None:
    """`summary` as tables: the totals, then failures by class, kind, root cause, boundary, stage,
    status and attempt, the most common reasons and the quota resets, then what the attempts cost. A
    run without failure rows whose success rows are tainted shows the kind and root-cause tables, for
    their tainted column."""
    console = stdout()
    _print_totals(console, summary)
    for torn in summary.torn_tails:
        console.print(cell(f"{torn.path}: torn last line ({torn.bytes} bytes) skipped", style="yellow"))
    if not summary.failure_rows:
        _print_tainted_only(console, summary)
        if summary.cost is not None:
            _print_cost(console, summary.cost)
        return
    classes = Table(title="Failures by class", title_justify="left")
    classes.add_column("class")
    for name in ("failure rows", "final", "share"):
        classes.add_column(name, justify="right")
    for group in summary.by_class:
        name = _clean(group.value)
        classes.add_row(
            Text(name, style=_CLASS_STYLES.get(name, "")),
            str(group.count),
            str(group.final),
            f"{group.share:.1%}",
        )
    console.print(classes, _kinds_table(summary.by_kind, bool(summary.tainted_success_rows)))
    if summary.by_reported_kind:
        console.print(_group_table("kind the failed call reported", summary.by_reported_kind))
    if summary.by_root_kind:
        console.print(_roots_table(summary))
    for title, groups in (("boundary", summary.by_boundary), ("stage", summary.by_stage)):
        console.print(_group_table(title, groups))
    console.print(_statuses_table(summary))
    attempts = Table(title="Failures by attempt", title_justify="left")
    attempts.add_column("attempt", justify="right")
    for name in ("failure rows", "final", *(cls.value for cls in FailureClass)):
        attempts.add_column(name, justify="right")
    for item in summary.by_attempt:
        attempts.add_row(
            str(item.attempt),
            str(item.count),
            str(item.final),
            *(str(item.by_class.get(cls.value, 0)) for cls in FailureClass),
        )
    console.print(attempts, _reasons_table(summary))
    if summary.quota_resets:
        resets = Table(title="Quota reset times", title_justify="left")
        resets.add_column("resets at")
        resets.add_column("quota events", justify="right")
        for reset in summary.quota_resets:
            resets.add_row(cell(reset.resets_at), str(reset.events))
        console.print(resets)
    if summary.cost is not None:
        _print_cost(console, summary.cost)


# --- gate --------------------------------------------------------------------------------------


def print_verdict(verdict: GateVerdict) -> None:
    """The coverage table, the lines below it, the outcomes by kind and the verdict with its reasons;
    the table's cells are `gym_failures.gate.coverage_rows`', as the HTML report's are."""
    from gym_failures.gate import (
        COVERAGE_COLUMNS,
        coverage_note,
        coverage_remarks,
        coverage_rows,
        failures_by_root,
        outcomes_by_kind,
    )

    coverage = verdict.coverage
    table = Table(title="Coverage", title_justify="left")
    table.add_column(COVERAGE_COLUMNS[0])
    for name in COVERAGE_COLUMNS[1:]:
        table.add_column(name, justify="right")
    for row in coverage_rows(coverage):
        label, count, share = row.cells
        style = "green" if row.key == "scored" else _CLASS_STYLES.get(row.failure_class or "", "")
        table.add_row(Text(("  " if row.part else "") + label, style=style), count, share)
    console = stdout()
    console.print(table)
    for remark in coverage_remarks(coverage):
        console.print(cell(remark, style="dim"))
    kinds = outcomes_by_kind(coverage)
    if kinds:
        by_kind = Table(title="Outcomes by kind", title_justify="left")
        by_kind.add_column("kind")
        by_kind.add_column("rollouts", justify="right")
        for kind, rollouts in kinds:
            by_kind.add_row(cell(kind), str(rollouts))
        console.print(by_kind)
    roots = failures_by_root(coverage)
    if roots:
        by_root = Table(title="Final failures by root cause", title_justify="left")
        by_root.add_column("root cause's kind")
        by_root.add_column("rollouts", justify="right")
        for kind, rollouts in roots:
            by_root.add_row(cell(kind), str(rollouts))
        console.print(by_root)
    if coverage.groups is not None:
        from gym_failures.gate import group_cells

        groups = Table(title="Groups", title_justify="left")
        groups.add_column("")
        groups.add_column("count", justify="right")
        for label, count in group_cells(coverage.groups):
            groups.add_row(cell(label), count)
        console.print(groups)
        if coverage.groups.short_groups:
            tasks = ", ".join(coverage.groups.short_groups)
            console.print(cell(f"short groups (tasks): {tasks}", style="dim"))
    console.print(Text(coverage_note(coverage), style="dim"))
    console.print(Text(coverage.line, style="bold"))
    if verdict.passed:
        console.print(Text("PASSED", style="bold green"))
    else:
        console.print(Text("FAILED", style="bold red"))
        for reason in verdict.reasons:
            console.print(Text(f"  - {reason}", style="red"))


# --- collect -----------------------------------------------------------------------------------


# The figures whose key alone would mislead: "dispatch errors 0" beside attempts that were all refused.
_COLLECTION_LABELS = {
    "dispatch_errors": "collector faults (collection_dispatch_failed)",
    "succeeded": "succeeded (scored, masked, tainted or gate-derived)",
    "of_which_degraded": "  of which degraded",
    "tainted": "tainted (built on a failed call)",
    "gate_derived": "gate-derived",
}


def print_collection(figures: dict[str, Any], output: Path, failures_path: Path) -> None:
    """A collection run's figures, and where its rows are."""
    table = Table(title="Collection", title_justify="left")
    table.add_column("")
    table.add_column("count", justify="right")
    for key, value in figures.items():
        if isinstance(value, dict):
            value = ", ".join(f"{name} {count}" for name, count in value.items()) or "0"
        table.add_row(cell(_COLLECTION_LABELS.get(key, key.replace("_", " "))), cell(value))
    stdout().print(table)
    stdout().print(Text(f"rows in {output}, failures in {failures_path}", style="dim"))
