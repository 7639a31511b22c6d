"""The commands of `gym-failures`: their options, what each computes, and its exit status.

Each command is an `add_<name>(commands)` that declares its options and a `_run_<name>(arguments)`
that imports what it needs (rich, duckdb, aiohttp, the gate), so that `--help` and the parser load
none of them. A new command is one more `add_<name>` in `COMMANDS`. What each prints is drawn by
`gym_failures.cli._render`.

Decisions:

- Line numbers a person reads are 1-based, as editors and `grep -n` count: `explain --line N`, the
  `path:N` labels of the cause trees, the demo's hint.
- A directory argument stands for its row files (`gym_failures.rows.row_files`): the files its
  manifests name, never its tasks or injected faults. An input that names no file, or whose files
  hold no rollout row, is an error (exit status 2), never an empty table with exit status 0.
- A run's success rows named alone (`out.jsonl` beside its manifest) bring the run's failures
  (`out_failures.jsonl`), with a line on stderr: a run's rows without its failures count its final
  failures as missing. Not the other way round: the failures alone are what a user asks for when
  naming them. Every input is read once, however often it is named (`row_inputs`).
- `collect --output out` (no `.jsonl`) writes `out.jsonl` and `out_failures.jsonl`, and says so:
  the readers find a run's rows by that suffix. Any other suffix (`out.json`) is refused.
- `collect` exits 1 when the run's rows (this invocation's and the resumed runs') hold no success,
  in one line naming the most common final failure kinds, the agent URL when no request reached it,
  and the status when every final failure has the same one. A re-run of a run where nothing
  succeeded exits 1 again: a script must not read "nothing left to do" as success. A task file
  without a task is exit status 2, before anything is written.
- `collect --output DIR` takes the rows file the directory's one manifest names (a demo's run
  holds tasks and injected faults beside it); without one manifest the collector chooses (a NeMo Gym
  run's: the rows beside its one `<stem>_materialized_inputs.jsonl`).
- Messages name the command line's flags (`--num-repeats`, `--force-resume`), never the
  collection's field names.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_failures.cli._app import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    METRICS_MODULES,
    CommandError,
    Subcommands,
    add_command,
    add_metrics_option,
    needs_extra,
    plural,
    program,
    require_extra,
    require_file,
    shell_path,
    skipped_text,
)
from gym_failures.cli._serve import add_serve, add_verdict
from gym_failures.cli._text import print_json, stderr_line

if TYPE_CHECKING:
    from gym_failures.collection import CollectionSummary
    from gym_failures.reporting.explain import RowExplanation
    from gym_failures.reporting.summary import Summary
    from gym_failures.telemetry import CollectionProgress

__all__ = [
    "COMMANDS",
    "EXTRA_MODULES",
    "GATE_DEFAULTS",
    "PROGRESS_MIN_BYTES",
    "add_collect",
    "add_demo",
    "add_explain",
    "add_gate",
    "add_summarize",
    "longest_chain",
    "next_steps",
    "row_inputs",
]

# Below this much input a summary takes about a second: a progress bar would only flicker.
PROGRESS_MIN_BYTES = 50 * 1024 * 1024

EXTRA_MODULES = frozenset({"aiohttp", "duckdb", "rich", "starlette", "uvicorn", "yarl", "multidict"})
"""The optional dependencies whose absence is a missing extra, not a bug."""

GATE_DEFAULTS = {
    "min_scored_share": 0.95,
    "max_evaluation_share": 0.02,
    "max_unknown_share": 0.0,
    "max_missing": 0,
}
"""`GateThresholds()`'s defaults, shown in `gate --help` without importing the gate (a test keeps
them equal)."""

GRADING_WITHOUT_VERDICT_KIND = "grading_without_verdict"

_TRANSPORT_KINDS = frozenset({"transport_unreachable", "transport_timeout", "transport_connection_reset"})
"""Failure kinds that mean no reply came from the agent server."""


# --- option types ------------------------------------------------------------------------------


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share between 0 and 1")
    return value


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {minimum}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def _seconds_or_zero(text: str) -> float:
    """A finite number of seconds of at least 0 (a wait: 0 is none, an endless one is refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number of seconds of at least 0")
    return value


def _agent_url(text: str) -> str:
    """An agent URL whose port, when it names one, is a port: `http://127.0.0.1:99999` is refused
    here, naming the port. The collector checks the rest; neither echoes the URL, which may hold a
    password."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a URL") from None
    try:
        parts.port  # noqa: B018 (reading it is the check)
    except ValueError:
        port = parts.netloc.rpartition("@")[2].rpartition("]")[2].rpartition(":")[2]
        if port.isascii() and port.isdigit() and int(port) > 65535:
            raise argparse.ArgumentTypeError(f"the port {int(port)} is out of range (0-65535)") from None
        # `h:1:2`, `h:-1`, `h:x`: what follows the host is no port at all (never echoed: it may be
        # part of a password the URL was written around).
        raise argparse.ArgumentTypeError("the host is not followed by a valid port") from None
    return text


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", dest="json_output", action="store_true", help="print one JSON document instead of tables"
    )


def _paths_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="JSONL files of saved rows, or run directories (their row files, as the manifest names them)",
    )


# --- inputs ------------------------------------------------------------------------------------


def _runs_inside(directory: Path, shown: int = 3) -> str:
    """ ", it holds runs: a, b (name one)" for a directory of run directories (`runs/`, `make demo`'s
    parent of its runs), naming the newest `shown`; "" for any other."""
    from gym_failures.rows import row_files

    runs = sorted(
        (child for child in directory.iterdir() if child.is_dir() and row_files(child)), reverse=True
    )
    if not runs:
        return ""
    names = ", ".join(shell_path(run) for run in runs[:shown])
    more = f" and {len(runs) - shown} more" if len(runs) > shown else ""
    return f"; it holds {plural(len(runs), 'run')}: {names}{more} (name one)"


def row_inputs(paths: Iterable[Path], *, run_failures: bool = True) -> list[Path]:
    """The row files `paths` name, each once: a file as itself, a directory as its row files.

    A run's success rows named alone (`out.jsonl`, its collection manifest `out.manifest.json`
    beside it) bring the run's failures (`out_failures.jsonl`) with them unless `run_failures` is
    false (`explain --line` reads the one file named): without them the run's final failures would
    count as missing. Likewise a run's failures named alone bring its successes when its materialized
    inputs sit beside them (which the gate counts rollouts that left no row against). One line on
    stderr says so. A file named twice, or also through its directory,
    is read once.

    Raises `CommandError` for a path that does not exist, is not a file or a directory, or is a
    directory without row files.
    """
    from gym_failures.nemo_gym import materialized_inputs_path
    from gym_failures.rows import row_files, run_failures_file, run_row_files

    named: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = row_files(path)
            if not found:
                raise CommandError(f"{path}: no row files (*.jsonl) in this directory{_runs_inside(path)}")
            named.extend(found)
        elif path.is_file():
            _readable(path)
            named.append(path)
        elif path.exists():
            raise CommandError(f"{path}: not a file or a directory")
        else:
            raise CommandError(f"{path}: no such file or directory")
    files: dict[Path, Path] = {}
    for path in named:
        files.setdefault(path.resolve(), path)  # the first spelling of each
    ordered = list(files.values())
    if not run_failures:
        return ordered
    result: list[Path] = []
    for path in ordered:
        result.append(path)
        failures = run_failures_file(path)
        if failures is not None and failures.resolve() not in files:
            files[failures.resolve()] = failures
            result.append(failures)
            stderr_line(f"reading {failures} too: the failures of {path}'s run")
        if failures is None and materialized_inputs_path(path).is_file():
            # A run's failures named alone, its materialized inputs beside them: its successes too,
            # else each would count as a rollout that left no row at all.
            for rows in run_row_files(path)[1:]:
                if rows.resolve() not in files:
                    files[rows.resolve()] = rows
                    result.append(rows)
                    stderr_line(f"reading {rows} too: the successes of {path}'s run")
    return result


def _readable(path: Path) -> None:
    """Refuse a file whose first bytes cannot be read, naming it (a read error names no file)."""
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as error:
        raise CommandError(f"{path}: {error.strerror or error}") from None


def _writable_file(path: Path, option: str) -> None:
    """Refuse, before any work, an output file that cannot be written where it is named."""
    if path.is_dir():
        raise CommandError(f"{option} {path}: is a directory; name a file")
    parent = path.parent
    if not parent.is_dir():
        raise CommandError(f"{option} {path}: the directory {parent} does not exist")


def _warn(message: str) -> None:
    stderr_line(f"warning: {message}")


# --- summarize ---------------------------------------------------------------------------------


def add_summarize(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "summarize",
        _run_summarize,
        counts_skipped_lines=True,
        help="failures by class, kind, boundary, stage and attempt",
        description="Failures by class, kind, boundary, stage and attempt; the most common reasons; "
        "quota resets. Needs the cli extra (duckdb, rich).",
        extra="cli",
    )
    _paths_argument(parser)
    _json_option(parser)
    parser.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write a self-contained HTML report to FILE: charts, the gate's verdict and the "
        "failed attempt with the longest cause chain",
    )


def _run_summarize(arguments: argparse.Namespace) -> int:
    import duckdb

    from gym_failures.cli._render import print_summary, progress_bar, stdout_line
    from gym_failures.reporting.summary import summarize

    files = row_inputs(arguments.paths)
    html: Path | None = arguments.html
    if html is not None:
        _writable_file(html, "--html")
    size = sum(path.stat().st_size for path in files)
    with progress_bar(size > PROGRESS_MIN_BYTES, "summarizing") as update:
        on_progress = None if update is None else (lambda percent: update(percent, 100.0))
        try:
            summary = summarize(files, on_progress=on_progress)
        except duckdb.Error as error:
            raise CommandError(f"could not read the rows: {str(error).splitlines()[0]}") from None
    _check_summary(summary, files)
    if html is not None:
        html.write_text(_html_report(summary, files), encoding="utf-8")
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
        _warn(f"{lines} (not JSON, or neither a result nor a failure)")


def _html_report(summary: Summary, files: Sequence[Path]) -> str:
    from gym_failures import gate as acceptance
    from gym_failures.reporting.html import render_html

    verdict = acceptance.check(acceptance.read_coverage(files), acceptance.GateThresholds())
    return render_html(summary, verdict=verdict, explanation=longest_chain(files))


# --- explain -----------------------------------------------------------------------------------


def _no_row_of_rollout(files: Sequence[Path], rollout: str) -> str:
    """Why `explain --rollout` found no row of `rollout`: one the materialized inputs beside `files`
    owe left no row at all (killed or drained, as `gate` counts it), which a resume dispatches; any
    other is in none of `files`."""
    from gym_failures.nemo_gym import inventory_paths, read_inventory
    from gym_failures.rows import rollout_id

    inventories = inventory_paths(files)
    if inventories and rollout in {rollout_id(*key) for key in read_inventory(inventories).keys}:
        names = ", ".join(str(path) for path in inventories)
        return (
            f"rollout {rollout!r} is owed by the materialized inputs ({names}) and left no row at all "
            "(killed or drained): a resume dispatches it"
        )
    return f"no row of rollout {rollout!r} in {', '.join(str(path) for path in files)}"


def add_explain(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "explain",
        _run_explain,
        counts_skipped_lines=True,
        help="the cause tree of one row or one rollout",
        description="The cause tree of one row or rollout across every hop: origin event ids, "
        "boundaries, omitted parts. Needs the cli extra (rich).",
        extra="cli",
    )
    _paths_argument(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--line",
        type=_at_least(1),
        metavar="N",
        help="the row on line N of the one file given (1-based, every line counted, as editors and "
        "`grep -n` number them); `explain FILE:N` is the same, as the cause trees' labels print it",
    )
    which.add_argument("--rollout", metavar="ID", help="every row of rollout ID, by attempt")
    _json_option(parser)


def _run_explain(arguments: argparse.Namespace) -> int:
    from gym_failures.reporting.explain import line_row, rollout_rows

    if arguments.line is None and arguments.rollout is None:
        arguments.paths, arguments.line = _labelled_line(arguments.paths)
    files = row_inputs(arguments.paths, run_failures=arguments.line is None)
    if arguments.line is not None:
        if len(arguments.paths) == 1 and arguments.paths[0].is_dir():
            # Lines are numbered per file: name the file, as the labels `FILE:N` do.
            names = " or ".join(f"{path}:{arguments.line}" for path in files[:2])
            raise CommandError(f"--line numbers the lines of one file, not of a directory: try {names}")
        if len(arguments.paths) != 1:
            raise CommandError("--line needs exactly one file")
        found = line_row(files[0], arguments.line)
        explanations = [] if found is None else [found]
        missing = f"{files[0]} has no line {arguments.line}"
    else:
        explanations = rollout_rows(files, arguments.rollout)
        missing = _no_row_of_rollout(files, arguments.rollout)
    if arguments.json_output:
        # json.dumps, not pydantic's serializer: a saved row may hold a lone surrogate ("\ud800"), which
        # pydantic refuses to encode and JSON writes as an escape.
        print_json(json.dumps([item.model_dump(mode="json") for item in explanations], indent=2))
    else:
        from gym_failures.cli._render import explanation_tree, print_tree

        for explanation in explanations:
            print_tree(explanation_tree(explanation))
    if not explanations:
        stderr_line(f"gym-failures explain: {missing}")
        return EXIT_FAILED
    return EXIT_OK


def _labelled_line(paths: list[Path]) -> tuple[list[Path], int]:
    """`FILE:N`, as the cause trees' labels print a row, read as FILE and `--line N`."""
    import re

    label = re.fullmatch(r"(.+):([1-9][0-9]*)", str(paths[0])) if len(paths) == 1 else None
    if label is None or paths[0].exists() or not Path(label.group(1)).is_file():
        raise CommandError("name a row: --line N (or FILE:N, as the labels print it) or --rollout ID")
    return [Path(label.group(1))], int(label.group(2))


# --- gate --------------------------------------------------------------------------------------


def add_gate(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "gate",
        _run_gate,
        counts_skipped_lines=True,
        help="check a run's coverage against thresholds (exit 0 passes, 1 fails)",
        description="Coverage of a run's rows and the verdict against thresholds: exit status 0 if "
        "the run passes, 1 if it does not. Needs the cli extra (rich).",
        extra="cli",
    )
    _paths_argument(parser)
    parser.add_argument(
        "--expected",
        type=_at_least(0),
        metavar="N",
        help="rollouts expected (default: NeMo Gym's materialized inputs beside the rows, "
        "<output>_materialized_inputs.jsonl, else the collection manifest, <output>.manifest.json; "
        "without either, the distinct rollouts seen, with a warning)",
    )
    for name, what in (
        ("min_scored_share", "least share of expected rollouts scored"),
        ("max_evaluation_share", "most share failed or gate-derived evaluation-side"),
        ("max_unknown_share", "most share of unknown responsibility"),
    ):
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=_share,
            metavar="SHARE",
            help=f"{what} (default {GATE_DEFAULTS[name]})",
        )
    parser.add_argument(
        "--max-missing",
        type=_at_least(0),
        metavar="N",
        help=f"most expected rollouts without a final outcome (default {GATE_DEFAULTS['max_missing']})",
    )
    _json_option(parser)


def _run_gate(arguments: argparse.Namespace) -> int:
    from gym_failures import gate as acceptance

    files = row_inputs(arguments.paths)
    given = {name: getattr(arguments, name) for name in GATE_DEFAULTS if getattr(arguments, name) is not None}
    thresholds = acceptance.GateThresholds(**given) if given else None  # None: the defaults
    coverage = acceptance.read_coverage(files, arguments.expected)
    if coverage.seen == 0:
        names = ", ".join(str(path) for path in files)
        if coverage.expected_source == "rows_seen":
            raise CommandError(f"no rollout rows in {names}, and no manifest says how many were expected")
        _warn(f"no rollout rows in {names}")
    if coverage.invalid_lines or coverage.torn_tails:
        _warn(skipped_text(coverage.invalid_lines, coverage.torn_tails))
    verdict = acceptance.check(coverage, thresholds)
    for warning in verdict.warnings:
        _warn(warning)
    if arguments.json_output:
        print_json(json.dumps(verdict.as_dict(), indent=2))
    else:
        from gym_failures.cli._render import print_verdict

        print_verdict(verdict)
    return EXIT_OK if verdict.passed else EXIT_FAILED


# --- collect -----------------------------------------------------------------------------------


def add_collect(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "collect",
        _run_collect,
        help="dispatch rollouts to an agent server and save every attempt",
        description="Dispatch every task's rollouts to an agent server, save each attempt, resume "
        "what is unfinished. Success rows go to OUTPUT.jsonl, failures to OUTPUT_failures.jsonl, the "
        "manifest to OUTPUT.manifest.json. Needs the aiohttp and cli extras.",
        extra="aiohttp,cli",
    )
    parser.add_argument("input_path", type=Path, metavar="INPUT", help="JSONL of tasks, one a line")
    parser.add_argument(
        "--agent-url", required=True, type=_agent_url, metavar="URL", help="the agent server's base URL"
    )
    parser.add_argument(
        "--output",
        required=True,
        type=_output_argument,
        metavar="OUTPUT",
        help="the success rows' file, OUTPUT.jsonl (`.jsonl` is added when missing), or a run "
        "directory (the rows file its manifest names)",
    )
    parser.add_argument(
        "--num-repeats", type=_at_least(1), default=1, metavar="N", help="rollouts per task (1)"
    )
    parser.add_argument(
        "--concurrency", type=_at_least(1), default=16, metavar="N", help="rollouts in flight (16)"
    )
    parser.add_argument(
        "--max-attempts",
        type=_at_least(1),
        default=None,
        metavar="N",
        help="attempts per rollout (NeMo Gym's budget: $NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, else 3)",
    )
    parser.add_argument(
        "--timeout", type=_seconds, default=120.0, metavar="SECONDS", help="per attempt (120)"
    )
    _add_recovery_options(parser)
    parser.add_argument(
        "--force-resume",
        action="store_true",
        help="resume even when the output was collected from a different input",
    )
    parser.add_argument(
        "--agent-name",
        default=None,
        metavar="NAME",
        help="the agent's name (as NeMo Gym's config names it), never its URL: every row's agent_ref, "
        "what NeMo Gym's aggregation groups by, and in metrics (a resumed run's own; else `agent`)",
    )
    parser.add_argument(
        "--agent-protocol",
        choices=("gym-failures", "nemo-gym"),
        default=None,
        help="the /run the agent speaks: gym-failures' episode protocol, or nemo-gym, NeMo Gym's own "
        "agents' (the materialized row in, the flat verify response out); default: the run's own, "
        "nemo-gym for a run NeMo Gym wrote, else gym-failures",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run on Ray workers at a cluster's ADDRESS (none: RAY_ADDRESS, else a local Ray; ray extra)",
    )
    parser.add_argument(
        "--workers",
        type=_at_least(1),
        default=None,
        metavar="N",
        help="Ray workers, each with --concurrency rollouts in flight (2; needs --ray)",
    )
    add_metrics_option(parser)
    _json_option(parser)


def _add_recovery_options(parser: argparse.ArgumentParser) -> None:
    """`collect`'s options for failing well: the backoff, the hints' bound, the readiness wait, and
    which closed rollouts a resume reopens."""
    parser.add_argument(
        "--backoff-initial",
        type=_seconds_or_zero,
        default=None,
        metavar="SECONDS",
        help="the least wait before a rollout's next attempt; each later one up to 3 times the last "
        "(decorrelated jitter), 0 retries at once ($GYM_FAILURES_BACKOFF_INITIAL_S, else 1)",
    )
    parser.add_argument(
        "--backoff-max",
        type=_seconds_or_zero,
        default=30.0,
        metavar="SECONDS",
        help="the longest backoff wait (30)",
    )
    parser.add_argument(
        "--retry-after-max",
        type=_seconds_or_zero,
        default=300.0,
        metavar="SECONDS",
        help="the longest wait a failure's Retry-After, retry-after-ms or quota reset is honoured for (300)",
    )
    parser.add_argument(
        "--wait-ready",
        type=_seconds_or_zero,
        default=None,
        metavar="SECONDS",
        help="how long the agent may take to accept connections, at the start and after a run of "
        "transport failures, before the run ends with exit 1, budgets kept; 0: no wait, no pause "
        "($GYM_FAILURES_WAIT_READY_S, else 60)",
    )
    parser.add_argument(
        "--retry-terminal",
        action="store_true",
        help="on resume, also reopen rollouts closed by a failure the agent marked terminal (within "
        "--max-attempts; rollouts closed by the budget reopen whenever --max-attempts is raised)",
    )


def _output_argument(text: str) -> Path:
    """`--output` as a path; `newdir/` (a trailing slash, no such directory yet) is a run directory to
    make, its rows `newdir/rollouts.jsonl` (as the collector names a directory's rows), never
    `newdir.jsonl` beside it."""
    path = Path(text)
    if text.endswith(("/", os.sep)) and not path.exists():
        return path / "rollouts.jsonl"
    return path


def _output_path(output: Path) -> Path:
    if output.is_dir():
        from gym_failures.rows import run_rows_file

        # A run directory: the rows file its one manifest names (a demo's run, beside its tasks and
        # injected faults); else the collector names it (the one `*.jsonl`, as NeMo Gym's runs hold).
        rows = run_rows_file(output)
        return output if rows is None else rows
    if output.suffix == ".jsonl":
        return output
    if output.suffix:
        raise CommandError(f"--output {output}: the rows' file must end in .jsonl")
    completed = output.with_name(f"{output.name}.jsonl")
    _warn(f"--output {output} has no .jsonl suffix: writing {completed}")
    return completed


_FLAGS = {"agent_url": "--agent-url", "input_path": "INPUT", "output_path": "--output"}

# The collection's messages name its fields and options; the command line names its flags.
_FLAG_WORDS = (
    ("num_repeats", "--num-repeats"),
    ("wait_ready_s", "--wait-ready"),
    ("force the resume", "pass --force-resume"),
    ("output path", "--output"),
)


def _flag_words(text: str, paths: Sequence[Path]) -> str:
    """`text`, a message of the collection, naming the command line's flags instead of its fields;
    the `paths` it quotes are kept as they are (a directory may be called `output_path`)."""
    kept = sorted((str(path) for path in paths), key=len, reverse=True)
    for index, path in enumerate(kept):
        text = text.replace(path, f"\0{index}\0")
    for field, flag in (*_FLAG_WORDS, *_FLAGS.items()):
        text = text.replace(field, flag)
    for index, path in enumerate(kept):
        text = text.replace(f"\0{index}\0", path)
    return text


def _config_error(error: Any, output: Path) -> CommandError:
    """A `CollectionConfig` validation error as one line naming the option (its input never shown but
    the `output` path)."""
    problems = []
    for item in error.errors(include_url=False, include_input=False):
        field = str(item["loc"][0]) if item["loc"] else ""
        flag = (
            f"--output {output}"
            if field == "output_path"
            else _FLAGS.get(field, "--" + field.replace("_", "-"))
        )
        cause = (item.get("ctx") or {}).get("error")
        text = str(cause) if item["type"] == "value_error" and cause is not None else str(item["msg"])
        # "output_path is a directory ..." reads "--output is a directory ...", not "--output: --output is".
        problems.append(f"{flag}{text[len(field) :]}" if text.startswith(f"{field} ") else f"{flag}: {text}")
    return CommandError("; ".join(problems))


@contextlib.contextmanager
def _quiet_row_reader() -> Iterator[None]:
    """Silence the row and task readers' warning per skipped line for the block: the collection warns
    about those lines itself, when it reads the same files."""
    import logging

    rows = logging.getLogger("gym_failures.collection")  # `gym_failures.rows` logs under this name
    level = rows.level
    rows.setLevel(logging.ERROR)
    try:
        yield
    finally:
        rows.setLevel(level)


def _require_tasks(path: Path) -> None:
    """Refuse a task file that holds no task (empty, or only blank and invalid lines) before any
    output is written."""
    from gym_failures.rows import TaskScan, read_tasks

    if path.is_dir():
        raise CommandError(f"{path} is a directory; name the task file")
    require_file(path, str(path))
    scan = TaskScan(path)
    # The reader is dropped after its first task: CPython closes it (and its file) at once.
    with _quiet_row_reader():
        if next(read_tasks(path, scan), None) is not None:
            return
    found = []
    if scan.invalid_lines:
        found.append(
            f"{plural(len(scan.invalid_lines), 'invalid line')}, the first line {scan.invalid_lines[0] + 1}"
        )
    if scan.blank_lines:
        found.append(plural(scan.blank_lines, "blank line"))
    raise CommandError(f"no tasks in {path} ({'; '.join(found) or 'an empty file'})")


def _run_collect(arguments: argparse.Namespace) -> int:
    if arguments.metrics_port is not None:
        require_extra("--metrics-port", "prometheus", METRICS_MODULES)
    from pydantic import ValidationError

    from gym_failures._loop import run as run_loop
    from gym_failures.cli._live import live_collection, metrics_endpoint
    from gym_failures.collection import AgentDown, CollectionConfig
    from gym_failures.collection import collect as run_collection
    from gym_failures.collection._protocols import default_protocol
    from gym_failures.failure_kinds import COLLECTION_DISPATCH_FAILED, COLLECTION_RESUME_REFUSED
    from gym_failures.failures import NgFailureEvent
    from gym_failures.telemetry import CollectionProgress

    if arguments.workers is not None and arguments.ray is None:
        raise CommandError("--workers needs --ray")
    _require_tasks(arguments.input_path)
    options: dict[str, Any] = {"max_attempts": arguments.max_attempts} if arguments.max_attempts else {}
    if arguments.agent_name is not None:
        options["agent_name"] = arguments.agent_name  # set only when named: a resumed run keeps its own
    if arguments.backoff_initial is not None:
        options["backoff_initial_s"] = arguments.backoff_initial
    if arguments.wait_ready is not None:
        options["wait_ready_s"] = arguments.wait_ready
    output = _output_path(arguments.output)
    try:
        config = CollectionConfig(
            input_path=arguments.input_path,
            output_path=output,
            agent_url=arguments.agent_url,
            num_repeats=arguments.num_repeats,
            concurrency=arguments.concurrency,
            timeout_s=arguments.timeout,
            force_resume=arguments.force_resume,
            backoff_max_s=arguments.backoff_max,
            retry_after_max_s=arguments.retry_after_max,
            retry_terminal=arguments.retry_terminal,
            **options,
        )
    except ValidationError as error:
        raise _config_error(error, arguments.output) from None
    protocol = arguments.agent_protocol or default_protocol(config.output_path)
    config = config.model_copy(update={"agent_protocol": protocol})
    with contextlib.ExitStack() as running:
        if arguments.metrics_port is not None:
            running.enter_context(metrics_endpoint(arguments.metrics_port, "gym-failures-collect"))
        live = running.enter_context(live_collection())
        seen: list[CollectionProgress] = []

        def on_progress(progress: CollectionProgress) -> None:
            seen[:] = [progress]
            live(progress)

        try:
            if arguments.ray is not None:
                collect_on_ray, ray_join_error = _ray_collector()
                running_on_ray = collect_on_ray(
                    config, on_progress, workers=arguments.workers or 2, address=arguments.ray or None
                )
                try:
                    summary = run_loop(running_on_ray)
                except ray_join_error as error:  # an address Ray cannot use or reach: nothing ran
                    raise CommandError(f"--ray: {error}") from None
            else:
                summary = run_loop(run_collection(config, on_progress))
        except AgentDown as failure:  # the agent accepted no connection within --wait-ready
            raise CommandError(_flag_words(failure.failure_reason, ()), status=EXIT_FAILED) from None
        except NgFailureEvent as failure:
            if failure.failure_kind == COLLECTION_DISPATCH_FAILED:  # every Ray worker was lost
                raise CommandError(failure.failure_reason, status=EXIT_FAILED) from None
            if failure.failure_kind != COLLECTION_RESUME_REFUSED:
                raise
            quoted = (config.output_path, config.lock_path)
            raise CommandError(_flag_words(failure.failure_reason, quoted)) from None
    return _collect_result(summary, seen[0] if seen else CollectionProgress(), config, arguments)


def _collect_result(
    summary: CollectionSummary, progress: CollectionProgress, config: Any, arguments: argparse.Namespace
) -> int:
    """Print a finished collection's figures (its successes in the gate's words) and give its exit
    status: 1 when the run's rows hold no success, or when no attempt of this run reached the agent."""
    from dataclasses import fields

    from gym_failures.cli._render import print_collection

    figures: dict[str, Any] = {}
    for field in fields(summary):
        if field.name != "scans":
            figures[field.name] = getattr(summary, field.name)
        if field.name == "succeeded":
            figures.update(_outcome_figures(progress))
    if arguments.json_output:
        print_json(json.dumps(figures, indent=2))
    else:
        print_collection(figures, config.output_path, config.failures_path)
    _say_unmeasured(progress)
    if summary.succeeded == 0 and not _any_success(config.output_path):
        return _no_success(config.failures_path, arguments.agent_url, summary)
    unreached_only = set(progress.failed_attempts_by_kind) <= _TRANSPORT_KINDS
    if progress.attempts and unreached_only and not progress.succeeded:
        # Every attempt of this run reached no agent: the run's earlier successes do not make it a pass.
        unreached = ", ".join(f"{kind} {count}" for kind, count in progress.failed_attempts_by_kind.items())
        stderr_line(
            f"gym-failures collect: the agent at {_safe_url(arguments.agent_url)} could not be reached "
            f"by any of this run's {plural(progress.attempts, 'attempt')} ({unreached})"
        )
        return EXIT_FAILED
    return EXIT_OK


def _safe_url(url: str) -> str:
    from gym_failures.redaction import url_without_secrets

    return url_without_secrets(url)


def _outcome_figures(progress: CollectionProgress) -> dict[str, Any]:
    """This run's successes as the gate counts them (`gym-failures gate`'s words for its counts)."""
    return {
        "scored": progress.scored,
        "of_which_degraded": progress.degraded,
        "masked": progress.masked,
        "gate_derived": dict(progress.gate_derived_by_kind),
    }


def _say_unmeasured(progress: CollectionProgress) -> None:
    """Say once, at the end, when successes hold nothing the gate can score, and what to return."""
    unmeasured = progress.gate_derived_by_kind.get(GRADING_WITHOUT_VERDICT_KIND, 0)
    if unmeasured:
        stderr_line(
            f"gym-failures collect: {unmeasured} of {plural(progress.succeeded, 'success', 'successes')} "
            "hold no measurement the gate can score (grading_without_verdict): return a finite "
            '"reward" in the result, or a verdict in result["verification"]["verdict"] (docs/agents.md)'
        )


def _ray_collector() -> tuple[Any, type[Exception]]:
    """`collect_on_ray` and the error it raises when Ray cannot be joined, or the missing extra."""
    try:
        from gym_failures.ray import RayJoinError, collect_on_ray
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != "ray":
            raise
        raise CommandError(needs_extra("--ray", "ray", "ray")) from None
    return collect_on_ray, RayJoinError


def _any_success(rows: Path) -> bool:
    """Whether the run's success rows (`rows`, resumed runs' included) hold one success."""
    from gym_failures.rows import is_rollout_row, read_rows

    with _quiet_row_reader():
        return any(is_rollout_row(row) and "failure" not in row for row in read_rows(rows))


def _no_success(failures: Path, agent_url: str, summary: CollectionSummary) -> int:
    """Say in one line why no rollout of the run succeeded; exit status 1."""
    from gym_failures.redaction import url_without_secrets
    from gym_failures.rows import read_rows

    kinds: Counter[str] = Counter()
    statuses: Counter[object] = Counter()
    with _quiet_row_reader():
        for row in read_rows(failures):
            if row.get("final") is True:
                # A resumed run's rows are read, never trusted: a value of the wrong type is no kind.
                failure, record = row.get("failure"), row.get("rollout_failure")
                kind = failure.get("failure_kind") if isinstance(failure, dict) else None
                kinds[kind if isinstance(kind, str) else "(none)"] += 1
                status = record.get("http_status") if isinstance(record, dict) else None
                # Only an error status says the agent answered no: an episode failure comes in a 200.
                statuses[status if type(status) is int and 400 <= status <= 599 else None] += 1
    common = ", ".join(f"{kind} {count}" for kind, count in kinds.most_common(3)) or "no failure rows"
    agent = f"the agent at {url_without_secrets(agent_url)}"
    none_of = (
        "the one rollout did not succeed"
        if summary.expected == 1
        else f"none of {summary.expected} rollouts succeeded"
    )
    if summary.expected == summary.already_done + summary.closed_on_resume:
        line = f"{none_of}, all done by an earlier run ({common})"
    elif kinds and set(kinds) <= _TRANSPORT_KINDS:
        line = f"{agent} could not be reached ({common})"
    elif len(statuses) == 1 and type(status := next(iter(statuses))) is int:
        line = f"{none_of}: {agent} answered {status} ({common})"
    else:
        line = f"{none_of} ({common})"
    stderr_line(f"gym-failures collect: {line}")
    return EXIT_FAILED


# --- demo --------------------------------------------------------------------------------------


def longest_chain(files: Iterable[Path]) -> RowExplanation | None:
    """The failed attempt with the longest cause chain in `files`, a final one on a tie, the first
    one on a further tie; None when no row has a failure event. A row NeMo Gym wrote without a report
    whose kept reply body is gym-failures' error body (`nemo_gym.reported_failure`) has a chain of one,
    the failure that body names."""
    from gym_failures.failure_transport import FailureReportRow
    from gym_failures.nemo_gym import FAILURE_RESPONSE_BODY, reported_failure
    from gym_failures.reporting.explain import line_row
    from gym_failures.rows import parse_line

    best: tuple[int, bool, int, int] | None = None
    where: tuple[Path, int] | None = None
    for order, path in enumerate(files):
        with path.open("rb") as handle:
            for number, line in enumerate(handle, start=1):
                if b'"failure"' not in line and b"_ng_failure_class" not in line:
                    continue
                row, _ = parse_line(line)
                if row is None:
                    continue
                report = FailureReportRow.report(row)
                depth, event_id = 0, report.failure_id
                while event_id is not None and event_id in report.events and depth <= len(report.events):
                    depth, event_id = depth + 1, report.events[event_id].cause_id
                if not depth and reported_failure(row.get(FAILURE_RESPONSE_BODY)) is not None:
                    depth = 1
                key = (depth, row.get("final") is True, -order, -number)
                if depth and (best is None or key > best):
                    best, where = key, (path, number)
    return None if where is None else line_row(*where)


def add_demo(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "demo",
        _run_demo,
        help="run a local gym with injected faults, then summarize, gate and explain it",
        description="Start a model server, a resources server (verifier, judge, sandbox) and an agent "
        "server on loopback, collect the rollouts into OUT/<timestamp>/, print the summary, the gate's "
        "verdict and the cause tree of the failed attempt with the longest cause chain, and write "
        "report.html there. Needs the demo extra.",
        extra="demo",
    )
    parser.add_argument("--out", type=Path, default=Path("runs"), help="parent of the run directory (runs)")
    parser.add_argument("--rollouts", type=_at_least(1), default=200, metavar="N", help="rollouts (200)")
    parser.add_argument("--concurrency", type=_at_least(1), default=16, metavar="N", help="in flight (16)")
    parser.add_argument(
        "--fault-plan", type=Path, metavar="FILE", help="a fault plan JSON (the packaged one)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the scripted policy and the fault draws (0)"
    )
    parser.add_argument(
        "--model-base-url",
        metavar="URL",
        help="an OpenAI-compatible base URL for the policy instead of the scripted one (or "
        "$GYM_DEMO_MODEL_BASE_URL); its key comes from $GYM_DEMO_MODEL_API_KEY or $OPENAI_API_KEY",
    )
    parser.add_argument(
        "--model-name", metavar="NAME", help="the external policy model (or $GYM_DEMO_MODEL_NAME)"
    )
    parser.add_argument(
        "--stream",
        choices=("auto", "always", "never"),
        default="auto",
        help="whether policy calls stream (auto)",
    )
    parser.add_argument(
        "--policy-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="one policy call's limit (default: the fault plan's, or 60 with an external model)",
    )


def _run_demo(arguments: argparse.Namespace) -> int:
    import os

    from gym_failures.cli._live import live_collection
    from gym_failures.demo import DemoOptionsError, run_demo

    if arguments.fault_plan is not None:
        require_file(arguments.fault_plan, f"--fault-plan {arguments.fault_plan}")
    with live_collection() as on_progress:
        try:
            run_dir = run_demo(
                arguments.out,
                rollouts=arguments.rollouts,
                concurrency=arguments.concurrency,
                fault_plan=arguments.fault_plan,
                seed=arguments.seed,
                policy_base_url=arguments.model_base_url or os.environ.get("GYM_DEMO_MODEL_BASE_URL"),
                policy_model=arguments.model_name or os.environ.get("GYM_DEMO_MODEL_NAME"),
                stream=arguments.stream,
                policy_timeout_s=arguments.policy_timeout,
                on_progress=on_progress,
            )
        except KeyboardInterrupt:
            stderr_line("gym-failures demo: interrupted; every demo server is stopped")
            return EXIT_INTERRUPTED
        except DemoOptionsError as error:  # a refused option (a model URL with secrets); never echoes them
            raise CommandError(str(error)) from None
    _show_demo(run_dir, arguments.rollouts)
    return EXIT_OK


def _show_demo(run_dir: Path, rollouts: int) -> None:
    from gym_failures import gate as acceptance
    from gym_failures.cli._render import (
        explanation_tree,
        print_rule,
        print_summary,
        print_tree,
        print_verdict,
        stdout_line,
    )
    from gym_failures.reporting.html import render_html
    from gym_failures.reporting.summary import summarize

    files = [run_dir / "rollouts.jsonl", run_dir / "rollouts_failures.jsonl"]
    summary = summarize(files)
    verdict = acceptance.check(acceptance.read_coverage(files, rollouts), acceptance.GateThresholds())
    explanation = longest_chain(files[1:])
    report = run_dir / "report.html"
    report.write_text(render_html(summary, verdict=verdict, explanation=explanation), encoding="utf-8")
    print_rule("Summary")
    print_summary(summary)
    print_rule("Acceptance gate")
    print_verdict(verdict)
    if explanation is not None:
        print_rule("The failed attempt with the longest cause chain")
        print_tree(explanation_tree(explanation))
    print_rule("Files")
    stdout_line(f"rows:        {files[0]}\nfailures:    {files[1]}\nHTML report: {report}")
    stdout_line("Next: " + "\n      ".join(next_steps(run_dir, explanation)), style="dim")


def next_steps(run_dir: Path, explanation: RowExplanation | None) -> list[str]:
    """The commands the demo suggests after its run in `run_dir`, each one to paste as printed:
    `explain` of the rollout of `explanation` (the failed attempt it showed), and `gate`."""
    import shlex

    binary = program()
    steps = [f"{binary} gate {shell_path(run_dir)}"]
    if explanation is not None and explanation.rollout_id is not None:
        rollout = shlex.quote(explanation.rollout_id)
        steps.insert(0, f"{binary} explain {shell_path(run_dir)} --rollout {rollout}")
    return steps


COMMANDS: Sequence[Callable[[Subcommands], None]] = (
    add_summarize,
    add_explain,
    add_gate,
    add_collect,
    add_demo,
    add_serve,
    add_verdict,
)
"""Every command, in the order `--help` lists them."""
