"""`gym-failures gate`: a run's coverage and its verdict against thresholds; exit status 0 when the
run passes, 1 when it does not.

The thresholds' defaults are shown in `--help` without importing the gate (`GATE_DEFAULTS`, kept
equal to `GateThresholds()` by a test), so that building the parser stays light.
"""

from __future__ import annotations

import argparse
import json

from gym_failures.cli._exits import EXIT_FAILED, EXIT_OK, CommandError
from gym_failures.cli._inputs import row_inputs
from gym_failures.cli._options import (
    Subcommands,
    add_command,
    add_json_option,
    add_paths_argument,
    at_least,
    share,
)
from gym_failures.cli._text import print_json, warn

__all__ = ["GATE_DEFAULTS", "add_gate"]

GATE_DEFAULTS = {
    "min_scored_share": 0.95,
    "max_evaluation_share": 0.02,
    "max_unknown_share": 0.0,
    "max_missing": 0,
    "max_short_groups": 0,
    "max_short_group_share": None,
}
"""`GateThresholds()`'s defaults, shown in `gate --help` without importing the gate (a test keeps
them equal)."""


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
    add_paths_argument(parser)
    parser.add_argument(
        "--expected",
        type=at_least(0),
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
            type=share,
            metavar="SHARE",
            help=f"{what} (default {GATE_DEFAULTS[name]})",
        )
    parser.add_argument(
        "--max-missing",
        type=at_least(0),
        metavar="N",
        help=f"most expected rollouts without a final outcome (default {GATE_DEFAULTS['max_missing']})",
    )
    parser.add_argument(
        "--min-valid-per-group",
        type=at_least(1),
        metavar="K",
        help="count the prompt groups (the rollouts of one task): a group with fewer than K valid "
        "members (scored, clean) is short; the run fails when short groups exceed --max-short-groups",
    )
    parser.add_argument(
        "--max-short-groups",
        dest="short_groups_limit",
        type=count_or_share,
        metavar="N|SHARE",
        help="most groups short of --min-valid-per-group: a count (3) or a share of the groups "
        "(0.05, 5%%); default 0",
    )
    parser.add_argument(
        "--score-tainted",
        action="store_true",
        help="judge a tainted result (a success built on a call that ended in failure: a cut stream "
        "joined into the answer, say) as any success; by default it is an outcome of its own, not scored",
    )
    add_json_option(parser)


def _run_gate(arguments: argparse.Namespace) -> int:
    from gym_failures import gate as acceptance

    if arguments.short_groups_limit is not None and arguments.min_valid_per_group is None:
        raise CommandError(
            "--max-short-groups needs --min-valid-per-group K: the groups are counted against K"
        )
    files = row_inputs(arguments.paths)
    given = {
        name: getattr(arguments, name) for name in GATE_DEFAULTS if getattr(arguments, name, None) is not None
    }
    if arguments.short_groups_limit is not None:
        given.update(arguments.short_groups_limit)
    thresholds = acceptance.GateThresholds(**given) if given else None  # None: the defaults
    coverage = acceptance.read_coverage(
        files,
        arguments.expected,
        score_tainted=arguments.score_tainted,
        min_valid_per_group=arguments.min_valid_per_group,
    )
    if coverage.seen == 0:
        names = ", ".join(str(path) for path in files)
        if coverage.expected_source == "rows_seen":
            raise CommandError(f"no rollout rows in {names}, and no manifest says how many were expected")
        warn(f"no rollout rows in {names}")
    if coverage.invalid_lines or coverage.torn_tails:
        warn(acceptance.skipped_text(coverage.invalid_lines, coverage.torn_tails))
    verdict = acceptance.check(coverage, thresholds)
    for warning in verdict.warnings:
        warn(warning)
    if arguments.json_output:
        print_json(json.dumps(verdict.as_dict(), indent=2))
    else:
        from gym_failures.cli._tables import print_verdict

        print_verdict(verdict)
    return EXIT_OK if verdict.passed else EXIT_FAILED


def count_or_share(text: str) -> dict[str, int | float]:
    """`--max-short-groups`: a whole number is a count of groups; a number with a point, or a
    percentage, is a share of the groups."""
    value = text.strip()
    try:
        if value.endswith("%"):
            share = float(value[:-1]) / 100
        elif "." in value:
            share = float(value)
        else:
            count = int(value)
            if count < 0:
                raise ValueError(value)
            return {"max_short_groups": count}
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count or a share of groups: {text!r}") from None
    if not 0.0 <= share <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"a share of groups is from 0 to 1 (0% to 100%), not {text!r}")
    return {"max_short_group_share": share}
