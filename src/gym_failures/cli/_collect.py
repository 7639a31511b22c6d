"""`gym-failures collect`: dispatch every task's rollouts to an agent server, save each attempt,
resume what is unfinished; its options are in `gym_failures.cli._collect_options`, what it prints
and its exit status at the end in `gym_failures.cli._collect_outcome`.

Decisions:

- `collect --output out` (no `.jsonl`) writes `out.jsonl` and `out_failures.jsonl`, and says so:
  the readers find a run's rows by that suffix. Any other suffix (`out.json`) is refused.
- `collect --output DIR` takes the rows file the directory's one manifest names (a demo's run
  holds tasks and injected faults beside it); without one manifest the collector chooses (a NeMo Gym
  run's: the rows beside its one `<stem>_materialized_inputs.jsonl`).
- A task file without a task is exit status 2, before anything is written.
- Retry rules: the `--retry-rule` flags' rules first, then the `--retry-rules` file's (first match
  wins, so a flag overrides the file for the failures both match). A rule, file or combination that
  cannot be used is exit status 2 with one line naming the flag (argparse's own for a flag's value).
- Messages name the command line's flags (`--num-repeats`, `--force-resume`), never the
  collection's field names.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gym_failures.cli._collect_options import add_collect_options
from gym_failures.cli._collect_outcome import collect_result
from gym_failures.cli._exits import EXIT_FAILED, CommandError
from gym_failures.cli._extras import METRICS_MODULES, needs_extra, require_extra
from gym_failures.cli._inputs import quiet_row_reader, require_file
from gym_failures.cli._options import Subcommands, add_command
from gym_failures.cli._text import plural, warn

__all__ = ["add_collect"]


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
    add_collect_options(parser)


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
    warn(f"--output {output} has no .jsonl suffix: writing {completed}")
    return completed


_FLAGS = {"agent_url": "--agent-url", "input_path": "INPUT", "output_path": "--output"}

# The collection's messages name its fields and options; the command line names its flags.
_FLAG_WORDS = (
    ("num_repeats", "--num-repeats"),
    ("wait_ready_s", "--wait-ready"),
    ("breaker_attempts", "--breaker"),
    ("min_valid_per_group", "--min-valid-per-group"),
    ("fill_short_groups", "--fill-short-groups"),
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


def _require_tasks(path: Path) -> None:
    """Refuse a task file that holds no task (empty, or only blank and invalid lines) before any
    output is written."""
    from gym_failures.rows import TaskScan, read_tasks

    if path.is_dir():
        raise CommandError(f"{path} is a directory; name the task file")
    require_file(path, str(path))
    scan = TaskScan(path)
    # The reader is dropped after its first task: CPython closes it (and its file) at once.
    with quiet_row_reader():
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


def _defaulted_options(arguments: argparse.Namespace) -> dict[str, Any]:
    """The collection's fields whose flags were given, of those whose defaults come from elsewhere
    (the environment, NeMo Gym's variable, a resumed run): left out, the config's own apply; and the
    groups' (`gym_failures.collection._groups`, refused as a resume is: `collection_resume_refused`)."""
    options: dict[str, Any] = {"max_attempts": arguments.max_attempts} if arguments.max_attempts else {}
    if arguments.min_valid_per_group is not None:
        options["min_valid_per_group"] = arguments.min_valid_per_group
    if arguments.fill_short_groups:
        options["fill_short_groups"] = True
    if arguments.agent_name is not None:
        options["agent_name"] = arguments.agent_name  # set only when named: a resumed run keeps its own
    if arguments.backoff_initial is not None:
        options["backoff_initial_s"] = arguments.backoff_initial
    if arguments.wait_ready is not None:
        options["wait_ready_s"] = arguments.wait_ready
    if arguments.breaker is not None:
        options["breaker_attempts"] = arguments.breaker
        if arguments.ray is not None:
            warn("--breaker has no effect with --ray: the Ray driver dispatches in a loop of its own")
    return options


def _rule_options(arguments: argparse.Namespace) -> dict[str, Any]:
    """`retry_rules` when `--retry-rule` or `--retry-rules` was given (the flags' rules, then the
    file's); else nothing, and the config's own (none) apply."""
    if not arguments.retry_rule and arguments.retry_rules is None:
        return {}
    return {"retry_rules": _retry_rules(arguments.retry_rule, arguments.retry_rules)}


def _retry_rules(flags: list[Any], path: Path | None) -> Any:
    """The run's `RetryRules`: the `--retry-rule` flags' rules, then the `--retry-rules` file's; a
    one-line error (exit 2) for a file that cannot be used, or rules that cannot go together."""
    from gym_failures.collection._retry_rule_inputs import load_rules_file
    from gym_failures.collection._retry_rules import RetryRuleError, rules_of

    try:
        rules = rules_of(flags)
    except RetryRuleError as error:
        raise CommandError(f"--retry-rule: {error}") from None
    if path is None:
        return rules
    try:
        from_file = load_rules_file(path)
    except RetryRuleError as error:
        raise CommandError(f"--retry-rules {path}: {error}") from None
    try:
        return rules.joined(from_file)
    except RetryRuleError as error:
        raise CommandError(f"--retry-rule with --retry-rules {path}: {error}") from None


def _run_collect(arguments: argparse.Namespace) -> int:
    if arguments.metrics_port is not None:
        require_extra("--metrics-port", "prometheus", METRICS_MODULES)
    from pydantic import ValidationError

    from gym_failures._loop import run as run_loop
    from gym_failures.cli._live import live_collection, metrics_endpoint
    from gym_failures.collection import AgentDown, BreakerOpen, CollectionConfig
    from gym_failures.collection import collect as run_collection
    from gym_failures.collection._protocols import default_protocol
    from gym_failures.failure_kinds import COLLECTION_DISPATCH_FAILED, COLLECTION_RESUME_REFUSED
    from gym_failures.failures import NgFailureEvent
    from gym_failures.telemetry import CollectionProgress

    if arguments.workers is not None and arguments.ray is None:
        raise CommandError("--workers needs --ray")
    _require_tasks(arguments.input_path)
    options = {**_defaulted_options(arguments), **_rule_options(arguments)}
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
    if protocol == "nemo-gym" and arguments.agent_name is None and not config.materialized_path.exists():
        # Every row names its agent, and NeMo Gym refuses rows naming one its config does not have:
        # a fresh run cannot guess the name (a resumed one keeps its materialized inputs' name).
        raise CommandError(
            "--agent-protocol nemo-gym needs --agent-name: the agent's name in NeMo Gym's config "
            "(e.g. simple_agent), which every row names as its agent_ref"
        )
    config = config.model_copy(update={"agent_protocol": protocol})
    with contextlib.ExitStack() as running:
        if arguments.metrics_port is not None:
            running.enter_context(metrics_endpoint(arguments.metrics_port, "gym-failures-collect"))
        live = running.enter_context(live_collection())
        seen: list[CollectionProgress] = []
        ended_by: str | None = None

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
        except BreakerOpen as opened:  # the breaker's probes failed as the attempts before them
            summary, ended_by = opened.summary, _flag_words(opened.reason, ())
        except AgentDown as failure:  # the agent accepted no connection within --wait-ready
            raise CommandError(_flag_words(failure.failure_reason, ()), status=EXIT_FAILED) from None
        except NgFailureEvent as failure:
            if failure.failure_kind == COLLECTION_DISPATCH_FAILED:  # every Ray worker was lost
                raise CommandError(failure.failure_reason, status=EXIT_FAILED) from None
            if failure.failure_kind != COLLECTION_RESUME_REFUSED:
                raise
            quoted = (config.output_path, config.lock_path)
            raise CommandError(_flag_words(failure.failure_reason, quoted)) from None
    progress = seen[0] if seen else CollectionProgress()
    return collect_result(summary, progress, config, arguments, ended_by=ended_by)


def _ray_collector() -> tuple[Any, type[Exception]]:
    """`collect_on_ray` and the error it raises when Ray cannot be joined, or the missing extra."""
    try:
        from gym_failures.ray import RayJoinError, collect_on_ray
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != "ray":
            raise
        raise CommandError(needs_extra("--ray", "ray", "ray")) from None
    return collect_on_ray, RayJoinError
