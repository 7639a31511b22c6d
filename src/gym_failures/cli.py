"""The `gym-failures` command line: summarize, explain, gate and collect saved rollout rows; run the demo.

Every command prints rich tables for people and, with `--json`, one JSON document for machines.
Exit status: 0 on success (and when the gate passes), 1 when the gate fails or a requested row is not
found, 2 for usage errors (a missing path, a bad option, a refused resume). No command raises on a
torn or invalid line: such lines are skipped and counted.

Text from the rows (kinds, boundaries, stages, reasons, ids) is data, never markup or terminal
commands: every such value reaches rich as a `Text` (no `[bold]` or `[link=...]` in a reason is
interpreted), with the terminal control characters (C0 but tab and newline, DEL, C1) stripped, so an
escape sequence saved in a reason cannot reach the terminal. `--json` keeps every value as saved; its
DEL and C1 characters are written as `\\u` escapes (the same JSON), so the document is safe to print too.

Needs the `cli` extra (typer, rich, duckdb); `collect` also needs the `aiohttp` extra.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import duckdb
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from gym_failures import gate as acceptance
from gym_failures.failure_kinds import COLLECTION_RESUME_REFUSED, FailureClass
from gym_failures.reporting.explain import EventNode, RowExplanation, line_row, rollout_rows
from gym_failures.reporting.html import render_html
from gym_failures.reporting.summary import GroupCount, Summary, input_files
from gym_failures.reporting.summary import summarize as summarize_rows

__all__ = ["app", "main"]

# Below this much input a summary takes about a second: a progress bar would only flicker.
PROGRESS_MIN_BYTES = 50 * 1024 * 1024

app = typer.Typer(
    name="gym-failures",
    help="Summarize, explain and gate the failure reports saved beside rollouts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
PathsArgument = Annotated[
    list[Path],
    typer.Argument(
        exists=True,
        readable=True,
        help="JSONL files of saved rows, or directories (every *.jsonl directly inside).",
        show_default=False,
    ),
]

_CLASS_STYLES = {"model": "blue", "evaluation": "red", "unknown": "yellow"}

# Terminal control characters: C0 but tab and newline, DEL, and C1.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_C1 = re.compile("[\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def main() -> None:
    """The console script's entry point."""
    app()


def _console(stderr: bool = False) -> Console:
    # Piped output is read by people later (CI logs, files): a fixed width keeps reasons and ids
    # whole instead of cut to the 80 columns rich assumes without a terminal.
    console = Console(stderr=stderr, highlight=False)
    return console if console.is_terminal else Console(stderr=stderr, highlight=False, width=160)


def _stdout() -> Console:
    return _console()


def _stderr() -> Console:
    return _console(stderr=True)


def _print_json(text: str) -> None:
    # JSON escapes C0 itself; DEL and C1 may stand raw in a string, and some terminals act on C1.
    # Outside strings they cannot occur in valid JSON, so escaping them keeps the same document.
    sys.stdout.write(_C1.sub(lambda match: f"\\u{ord(match.group()):04x}", text) + "\n")


def _clean(value: object) -> str:
    """Text from a row for the terminal: `(none)` for None, terminal control characters stripped, a
    lone surrogate (a row may hold "\ud800") replaced, since no terminal encoding can write it."""
    text = _CONTROL.sub("", "(none)" if value is None else str(value))
    return _SURROGATE.sub("\ufffd", text)


def _cell(value: object, style: str = "") -> Text:
    """A value from a row as plain text (never markup) without terminal control characters."""
    return Text(_clean(value), style=style)


@contextmanager
def _progress_bar(enabled: bool, description: str) -> Iterator[Callable[[float, float], None] | None]:
    """A progress callback (done, total) drawing a rich bar on stderr, or None when not `enabled` or
    stderr is no terminal (a bar in a log file is noise)."""
    console = _stderr()
    if not enabled or not console.is_terminal:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(description, total=None)

        def update(done: float, total: float) -> None:
            progress.update(task, completed=done, total=total)

        yield update


def _usage_error(message: str) -> typer.Exit:
    _stderr().print(Text(f"Error: {message}", style="red"))
    return typer.Exit(code=2)


# --- summarize ---------------------------------------------------------------------------------


def _group_table(title: str, groups: Sequence[GroupCount]) -> Table:
    table = Table(title=f"Failures by {title}", title_justify="left")
    table.add_column(title, overflow="fold")
    for name in ("failure rows", "final", "share"):
        table.add_column(name, justify="right")
    for group in groups:
        table.add_row(_cell(group.value), str(group.count), str(group.final), f"{group.share:.1%}")
    return table


def _print_summary(summary: Summary) -> None:
    console = _stdout()
    console.print(
        Text(
            f"{summary.rows} rows: {summary.success_rows} success rows "
            f"({summary.recovered_success_rows} recovered from failures), {summary.failure_rows} "
            f"failure rows ({summary.final_failure_rows} final), {summary.other_rows} other lines"
        )
    )
    for torn in summary.torn_tails:
        console.print(_cell(f"{torn.path}: torn last line ({torn.bytes} bytes) skipped", style="yellow"))
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
            _cell(kind.value),
            _cell(kind.failure_class, style=_CLASS_STYLES.get(kind.failure_class, "")),
            str(kind.count),
            str(kind.final),
            f"{kind.share:.1%}",
        )
    console.print(classes, kinds)
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
        reasons.add_row(str(reason.count), _cell(reason.kind), _cell(reason.reason))
    console.print(attempts, reasons)
    if summary.quota_resets:
        resets = Table(title="Quota reset times", title_justify="left")
        resets.add_column("resets at")
        resets.add_column("quota events", justify="right")
        for reset in summary.quota_resets:
            resets.add_row(_cell(reset.resets_at), str(reset.events))
        console.print(resets)


@app.command()
def summarize(
    paths: PathsArgument,
    json_output: JsonOption = False,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Also write a self-contained HTML report with charts to this file."),
    ] = None,
) -> None:
    """Failures by class, kind, boundary, stage and attempt; the most common reasons; quota resets."""
    files = input_files(paths)
    size = sum(path.stat().st_size for path in files)
    with _progress_bar(size > PROGRESS_MIN_BYTES, "summarizing") as update:
        on_progress = None if update is None else (lambda percent: update(percent, 100.0))
        try:
            summary = summarize_rows(files, on_progress=on_progress)
        except duckdb.Error as error:
            _stderr().print(Text(f"Error: could not read the rows: {error}", style="red"))
            raise typer.Exit(code=1) from None
    if html is not None:
        html.write_text(render_html(summary), encoding="utf-8")
    if json_output:
        _print_json(summary.model_dump_json(indent=2))
    else:
        _print_summary(summary)
        if html is not None:
            _stdout().print(Text(f"HTML report written to {html}"))


# --- explain -----------------------------------------------------------------------------------


def _event_label(node: EventNode, prefix: str) -> Text:
    event = node.event
    label = Text(prefix)
    label.append(f"[{_clean(event.get('boundary', '?'))}] ", style="cyan")
    label.append(_clean(event.get("failure_kind", "?")), style="bold")
    for name, key in (("stage", "stage"), ("http", "http_status"), ("operation", "operation")):
        if key in event:
            label.append(f"  {name}={_clean(event[key])}")
    label.append(f"  id={_clean(event.get('event_id'))}", style="dim")
    if event.get("failure_reason"):
        label.append(f"\n{_clean(event['failure_reason'])}", style="italic")
    foreign = event.get("foreign_error")
    if isinstance(foreign, dict):
        label.append(f"\nforeign error: {_clean(foreign.get('exception_type'))}", style="dim")
    return label


def _add_chain(tree: Tree, node: EventNode, prefix: str) -> None:
    branch = tree.add(_event_label(node, prefix))
    if node.cause is not None:
        _add_chain(branch, node.cause, "caused by ")
    elif node.cause_shown_above is not None:
        branch.add(_cell(f"caused by {node.cause_shown_above} (shown above)", style="dim"))
    elif node.causes_may_be_omitted:
        branch.add(Text("[omitted] causes may have been lost on the way", style="yellow"))


def _explanation_tree(explanation: RowExplanation) -> Tree:
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
    if explanation.omitted:
        tree.add(Text("[omitted] this report lost events on the way (too large, or invalid)", style="yellow"))
    if explanation.tree is not None:
        _add_chain(tree, explanation.tree, "✖ ")
    elif failure is not None:
        tree.add(Text("no failure event saved for this row", style="dim"))
    if explanation.observations:
        observed = tree.add(Text("other observations", style="bold"))
        for node in explanation.observations:
            _add_chain(observed, node, "")
    return tree


@app.command()
def explain(
    paths: PathsArgument,
    row: Annotated[
        int | None,
        typer.Option(
            "--row",
            min=0,
            help="The row's 0-based line number in the one file given (every line counts, "
            "blank and invalid ones too, as `sed -n '<N+1>p'` does).",
        ),
    ] = None,
    rollout: Annotated[
        str | None, typer.Option("--rollout", help="Every row of this rollout id, by attempt.")
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """The cause tree of one rollout across every hop: origin event ids, boundaries, omitted parts."""
    if (row is None) == (rollout is None):
        raise _usage_error("give exactly one of --row or --rollout")
    if row is not None:
        if len(paths) != 1 or paths[0].is_dir():
            raise _usage_error("--row needs exactly one file")
        found = line_row(paths[0], row)
        explanations = [] if found is None else [found]
        missing = f"{paths[0]} has no line {row}"
    else:
        assert rollout is not None
        explanations = rollout_rows(input_files(paths), rollout)
        missing = f"no row of rollout {rollout!r} found"
    if json_output:
        # json.dumps, not pydantic's serializer: a saved row may hold a lone surrogate ("\ud800"), which
        # pydantic refuses to encode and JSON writes as an escape.
        _print_json(json.dumps([item.model_dump(mode="json") for item in explanations], indent=2))
    else:
        console = _stdout()
        for explanation in explanations:
            console.print(_explanation_tree(explanation))
    if not explanations:
        _stderr().print(_cell(missing, style="red"))
        raise typer.Exit(code=1)


# --- gate --------------------------------------------------------------------------------------


def _print_verdict(verdict: acceptance.GateVerdict) -> None:
    coverage = verdict.coverage
    table = Table(title="Coverage", title_justify="left")
    table.add_column("")
    table.add_column("rollouts", justify="right")
    table.add_column("share", justify="right")

    def add(name: str, count: int, style: str = "") -> None:
        table.add_row(Text(name, style=style), str(count), f"{coverage.share(count):.1%}")

    add("expected", coverage.expected)
    add("scored", coverage.scored, style="green")
    for cls in FailureClass:
        add(f"failed, {cls.value}", coverage.failed[cls.value], style=_CLASS_STYLES[cls.value])
    add("gate-derived, model", coverage.gate_derived["model"], style="blue")
    add("gate-derived, evaluation", coverage.gate_derived["evaluation"], style="red")
    add("gate-derived, unknown", coverage.gate_derived["unknown"], style="yellow")
    if coverage.unscored:
        add("unscored (no verdict)", coverage.unscored)
    add("missing", coverage.missing)
    if coverage.unexpected:
        add("unexpected", coverage.unexpected)
    console = _stdout()
    console.print(table)
    if coverage.expected_source == "manifest":
        console.print(_cell(f"expected from {', '.join(coverage.manifests)}", style="dim"))
    kinds = Counter(coverage.failed_by_kind) + Counter(coverage.gate_derived_by_kind)
    if kinds:
        by_kind = Table(title="Outcomes by kind", title_justify="left")
        by_kind.add_column("kind")
        by_kind.add_column("rollouts", justify="right")
        for kind, count in sorted(kinds.items(), key=lambda item: (-item[1], item[0])):
            by_kind.add_row(_cell(kind), str(count))
        console.print(by_kind)
    notes = [f"{coverage.retried_attempts} retried attempts (not outcomes)"]
    if coverage.invalid_lines or coverage.torn_tails or coverage.other_rows:
        notes.append(
            f"{coverage.invalid_lines} invalid lines, {coverage.torn_tails} torn last lines, "
            f"{coverage.other_rows} other rows skipped"
        )
    console.print(Text("; ".join(notes), style="dim"))
    console.print(Text(coverage.line, style="bold"))
    if verdict.passed:
        console.print(Text("PASSED", style="bold green"))
    else:
        console.print(Text("FAILED", style="bold red"))
        for reason in verdict.reasons:
            console.print(Text(f"  - {reason}", style="red"))


@app.command()
def gate(
    paths: PathsArgument,
    expected: Annotated[
        int | None,
        typer.Option(
            "--expected",
            min=0,
            help="Rollouts expected (default: the collection manifest beside the rows, "
            "<output>.manifest.json; without one, the distinct rollouts seen, with a warning).",
        ),
    ] = None,
    min_scored_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Least share of expected rollouts scored.")
    ] = (acceptance.GateThresholds().min_scored_share),
    max_evaluation_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Most share failed or gate-derived evaluation-side.")
    ] = (acceptance.GateThresholds().max_evaluation_share),
    max_unknown_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Most share of unknown responsibility.")
    ] = (acceptance.GateThresholds().max_unknown_share),
    max_missing: Annotated[
        int, typer.Option(min=0, help="Most expected rollouts without a final outcome.")
    ] = acceptance.GateThresholds().max_missing,
    json_output: JsonOption = False,
) -> None:
    """Coverage of a run's rows and the verdict against thresholds: exit 0 if it passes, 1 if not."""
    thresholds = acceptance.GateThresholds(
        min_scored_share=min_scored_share,
        max_evaluation_share=max_evaluation_share,
        max_unknown_share=max_unknown_share,
        max_missing=max_missing,
    )
    coverage = acceptance.read_coverage(input_files(paths), expected)
    verdict = acceptance.check(coverage, thresholds)
    for warning in verdict.warnings:
        _stderr().print(Text(f"Warning: {warning}", style="yellow"))
    if json_output:
        _print_json(verdict.model_dump_json(indent=2))
    else:
        _print_verdict(verdict)
    raise typer.Exit(code=0 if verdict.passed else 1)


# --- collect -----------------------------------------------------------------------------------


@app.command()
def collect(
    input_path: Annotated[
        Path,
        typer.Argument(
            exists=True, dir_okay=False, readable=True, metavar="INPUT", help="JSONL of tasks, one a line."
        ),
    ],
    agent_url: Annotated[str, typer.Option("--agent-url", help="The agent server's base URL.")],
    output: Annotated[
        Path, typer.Option("--output", help="<output>.jsonl; failures go to <output>_failures.jsonl.")
    ],
    num_repeats: Annotated[int, typer.Option(min=1, help="Rollouts per task.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Rollouts in flight.")] = 16,
    max_attempts: Annotated[int, typer.Option(min=1, help="Attempts per rollout.")] = 3,
    timeout: Annotated[float, typer.Option(min=0.001, help="Seconds per attempt.")] = 120.0,
    force_resume: Annotated[
        bool, typer.Option(help="Resume even when the output was collected from a different run.")
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Dispatch every task's rollouts to an agent server, save each attempt, resume what is unfinished."""
    try:
        from gym_failures.collection import CollectionConfig
        from gym_failures.collection import collect as run_collection
    except ImportError as error:  # aiohttp is an extra of its own
        _stderr().print(Text(f"Error: collect needs gym-failures[aiohttp] ({error})", style="red"))
        raise typer.Exit(code=1) from None
    from gym_failures.failures import NgFailureEvent

    try:
        config = CollectionConfig(
            input_path=input_path,
            output_path=output,
            agent_url=agent_url,
            num_repeats=num_repeats,
            concurrency=concurrency,
            max_attempts=max_attempts,
            timeout_s=timeout,
            force_resume=force_resume,
        )
    except ValidationError as error:  # its text holds no input (hide_input_in_errors)
        raise _usage_error(str(error)) from None
    with _progress_bar(not json_output, "collecting") as update:
        on_progress = None if update is None else (lambda done, total: update(float(done), float(total)))
        try:
            summary = asyncio.run(run_collection(config, on_progress))
        except NgFailureEvent as failure:
            if failure.failure_kind != COLLECTION_RESUME_REFUSED:
                raise
            _stderr().print(Text(f"Error: {failure.failure_reason}", style="red"))
            raise typer.Exit(code=2) from None
    figures: dict[str, Any] = {
        field.name: getattr(summary, field.name) for field in fields(summary) if field.name != "scans"
    }
    if json_output:
        _print_json(json.dumps(figures, indent=2))
        return
    table = Table(title="Collection", title_justify="left")
    table.add_column("")
    table.add_column("count", justify="right")
    for key, value in figures.items():
        table.add_row(key.replace("_", " "), str(value))
    _stdout().print(table)
    _stdout().print(Text(f"rows in {output}, failures in {config.failures_path}", style="dim"))


# --- demo --------------------------------------------------------------------------------------


def _most_telling_failure(failures_path: Path) -> int | None:
    """The line number of the failed attempt with the longest cause chain, a final one on a tie."""
    from gym_failures.failure_transport import FailureReportRow

    best: tuple[int, bool, int] | None = None
    with failures_path.open("rb") as handle:
        for number, line in enumerate(handle):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict):
                continue
            report = FailureReportRow.report(row)
            depth, event_id = 0, report.failure_id
            while event_id is not None and event_id in report.events and depth <= len(report.events):
                depth, event_id = depth + 1, report.events[event_id].cause_id
            key = (depth, row.get("final") is True, -number)
            if best is None or key > best:
                best = key
    return None if best is None else -best[2]


class _StreamMode(StrEnum):
    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Parent of the run directory.")] = Path("runs"),
    rollouts: Annotated[int, typer.Option(min=1, help="Rollouts to collect.")] = 200,
    concurrency: Annotated[int, typer.Option(min=1, help="Rollouts in flight.")] = 16,
    fault_plan: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="A fault plan JSON file (default: the packaged one)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the scripted policy and the fault draws.")] = 0,
    model_base_url: Annotated[
        str | None,
        typer.Option(
            "--model-base-url",
            envvar="GYM_DEMO_MODEL_BASE_URL",
            help="An OpenAI-compatible base URL for the policy instead of the scripted one; the key "
            "comes from $GYM_DEMO_MODEL_API_KEY or $OPENAI_API_KEY.",
        ),
    ] = None,
    model_name: Annotated[
        str | None,
        typer.Option("--model-name", envvar="GYM_DEMO_MODEL_NAME", help="The external policy model."),
    ] = None,
    stream: Annotated[
        _StreamMode, typer.Option("--stream", help="Whether the policy's calls stream their replies.")
    ] = _StreamMode.AUTO,
    policy_timeout: Annotated[
        float | None,
        typer.Option(
            "--policy-timeout",
            min=0.001,
            help="Seconds one policy call may take (default: the fault plan's, or 60 with an "
            "external model).",
        ),
    ] = None,
) -> None:
    """Run the local demo gym with injected faults, then summarize, gate and explain what it saved.

    Starts a model server, a resources server (verifier, judge, sandbox) and an agent server on
    loopback, collects the rollouts into `<out>/<timestamp>/`, prints the summary, the gate's verdict
    and the cause tree of the most telling failed rollout, and writes `report.html` there.
    """
    if (model_base_url is None) != (model_name is None):
        raise _usage_error("an external policy needs both --model-base-url and --model-name")
    if policy_timeout is None and model_base_url is not None:
        policy_timeout = 60.0  # a real model generates for seconds, not the scripted milliseconds
    try:
        from gym_failures.demo import run_demo
    except ImportError as error:
        _stderr().print(Text(f"Error: demo needs gym-failures[demo] ({error})", style="red"))
        raise typer.Exit(code=1) from None

    console = _stdout()
    with _progress_bar(True, "collecting") as update:
        on_progress = None if update is None else (lambda done, total: update(float(done), float(total)))
        try:
            run_dir = run_demo(
                out,
                rollouts=rollouts,
                concurrency=concurrency,
                fault_plan=fault_plan,
                seed=seed,
                policy_base_url=model_base_url,
                policy_model=model_name,
                stream=stream.value,
                policy_timeout_s=policy_timeout,
                on_progress=on_progress,
            )
        except KeyboardInterrupt:
            _stderr().print(Text("interrupted; every demo server is stopped", style="red"))
            raise typer.Exit(code=130) from None
        except ValueError as error:  # a refused option (a model URL with secrets); never echoes them
            raise _usage_error(str(error)) from None
    files = [run_dir / "rollouts.jsonl", run_dir / "rollouts_failures.jsonl"]
    summary = summarize_rows(files)
    report = run_dir / "report.html"
    report.write_text(render_html(summary), encoding="utf-8")
    console.rule("Summary")
    _print_summary(summary)
    console.rule("Acceptance gate")
    verdict = acceptance.check(acceptance.read_coverage(files, rollouts), acceptance.GateThresholds())
    _print_verdict(verdict)
    number = _most_telling_failure(files[1])
    explanation = None if number is None else line_row(files[1], number)
    if explanation is not None:
        console.rule("The failed attempt with the longest cause chain")
        console.print(_explanation_tree(explanation))
    console.rule("Files")
    console.print(_cell(f"rows:        {files[0]}\nfailures:    {files[1]}\nHTML report: {report}"))
    console.print(
        Text(
            f"Next: gym-failures explain {files[1]} --rollout <id>   gym-failures gate {run_dir}",
            style="dim",
        )
    )


if __name__ == "__main__":
    main()
