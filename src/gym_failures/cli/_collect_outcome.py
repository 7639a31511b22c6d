"""What `gym-failures collect` says when its run ends, and its exit status: the run's figures (its
successes in the gate's words), and why it exits 1.

Decisions:

- `collect` exits 1 when the run's rows (this invocation's and the resumed runs') hold no success,
  in one line naming the most common final failure kinds, the agent URL when no request reached it,
  and the status when every final failure has the same one. A re-run of a run where nothing
  succeeded exits 1 again: a script must not read "nothing left to do" as success.
- It exits 1 too when no attempt of this run reached the agent, whatever earlier runs saved.
- The agent URL is shown without its secrets (`url_without_secrets`).
- A run the breaker ended (`BreakerOpen`) prints its figures as any (`--json`'s `breaker`: the
  kind, boundary, attempts in a row, probes and `--breaker` it ended on; null for a run it did not
  end; the table leaves it out), then exits 1 with the breaker's one line, `gym-failures collect:
  error: the breaker opened: ...`; the other lines about the rows are not said, the breaker's says
  why the run stopped.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_failures._http_status import error_status
from gym_failures.cli._exits import EXIT_FAILED, EXIT_OK
from gym_failures.cli._inputs import quiet_row_reader
from gym_failures.cli._text import plural, print_json, stderr_line

if TYPE_CHECKING:
    from gym_failures.collection import CollectionSummary
    from gym_failures.telemetry import CollectionProgress

__all__ = ["GRADING_WITHOUT_VERDICT_KIND", "TRANSPORT_KINDS", "collect_result"]

GRADING_WITHOUT_VERDICT_KIND = "grading_without_verdict"

TRANSPORT_KINDS = frozenset({"transport_unreachable", "transport_timeout", "transport_connection_reset"})
"""Failure kinds that mean no reply came from the agent server."""


def collect_result(
    summary: CollectionSummary,
    progress: CollectionProgress,
    config: Any,
    arguments: argparse.Namespace,
    *,
    ended_by: str | None = None,
) -> int:
    """Print a finished collection's figures (its successes in the gate's words) and give its exit
    status: 1 when the run's rows hold no success, or when no attempt of this run reached the agent;
    and 1 with `ended_by`'s line when the breaker ended the run."""
    from dataclasses import asdict, fields

    from gym_failures.cli._tables import print_collection

    figures: dict[str, Any] = {}
    for field in fields(summary):
        if field.name not in ("scans", "breaker"):
            figures[field.name] = getattr(summary, field.name)
        if field.name == "succeeded":
            figures.update(_outcome_figures(progress))
    if arguments.json_output:
        breaker = None if summary.breaker is None else asdict(summary.breaker)
        print_json(json.dumps({**figures, "breaker": breaker}, indent=2))
    else:
        print_collection(figures, config.output_path, config.failures_path)
    _say_unmeasured(progress)
    if ended_by is not None:
        stderr_line(f"gym-failures collect: error: {ended_by}")
        return EXIT_FAILED
    if summary.succeeded == 0 and not _any_success(config.output_path):
        return _no_success(config.failures_path, arguments.agent_url, summary)
    unreached_only = set(progress.failed_attempts_by_kind) <= TRANSPORT_KINDS
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
        "tainted": dict(progress.tainted_by_kind),
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


def _any_success(rows: Path) -> bool:
    """Whether the run's success rows (`rows`, resumed runs' included) hold one success."""
    from gym_failures.rows import is_rollout_row, read_rows

    with quiet_row_reader():
        return any(is_rollout_row(row) and "failure" not in row for row in read_rows(rows))


def _no_success(failures: Path, agent_url: str, summary: CollectionSummary) -> int:
    """Say in one line why no rollout of the run succeeded; exit status 1."""
    from gym_failures.redaction import url_without_secrets
    from gym_failures.rows import read_rows

    kinds: Counter[str] = Counter()
    statuses: Counter[object] = Counter()
    with quiet_row_reader():
        for row in read_rows(failures):
            if row.get("final") is True:
                # A resumed run's rows are read, never trusted: a value of the wrong type is no kind.
                failure, record = row.get("failure"), row.get("rollout_failure")
                kind = failure.get("failure_kind") if isinstance(failure, dict) else None
                kinds[kind if isinstance(kind, str) else "(none)"] += 1
                status = record.get("http_status") if isinstance(record, dict) else None
                # Only an error status says the agent answered no: an episode failure comes in a 200.
                statuses[error_status(status)] += 1
    common = ", ".join(f"{kind} {count}" for kind, count in kinds.most_common(3)) or "no failure rows"
    agent = f"the agent at {url_without_secrets(agent_url)}"
    none_of = (
        "the one rollout did not succeed"
        if summary.expected == 1
        else f"none of {summary.expected} rollouts succeeded"
    )
    if summary.expected == summary.already_done + summary.closed_on_resume:
        line = f"{none_of}, all done by an earlier run ({common})"
    elif kinds and set(kinds) <= TRANSPORT_KINDS:
        line = f"{agent} could not be reached ({common})"
    elif len(statuses) == 1 and type(status := next(iter(statuses))) is int:
        line = f"{none_of}: {agent} answered {status} ({common})"
    else:
        line = f"{none_of} ({common})"
    stderr_line(f"gym-failures collect: {line}")
    return EXIT_FAILED
