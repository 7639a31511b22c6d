"""`gym-failures explain`: the cause tree of one row (`--line N`, or `FILE:N` as the trees' labels
print it) or of every row of one rollout (`--rollout ID`), across every hop.

Line numbers are 1-based, as editors and `grep -n` count them. No such row is exit status 1, with
one line saying why (a rollout the materialized inputs owe that left no row says so).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from gym_failures.cli._exits import EXIT_FAILED, EXIT_OK, CommandError
from gym_failures.cli._inputs import row_inputs
from gym_failures.cli._options import Subcommands, add_command, add_json_option, add_paths_argument, at_least
from gym_failures.cli._text import print_json, stderr_line

__all__ = ["add_explain"]


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
    add_paths_argument(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--line",
        type=at_least(1),
        metavar="N",
        help="the row on line N of the one file given (1-based, every line counted, as editors and "
        "`grep -n` number them); `explain FILE:N` is the same, as the cause trees' labels print it",
    )
    which.add_argument("--rollout", metavar="ID", help="every row of rollout ID, by attempt")
    add_json_option(parser)


def _run_explain(arguments: argparse.Namespace) -> int:
    from gym_failures.reporting.explain import line_row, rollout_rows, with_retried
    from gym_failures.rows import run_row_files

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
        # The rollout's other rows, in the run's other file too, say whether it was retried (read only
        # for that: the row explained is the one named).
        found = with_retried(line_row(files[0], arguments.line), run_row_files(files[0]))
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
        from gym_failures.cli._console import print_tree
        from gym_failures.cli._tree import explanation_tree

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
