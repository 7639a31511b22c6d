"""`gym-failures collect`'s options: the input, the agent, the output, the run's bounds, how it fails
well (backoff, the hints' bound, the readiness wait, the breaker, what a resume reopens, retry rules),
Ray, metrics.

Decisions:

- `--output out` (no `.jsonl`) writes `out.jsonl` and `out_failures.jsonl`, and says so (see
  `gym_failures.cli._collect`); `newdir/` (a trailing slash, no such directory yet) is a run
  directory to make, its rows `newdir/rollouts.jsonl`.
- Every default a flag shows in its help is the collection's own, or names the variable that sets it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gym_failures.cli._options import (
    add_json_option,
    add_metrics_option,
    agent_url,
    at_least,
    positive_seconds,
    seconds_or_zero,
)

__all__ = ["add_collect_options"]


def add_collect_options(parser: argparse.ArgumentParser) -> None:
    """Every option of `collect`, on its `parser`."""
    parser.add_argument("input_path", type=Path, metavar="INPUT", help="JSONL of tasks, one a line")
    parser.add_argument(
        "--agent-url", required=True, type=agent_url, metavar="URL", help="the agent server's base URL"
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
        "--num-repeats", type=at_least(1), default=1, metavar="N", help="rollouts per task (1)"
    )
    parser.add_argument(
        "--concurrency", type=at_least(1), default=16, metavar="N", help="rollouts in flight (16)"
    )
    parser.add_argument(
        "--max-attempts",
        type=at_least(1),
        default=None,
        metavar="N",
        help="attempts per rollout (NeMo Gym's budget: $NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, else 3)",
    )
    parser.add_argument(
        "--timeout", type=positive_seconds, default=120.0, metavar="SECONDS", help="per attempt (120)"
    )
    _add_recovery_options(parser)
    _add_retry_rule_options(parser)
    _add_group_options(parser)
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
        type=at_least(1),
        default=None,
        metavar="N",
        help="Ray workers, each with --concurrency rollouts in flight (2; needs --ray)",
    )
    add_metrics_option(parser)
    add_json_option(parser)


def _add_recovery_options(parser: argparse.ArgumentParser) -> None:
    """`collect`'s options for failing well: the backoff, the hints' bound, the readiness wait, the
    breaker, and which closed rollouts a resume reopens."""
    parser.add_argument(
        "--backoff-initial",
        type=seconds_or_zero,
        default=None,
        metavar="SECONDS",
        help="the least wait before a rollout's next attempt; each later one up to 3 times the last "
        "(decorrelated jitter), 0 retries at once ($GYM_FAILURES_BACKOFF_INITIAL_S, else 1)",
    )
    parser.add_argument(
        "--backoff-max",
        type=seconds_or_zero,
        default=30.0,
        metavar="SECONDS",
        help="the longest backoff wait (30)",
    )
    parser.add_argument(
        "--retry-after-max",
        type=seconds_or_zero,
        default=300.0,
        metavar="SECONDS",
        help="the longest wait a failure's Retry-After, retry-after-ms or quota reset is honoured for (300)",
    )
    parser.add_argument(
        "--wait-ready",
        type=seconds_or_zero,
        default=None,
        metavar="SECONDS",
        help="how long the agent may take to accept connections, at the start and after a run of "
        "transport failures, before the run ends with exit 1, budgets kept; 0: no wait, no pause "
        "($GYM_FAILURES_WAIT_READY_S, else 60)",
    )
    parser.add_argument(
        "--breaker",
        type=at_least(0),
        default=None,
        metavar="N",
        help="when N attempts in a row fail with the same kind at the same boundary, send one probe at "
        "a time: one that does not fail so resumes the run, 3 that do end it with exit 1, the rollouts "
        "never tried keeping their budgets; 0: off; not on --ray (10)",
    )
    parser.add_argument(
        "--retry-terminal",
        action="store_true",
        help="on resume, also reopen rollouts closed by a failure the agent marked terminal (within "
        "--max-attempts; rollouts closed by the budget reopen whenever --max-attempts is raised)",
    )


def _add_retry_rule_options(parser: argparse.ArgumentParser) -> None:
    """`collect`'s retry rules (`gym_failures.collection._retry_rules`): flags, then a file's."""
    parser.add_argument(
        "--retry-rule",
        action="append",
        type=_retry_rule,
        default=[],
        metavar="RULE",
        help="a retry rule, KEY=VALUE fields separated by commas: what it matches (kind, failure_class, "
        "status such as 429 or 5xx, a list's values separated by |; message=REGEX, last, takes the rest) "
        "and max_attempts (1: never retried) and/or max_retries_per_run (a cap on the retries it grants "
        "in this run), optional name; the first rule that matches a failure decides; repeatable, "
        "before the file's rules; a failure no rule matches has --max-attempts",
    )
    parser.add_argument(
        "--retry-rules",
        type=Path,
        default=None,
        metavar="FILE",
        help='retry rules from a JSON ({"rules": [...]}) or TOML ([[rules]]) file, after --retry-rule\'s',
    )


def _retry_rule(text: str) -> object:
    """A `--retry-rule` value as a `RetryRule`; argparse's one-line error (exit 2) when it is none."""
    from gym_failures.collection._retry_rule_inputs import parse_rule_flag
    from gym_failures.collection._retry_rules import RetryRuleError

    try:
        return parse_rule_flag(text)
    except RetryRuleError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _output_argument(text: str) -> Path:
    """`--output` as a path; `newdir/` (a trailing slash, no such directory yet) is a run directory to
    make, its rows `newdir/rollouts.jsonl` (as the collector names a directory's rows), never
    `newdir.jsonl` beside it."""
    path = Path(text)
    if text.endswith(("/", os.sep)) and not path.exists():
        return path / "rollouts.jsonl"
    return path


def _add_group_options(parser: argparse.ArgumentParser) -> None:
    """`collect`'s options for prompt groups (`gym_failures.collection._groups`)."""
    parser.add_argument(
        "--min-valid-per-group",
        type=at_least(1),
        default=None,
        metavar="K",
        help="the valid members a group (a task's rollouts) needs, as gate counts them: the live view "
        "counts groups complete, short and pending against it (default: every member)",
    )
    parser.add_argument(
        "--fill-short-groups",
        action="store_true",
        help="on resume, re-run only the members groups short of --min-valid-per-group need, lowest "
        "rollout index first; the other open rollouts are left for a later resume",
    )
