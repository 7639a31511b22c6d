"""How the command line shows rows, summaries, cause trees and verdicts on a terminal, with rich.

Text from the rows (kinds, boundaries, stages, reasons, ids) is data, never markup or terminal
commands: every such value reaches rich as a `Text` (no `[bold]` or `[link=...]` in a reason is
interpreted), cleaned by `gym_failures.cli._text.clean` (no terminal control characters).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from gym_failures.cli._app import plural
from gym_failures.cli._text import clean as _clean
from gym_failures.failure_kinds import FailureClass

if TYPE_CHECKING:  # annotations only: printing a verdict never loads duckdb
    from gym_failures.gate import GateVerdict
    from gym_failures.reporting.explain import EventNode, RowExplanation
    from gym_failures.reporting.summary import GroupCount, Summary

_CLASS_STYLES = {"model": "blue", "evaluation": "red", "unknown": "yellow"}


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits with status 1 here, which this command line keeps for "the answer is no"; the
        # entry point turns a broken pipe into its own quiet status (141).
        self.quiet = True
        raise BrokenPipeError


def _console(stderr: bool = False) -> Console:
    # Piped output is read by people later (CI logs, files): a fixed width keeps reasons and ids
    # whole instead of cut to the 80 columns rich assumes without a terminal.
    console = _Console(stderr=stderr, highlight=False)
    return console if console.is_terminal else _Console(stderr=stderr, highlight=False, width=160)


def stdout() -> Console:
    """The console for what a command prints."""
    return _console()


def stderr() -> Console:
    """The console for errors, warnings and progress."""
    return _console(stderr=True)


def stdout_line(text: str, style: str = "") -> None:
    """`text` (which may come from the rows or the user) on stdout, control characters stripped."""
    stdout().print(cell(text, style=style))


def print_rule(title: str) -> None:
    """A horizontal rule with `title`, between the sections of the demo's output."""
    stdout().rule(title)


def print_tree(tree: Tree) -> None:
    """A cause tree on stdout."""
    stdout().print(tree)


def cell(value: object, style: str = "") -> Text:
    """A value from a row as plain text (never markup) without terminal control characters."""
    return Text(_clean(value), style=style)


@contextmanager
def progress_bar(enabled: bool, description: str) -> Iterator[Callable[[float, float], None] | None]:
    """A progress callback (done, total) drawing a rich bar on stderr, or None when not `enabled` or
    stderr is no terminal (a bar in a log file is noise)."""
    console = stderr()
    if not enabled or not console.is_terminal:
        yield None
        return
    # rich.progress costs 5 ms of every command's start; only a bar drawn on a terminal needs it.
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(description, total=None)

        def update(done: float, total: float) -> None:
            progress.update(task, completed=done, total=total)

        yield update


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


def _print_totals(console: Console, summary: Summary) -> None:
    """The summary's first lines: its row counts, and the rollouts the materialized inputs owe."""
    console.print(
        Text(
            f"{plural(summary.rows, 'row')}: {plural(summary.success_rows, 'success row')} "
            f"({summary.recovered_success_rows} recovered from failures, {summary.masked_success_rows} "
            f"masked, {summary.degraded_success_rows} degraded), "
            f"{plural(summary.failure_rows, 'failure row')} ({summary.final_failure_rows} final), "
            f"{plural(summary.other_rows, 'other line')}"
        )
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


def print_summary(summary: Summary) -> None:
    """`summary` as tables: the totals, then failures by class, kind, boundary, stage, status and attempt."""
    console = stdout()
    _print_totals(console, summary)
    for torn in summary.torn_tails:
        console.print(cell(f"{torn.path}: torn last line ({torn.bytes} bytes) skipped", style="yellow"))
    if not summary.failure_rows:
        console.print(Text("No failure rows: nothing to group."))
        return
    classes = Table(title="Failures by class", title_justify="left")
    kinds = Table(title="Failures by kind", title_justify="left")
    kinds.add_column("kind", overflow="fold")
    for table in (classes, kinds):
        table.add_column("class")
        for name in ("failure rows", "final", "share"):
            table.add_column(name, justify="right")
    for group in summary.by_class:
        name = _clean(group.value)
        classes.add_row(
            Text(name, style=_CLASS_STYLES.get(name, "")),
            str(group.count),
            str(group.final),
            f"{group.share:.1%}",
        )
    for kind in summary.by_kind:
        kinds.add_row(
            cell(kind.value),
            cell(kind.failure_class, style=_CLASS_STYLES.get(kind.failure_class, "")),
            str(kind.count),
            str(kind.final),
            f"{kind.share:.1%}",
        )
    console.print(classes, kinds)
    if summary.by_reported_kind:
        console.print(_group_table("kind the reply's body names", summary.by_reported_kind))
    for title, groups in (
        ("boundary", summary.by_boundary),
        ("stage", summary.by_stage),
        ("HTTP status", summary.by_http_status),
    ):
        console.print(_group_table(title, groups))
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
    reasons = Table(title="Most common reasons", title_justify="left")
    reasons.add_column("count", justify="right")
    reasons.add_column("kind")
    reasons.add_column("reason", overflow="fold")
    for reason in summary.top_reasons:
        reasons.add_row(str(reason.count), cell(reason.kind), cell(reason.reason))
    console.print(attempts, reasons if summary.top_reasons else Text("No failure row gives a reason."))
    if summary.quota_resets:
        resets = Table(title="Quota reset times", title_justify="left")
        resets.add_column("resets at")
        resets.add_column("quota events", justify="right")
        for reset in summary.quota_resets:
            resets.add_row(cell(reset.resets_at), str(reset.events))
        console.print(resets)


# --- explain -----------------------------------------------------------------------------------


def _event_label(node: EventNode, prefix: str) -> Text:
    event = node.event
    label = Text(prefix)
    label.append(f"[{_clean(event.get('boundary', '?'))}] ", style="cyan")
    label.append(_clean(event.get("failure_kind", "?")), style="bold")
    for name, key in (("stage", "stage"), ("http", "http_status"), ("operation", "operation")):
        if key in event:
            label.append(f"  {name}={_clean(event[key])}")
    reading = status_reading(event)
    if reading is not None:
        label.append(f"  (read as {_clean(reading)})", style="dim")
    label.append(f"  id={_clean(event.get('event_id'))}", style="dim")
    if event.get("failure_reason"):
        label.append(f"\n{_clean(event['failure_reason'])}", style="italic")
    foreign = event.get("foreign_error")
    if isinstance(foreign, dict):
        label.append(f"\nforeign error: {_clean(foreign.get('exception_type'))}", style="dim")
    return label


def status_reading(event: Mapping[str, Any]) -> str | None:
    """The kind an HTTP-shaped kind reads as with its status (`reporting_failure_kind`: a model
    server's plain 503 saved as `model_request_error` reads as `model_server_error`), when that
    differs from the kind saved; the event itself is never changed."""
    from gym_failures.failure_kinds import reporting_failure_kind

    kind = event.get("failure_kind")
    if not isinstance(kind, str):
        return None
    reading = reporting_failure_kind(kind, event.get("http_status"))
    return reading if reading is not None and reading != kind else None


# Each level of a tree indents by four columns: past this depth a terminal shows nothing readable, so
# the rest of a chain is counted (`--json` holds it all, up to `MAX_TREE_DEPTH`).
MAX_SHOWN_DEPTH = 16


def _add_chain(tree: Tree, node: EventNode, prefix: str, depth: int = 1) -> None:
    branch = tree.add(_event_label(node, prefix))
    if node.cause is not None and depth == MAX_SHOWN_DEPTH:
        hidden = _below(node.cause)
        branch.add(cell(f"caused by {hidden} more events (not shown; --json has them)", style="dim"))
    elif node.cause is not None:
        _add_chain(branch, node.cause, "caused by ", depth + 1)
    elif node.cause_shown_above is not None:
        branch.add(cell(f"caused by {node.cause_shown_above} (shown above)", style="dim"))
    elif node.causes_cut:
        branch.add(cell(f"caused by {node.causes_cut} more events (not shown)", style="dim"))
    elif node.causes_may_be_omitted:
        branch.add(Text("[omitted] causes may have been lost on the way", style="yellow"))


def _below(node: EventNode | None) -> int:
    """The events of a chain from `node` down, those the explanation cut off included."""
    count = 0
    while node is not None:
        count += 1 + node.causes_cut
        node = node.cause
    return count


def explanation_tree(explanation: RowExplanation) -> Tree:
    """One row's outcome, its episode failure and its cause tree, as a rich tree."""
    where = f"{explanation.path}:{explanation.line}" if explanation.line is not None else explanation.path
    title = Text(f"{_clean(where)}  ", style="dim")
    if explanation.outcome in ("invalid", "torn", "other"):
        title.append(f"{explanation.outcome} line: {_clean(explanation.problem)}", style="yellow")
        return Tree(title)
    title.append(f"rollout {_clean(explanation.rollout_id or '(unknown)')}", style="bold")
    title.append(f" · attempt {explanation.attempt if explanation.attempt is not None else '?'} · ")
    if explanation.outcome == "success":
        title.append("success", style="green")
        if explanation.reward is not None:
            title.append(f" · reward {explanation.reward:g}")
        if explanation.masked:
            title.append(" · masked (mask_sample)", style="yellow")
        elif explanation.degraded_kind is not None:
            title.append(f" · degraded ({_clean(explanation.degraded_kind)}, not masked)", style="yellow")
    else:
        title.append("failure", style="red")
        if explanation.final:
            title.append(f" · final ({_clean(explanation.final_reason or 'final')})")
        elif explanation.final is False:
            title.append(" · retried")
    tree = Tree(title)
    failure = explanation.failure
    if failure is not None:
        text = Text("episode failure: ")
        text.append(_clean(failure.get("failure_kind") or "(no kind)"), style="bold")
        if failure.get("stage"):
            text.append(f"  stage={_clean(failure['stage'])}")
        text.append(f"  terminal={_clean(failure.get('terminal')).lower()}")
        if failure.get("failure_reason"):
            text.append(f"\n{_clean(failure['failure_reason'])}", style="italic")
        tree.add(text)
    reported = explanation.reported_failure
    if reported is not None:
        text = Text("the reply's body names: ")
        text.append(_clean(reported.get("failure_kind")), style="bold")
        for name in ("boundary", "event_id"):
            if reported.get(name):
                text.append(f"  {name.replace('_', ' ')}={_clean(reported[name])}")
        if reported.get("truncated"):
            text.append("  (body cut by NeMo Gym's bound: read as far as it goes)", style="dim")
        if reported.get("failure_reason"):
            text.append(f"\n{_clean(reported['failure_reason'])}", style="italic")
        tree.add(text)
    if explanation.omitted:
        tree.add(Text("[omitted] this report lost events on the way (too large, or invalid)", style="yellow"))
    if explanation.tree is not None:
        _add_chain(tree, explanation.tree, "✖ ")
    elif failure is not None and reported is None:
        tree.add(Text("no failure event saved for this row", style="dim"))
    if explanation.observations:
        observed = tree.add(Text("other observations", style="bold"))
        for node in explanation.observations:
            _add_chain(observed, node, "")
    return tree


# --- gate --------------------------------------------------------------------------------------


def print_verdict(verdict: GateVerdict) -> None:
    """The coverage table, the lines below it, the outcomes by kind and the verdict with its reasons;
    the table's cells are `gym_failures.gate.coverage_rows`', as the HTML report's are."""
    from gym_failures.gate import (
        COVERAGE_COLUMNS,
        coverage_note,
        coverage_remarks,
        coverage_rows,
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
    "succeeded": "succeeded (scored, masked or gate-derived)",
    "of_which_degraded": "  of which degraded",
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
