"""The commands of `gym-failures`: their options, what each computes, and its exit status.

What each prints is drawn by `gym_failures.cli._render`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import fields
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import duckdb
import typer
from pydantic import ValidationError
from rich.text import Text

from gym_failures import gate as acceptance
from gym_failures.cli._live import live_collection, metrics_endpoint

# Private aliases keep the demo command's body byte for byte while its options are rewritten
# elsewhere; drop them with that rewrite.
from gym_failures.cli._render import (
    cell,
    explanation_tree,
    print_collection,
    print_json,
    print_summary,
    print_verdict,
    progress_bar,
    stderr,
    stdout,
)
from gym_failures.cli._serve import serve_app
from gym_failures.failure_kinds import COLLECTION_RESUME_REFUSED
from gym_failures.reporting.explain import line_row, rollout_rows
from gym_failures.reporting.html import render_html
from gym_failures.reporting.summary import input_files
from gym_failures.reporting.summary import summarize as summarize_rows

# Below this much input a summary takes about a second: a progress bar would only flicker.
PROGRESS_MIN_BYTES = 50 * 1024 * 1024

app = typer.Typer(
    name="gym-failures",
    help="Summarize, explain and gate the failure reports saved beside rollouts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(serve_app)  # `gym-failures serve model` (gym_failures.cli._serve)

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


def _usage_error(message: str) -> typer.Exit:
    stderr().print(Text(f"Error: {message}", style="red"))
    return typer.Exit(code=2)


# --- summarize ---------------------------------------------------------------------------------


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
    with progress_bar(size > PROGRESS_MIN_BYTES, "summarizing") as update:
        on_progress = None if update is None else (lambda percent: update(percent, 100.0))
        try:
            summary = summarize_rows(files, on_progress=on_progress)
        except duckdb.Error as error:
            stderr().print(Text(f"Error: could not read the rows: {error}", style="red"))
            raise typer.Exit(code=1) from None
    if html is not None:
        html.write_text(render_html(summary), encoding="utf-8")
    if json_output:
        print_json(summary.model_dump_json(indent=2))
    else:
        print_summary(summary)
        if html is not None:
            stdout().print(Text(f"HTML report written to {html}"))


# --- explain -----------------------------------------------------------------------------------


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
        print_json(json.dumps([item.model_dump(mode="json") for item in explanations], indent=2))
    else:
        console = stdout()
        for explanation in explanations:
            console.print(explanation_tree(explanation))
    if not explanations:
        stderr().print(cell(missing, style="red"))
        raise typer.Exit(code=1)


# --- gate --------------------------------------------------------------------------------------


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
        stderr().print(Text(f"Warning: {warning}", style="yellow"))
    if json_output:
        print_json(verdict.model_dump_json(indent=2))
    else:
        print_verdict(verdict)
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
    agent_name: Annotated[str, typer.Option(help="The agent's name in metrics (never its URL).")] = "agent",
    metrics_port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Serve OpenTelemetry metrics at :PORT/metrics while collecting."),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Dispatch every task's rollouts to an agent server, save each attempt, resume what is unfinished."""
    try:
        from gym_failures.collection import CollectionConfig
        from gym_failures.collection import collect as run_collection
    except ImportError as error:  # aiohttp is an extra of its own
        stderr().print(Text(f"Error: collect needs gym-failures[aiohttp] ({error})", style="red"))
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
            agent_name=agent_name,
        )
    except ValidationError as error:  # its text holds no input (hide_input_in_errors)
        raise _usage_error(str(error)) from None
    with contextlib.ExitStack() as running:
        if metrics_port is not None:
            running.enter_context(metrics_endpoint(metrics_port, "gym-failures-collect"))
        on_progress = running.enter_context(live_collection())
        try:
            summary = asyncio.run(run_collection(config, on_progress))
        except NgFailureEvent as failure:
            if failure.failure_kind != COLLECTION_RESUME_REFUSED:
                raise
            stderr().print(Text(f"Error: {failure.failure_reason}", style="red"))
            raise typer.Exit(code=2) from None
    figures: dict[str, Any] = {
        field.name: getattr(summary, field.name) for field in fields(summary) if field.name != "scans"
    }
    if json_output:
        print_json(json.dumps(figures, indent=2))
        return
    print_collection(figures, output, config.failures_path)


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


# Over 80 lines: thirty-five of them declare its options (checked by `DemoOptions`, not here), and the
# rest prints what the run saved, in the order a reader wants it.
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
    try:
        from gym_failures.demo import DemoOptionsError, run_demo
    except ImportError as error:
        stderr().print(Text(f"Error: demo needs gym-failures[demo] ({error})", style="red"))
        raise typer.Exit(code=1) from None

    console = stdout()
    with live_collection() as on_progress:
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
            stderr().print(Text("interrupted; every demo server is stopped", style="red"))
            raise typer.Exit(code=130) from None
        except DemoOptionsError as error:  # a refused option (a model URL with secrets); never echoes them
            raise _usage_error(str(error)) from None
    files = [run_dir / "rollouts.jsonl", run_dir / "rollouts_failures.jsonl"]
    summary = summarize_rows(files)
    report = run_dir / "report.html"
    report.write_text(render_html(summary), encoding="utf-8")
    console.rule("Summary")
    print_summary(summary)
    console.rule("Acceptance gate")
    verdict = acceptance.check(acceptance.read_coverage(files, rollouts), acceptance.GateThresholds())
    print_verdict(verdict)
    number = _most_telling_failure(files[1])
    explanation = None if number is None else line_row(files[1], number)
    if explanation is not None:
        console.rule("The failed attempt with the longest cause chain")
        console.print(explanation_tree(explanation))
    console.rule("Files")
    console.print(cell(f"rows:        {files[0]}\nfailures:    {files[1]}\nHTML report: {report}"))
    console.print(
        Text(
            f"Next: gym-failures explain {files[1]} --rollout <id>   gym-failures gate {run_dir}",
            style="dim",
        )
    )
