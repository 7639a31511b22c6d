"""`gym-failures summarize`: failures by class, kind, root cause, boundary, stage, status and attempt,
as tables, one JSON document (`--json`) or a self-contained HTML report (`--html FILE`).

Input that names no file, or whose files hold no rollout row, is an error (exit status 2), never an
empty table with exit status 0; lines that are no rollout rows are counted in one warning.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gym_failures.cli._exits import EXIT_OK, CommandError
from gym_failures.cli._inputs import row_inputs, writable_file
from gym_failures.cli._options import (
    Subcommands,
    add_command,
    add_json_option,
    add_paths_argument,
    at_least,
)
from gym_failures.cli._text import plural, print_json, warn

if TYPE_CHECKING:
    from gym_failures.reporting.summary import Summary

__all__ = ["PROGRESS_MIN_BYTES", "add_summarize"]

# Below this much input a summary takes about a second: a progress bar would only flicker.
PROGRESS_MIN_BYTES = 50 * 1024 * 1024


def add_summarize(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "summarize",
        _run_summarize,
        counts_skipped_lines=True,
        help="failures by class, kind, root cause, boundary, stage and attempt",
        description="Failures by class, kind, root cause, boundary, stage, HTTP status and attempt; the "
        "most common reasons; quota resets; what failures cost (attempts, seconds and tokens of failed "
        "attempts and re-runs, and how retries multiplied model attempts). Needs the cli extra (duckdb, "
        "rich).",
        extra="cli",
    )
    add_paths_argument(parser)
    add_json_option(parser)
    parser.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write a self-contained HTML report to FILE: charts, the gate's verdict and the "
        "failed attempt with the longest cause chain",
    )
    parser.add_argument(
        "--min-valid-per-group",
        type=at_least(1),
        metavar="K",
        help="with --html: count the prompt groups in the report's verdict, as `gate "
        "--min-valid-per-group K` does (a group with fewer than K valid members is short)",
    )


def _run_summarize(arguments: argparse.Namespace) -> int:
    import duckdb

    from gym_failures.cli._console import progress_bar, stdout_line
    from gym_failures.cli._tables import print_summary
    from gym_failures.reporting.summary import summarize

    files = row_inputs(arguments.paths)
    html: Path | None = arguments.html
    if html is not None:
        writable_file(html, "--html")
    elif arguments.min_valid_per_group is not None:
        raise CommandError("--min-valid-per-group counts the groups of the HTML report: give --html FILE")
    size = sum(path.stat().st_size for path in files)
    with progress_bar(size > PROGRESS_MIN_BYTES, "summarizing") as update:
        on_progress = None if update is None else (lambda percent: update(percent, 100.0))
        try:
            summary = summarize(files, on_progress=on_progress)
        except duckdb.Error as error:
            raise CommandError(f"could not read the rows: {str(error).splitlines()[0]}") from None
    _check_summary(summary, files)
    if html is not None:
        report = _html_report(summary, files, arguments.min_valid_per_group)
        html.write_text(report, encoding="utf-8")
    if arguments.json_output:
        print_json(summary.model_dump_json(indent=2))
    else:
        print_summary(summary)
        if html is not None:
            stdout_line(f"HTML report written to {html}")
    return EXIT_OK


def _check_summary(summary: Summary, files: Sequence[Path]) -> None:
    if summary.success_rows + summary.failure_rows == 0:
        names = ", ".join(str(path) for path in files)
        raise CommandError(f"no rollout rows in {names} ({plural(summary.other_rows, 'other line')})")
    if summary.other_rows:
        lines = (
            "1 line is not a rollout row"
            if summary.other_rows == 1
            else f"{summary.other_rows} lines are not rollout rows"
        )
        warn(f"{lines} (not JSON, or neither a result nor a failure)")


def _html_report(summary: Summary, files: Sequence[Path], min_valid_per_group: int | None) -> str:
    from gym_failures import gate as acceptance
    from gym_failures.reporting.explain import longest_chain, with_retried
    from gym_failures.reporting.html import render_html

    coverage = acceptance.read_coverage(files, min_valid_per_group=min_valid_per_group)
    verdict = acceptance.check(coverage, acceptance.GateThresholds())
    return render_html(summary, verdict=verdict, explanation=with_retried(longest_chain(files), files))
