"""The `gym-failures` parser and entry point: the commands in `--help`'s order (`COMMANDS`), and
`main`, which runs one and turns what it raises into one line and an exit status.

The parser is the standard library's `argparse`, not typer: typer (with click and rich) alone took
2.6x the start-up of `python -c "import pydantic, json"` on this machine, over the 2.5x the whole
`gym-failures --help` may take (`benchmarks/bench_startup.py`). Each command imports what it needs
(rich, duckdb, aiohttp, the gate) inside its run function, so building the parser imports none of
them.

Every error a user can fix (a bad option, a missing or unreadable path, input with no rows or tasks, a
busy port, a missing extra) is one line on stderr, `gym-failures <command>: error: <what>`, and exit
status 2; never a traceback or a validation dump.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

from gym_failures.cli._collect import add_collect
from gym_failures.cli._demo import add_demo
from gym_failures.cli._exits import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    EXIT_USAGE,
    CommandError,
)
from gym_failures.cli._explain import add_explain
from gym_failures.cli._extras import EXTRA_MODULES, needs_extra
from gym_failures.cli._gate import add_gate
from gym_failures.cli._nemo_gym import add_nemo_gym
from gym_failures.cli._options import Run, Subcommands
from gym_failures.cli._serve import add_serve
from gym_failures.cli._shell import demo_module, program
from gym_failures.cli._summarize import add_summarize
from gym_failures.cli._verdict import add_verdict

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS: Sequence[Callable[[Subcommands], None]] = (
    add_summarize,
    add_explain,
    add_gate,
    add_collect,
    add_demo,
    add_serve,
    add_verdict,
    add_nemo_gym,
)
"""Every command, in the order `--help` lists them: a new command is one more module with an
`add_<name>(commands)`, and its entry here."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints the usage and then the error: two lines, the second the one that matters.
        raise CommandError(f"{message} (see `{_help_hint(self.prog.partition(' ')[2])}`)", command=self.prog)


def _help_hint(command: str | None) -> str:
    """The help to see after a usage error in `command` (None: no command), as the user ran this
    program: `python -m gym_failures.demo --help` when that is how the demo was run."""
    demo = demo_module() if command == "demo" else None
    words = (demo, "--help") if demo is not None else (program(), command, "--help")
    return " ".join(part for part in words if part)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (`COMMANDS`)."""
    parser = _Parser(
        prog="gym-failures",
        description=textwrap.fill(
            "Summarize, explain and gate the failure reports saved beside rollouts; collect "
            "rollouts from an agent server; run a local demo gym.",
            88,
        ),
        epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)
    for add in COMMANDS:
        add(commands)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gym-failures")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _missing_extra(error: ModuleNotFoundError, extra: str | None) -> str | None:
    """The one line for a command whose optional dependency is missing, or None for any other module
    (a bug, or a broken install, which keeps its traceback)."""
    module = (error.name or "").partition(".")[0]
    if extra is None or module not in EXTRA_MODULES:
        return None
    return needs_extra("this command", extra, module)


@contextlib.contextmanager
def _library_log(counts_skipped_lines: bool) -> Iterator[None]:
    """The library's warnings (a torn line cut on resume, say) as `warning: ...` lines on stderr for
    the command's run, unless logging is configured already. A command that counts the lines it
    skipped in one warning of its own silences the row reader's warning per line."""
    import logging  # 20 ms of start-up: `--help` never needs it

    class LowerCaseLevel(logging.Formatter):
        """`warning: ...`, spelled as the commands' own warnings are."""

        def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
            return f"{record.levelname.lower()}: {record.getMessage()}"

    library = logging.getLogger("gym_failures")
    # `gym_failures.rows` logs under the collection's name (see its module).
    rows = logging.getLogger("gym_failures.collection")
    levels = (library.level, rows.level)
    handler: logging.Handler | None = None
    if not library.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(LowerCaseLevel())
        library.addHandler(handler)
        library.setLevel(logging.WARNING)
    if counts_skipped_lines:
        rows.setLevel(logging.ERROR)
    try:
        yield
    finally:
        library.setLevel(levels[0])
        rows.setLevel(levels[1])
        if handler is not None:
            library.removeHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default: the process's arguments); its exit status."""
    parser = build_parser()
    command = "gym-failures"
    arguments: argparse.Namespace | None = None
    try:
        arguments, unknown = parser.parse_known_args(argv)
        if unknown:
            # argparse reports these from the top parser; name the command they were given to.
            name = getattr(arguments, "command_name", None)
            where = f"gym-failures {name}" if name else "gym-failures"
            hint = _help_hint(name)
            raise CommandError(f"unrecognized arguments: {' '.join(unknown)} (see `{hint}`)", command=where)
        if arguments.version:
            print(f"gym-failures {_version()}")
            return EXIT_OK
        run: Run | None = getattr(arguments, "run", None)
        if run is None:
            parser.print_help()
            return EXIT_USAGE
        command = f"gym-failures {arguments.command_name}"
        with _library_log(arguments.counts_skipped_lines):
            return run(arguments)
    except CommandError as error:
        print(f"{error.command or command}: error: {error.message}", file=sys.stderr)
        return error.status
    except ModuleNotFoundError as error:
        message = _missing_extra(error, getattr(arguments, "extra", None))
        if message is None:
            raise
        print(f"{command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`| head`): nothing to say, and nowhere to say it. Point stdout at
        # /dev/null so that the interpreter's final flush does not raise again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as error:
        where = f"{error.filename}: " if error.filename is not None else ""
        print(f"{command}: error: {where}{error.strerror or error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
