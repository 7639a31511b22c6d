"""The `gym-failures` parser and entry point: its commands, its exit statuses, and one-line errors.

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
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "METRICS_MODULES",
    "CommandError",
    "Subcommands",
    "add_command",
    "add_metrics_option",
    "build_parser",
    "main",
    "needs_extra",
    "plural",
    "port_number",
    "program",
    "require_extra",
    "require_file",
    "shell_path",
]

EXIT_OK = 0
"""The command did what was asked (and the gate passed)."""
EXIT_FAILED = 1
"""The command ran and the answer is no: the gate failed, no row matched, no rollout succeeded."""
EXIT_USAGE = 2
"""Nothing was done: a bad option, a missing or unreadable path, input without rows or tasks, a busy
port, a missing extra."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C), as shells report SIGINT."""
EXIT_BROKEN_PIPE = 141
"""The output's reader closed the pipe (`| head`), as shells report SIGPIPE; nothing is printed."""

EXIT_STATUS_HELP = """exit status:
  0    done; gate: the run passed
  1    done, and the answer is no: gate failed the run; explain found no such
       row; no rollout of collect's run succeeded (resumed rows included), or
       it could not reach the agent
  2    nothing done: a bad option, a missing or unreadable path, input without
       rollout rows or tasks, a busy port, an extra that is not installed; one
       line on stderr says which
  130  interrupted
  141  the output's reader closed the pipe (| head); nothing printed"""
"""The statuses as the README's table words them (tests/cli/test_exits.py compares the two)."""

METRICS_MODULES = ("prometheus_client", "opentelemetry.sdk", "opentelemetry.exporter.prometheus")
"""What `--metrics-port` needs: the `prometheus` extra's modules (`require_extra`)."""

Subcommands = Any
"""The object `ArgumentParser.add_subparsers` returns (argparse keeps its class private)."""

Run = Callable[[argparse.Namespace], int]


class CommandError(Exception):
    """An error the user can fix, printed as one line; `status` is the exit status (2 by default)."""

    def __init__(self, message: str, status: int = EXIT_USAGE, command: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.command = command
        """The command to name in the message (`gym-failures gate`); None for the one that ran."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.status, self.command))


def require_file(path: Path, label: str) -> None:
    """Refuse `path` unless it is a file that can be read, naming what it is instead; `label` is how
    the message names it (`--fault-plan plan.json`, or the path itself)."""
    if path.is_dir():
        raise CommandError(f"{label} is a directory; name a file")
    if not path.exists():
        raise CommandError(f"{label}: no such file")
    if not path.is_file():
        raise CommandError(f"{label} is not a regular file")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints the usage and then the error: two lines, the second the one that matters.
        hint = " ".join(part for part in (program(), self.prog.partition(" ")[2], "--help") if part)
        raise CommandError(f"{message} (see `{hint}`)", command=self.prog)


def program() -> str:
    """How to run this command line again, as it was run: `gym-failures` when that name on PATH is
    this program, else its path (`.venv/bin/gym-failures` after `make demo`), else
    `python -m gym_failures.cli`."""
    import shutil  # 10 ms of start-up: only a hint or an error needs it

    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "gym-failures"
    name = Path(argv0).name
    if name in ("__main__.py", "-c") or not Path(argv0).exists():
        return (
            "gym-failures"
            if name == "gym-failures"
            else f"{shell_path(Path(sys.executable))} -m gym_failures.cli"
        )
    found = shutil.which(name)
    if found is not None and Path(found).resolve() == Path(argv0).resolve():
        return name
    return shell_path(Path(argv0))


def shell_path(path: Path) -> str:
    """`path` as a shell word to paste: relative to the working directory when under it, quoted."""
    import shlex

    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        relative = str(path)
    shown = relative if not relative.startswith("..") else str(path.absolute())
    return shlex.quote(shown)


def add_command(
    commands: Subcommands,
    name: str,
    run: Run,
    *,
    help: str,
    description: str,
    extra: str | None,
    counts_skipped_lines: bool = False,
) -> argparse.ArgumentParser:
    """A new command `name` on `commands`, running `run(arguments)` for its exit status. `extra` names
    the optional dependencies it needs (`cli`, `aiohttp,cli`, ...), for the message when one is
    missing; `counts_skipped_lines` says it reports skipped row lines itself (see `_library_log`)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=help,
        description=textwrap.fill(description, 88),
        epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(run=run, extra=extra, command_name=name, counts_skipped_lines=counts_skipped_lines)
    return parser


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 line`, `2 lines`: a count and its noun, agreeing (`nouns` when the plural is not `noun` + s)."""
    return f"{count} {noun}" if count == 1 else f"{count} {nouns or noun + 's'}"


def skipped_text(invalid_lines: int, torn_tails: int, other_rows: int = 0) -> str:
    """What a reader skipped, its nonzero parts only: "2 invalid lines and the torn last lines of 2
    files skipped" (a file has one last line), "" when nothing was skipped."""
    parts = [plural(invalid_lines, "invalid line")] if invalid_lines else []
    if torn_tails:
        parts.append("a torn last line" if torn_tails == 1 else f"the torn last lines of {torn_tails} files")
    if other_rows:
        parts.append(plural(other_rows, "other row"))
    if not parts:
        return ""
    return f"{', '.join(parts[:-1])} and {parts[-1]} skipped" if len(parts) > 1 else f"{parts[0]} skipped"


def needs_extra(what: str, extra: str, module: str) -> str:
    """The one line for a missing extra: `what` (`this command`, `--metrics-port`) needs `extra`
    (`cli`, or `aiohttp,cli` as pip spells several), `module` being the one not installed."""
    names = extra.split(",")
    words = (
        f"the {names[0]} extra" if len(names) == 1 else f"the {', '.join(names[:-1])} and {names[-1]} extras"
    )
    return f"{what} needs {words} ({module} is not installed): pip install 'gym-failures[{extra}]'"


def require_extra(what: str, extra: str, modules: Sequence[str]) -> None:
    """Refuse `what` (exit status 2, `needs_extra`'s line) when one of `modules` cannot be imported;
    the modules are found, not imported, so the check costs no start-up."""
    import importlib.util

    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            raise CommandError(needs_extra(what, extra, module))


def add_metrics_option(parser: argparse.ArgumentParser) -> None:
    """`--metrics-port PORT`, the same for every command that serves `/metrics` while it runs."""
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        metavar="PORT",
        help="serve OpenTelemetry metrics at :PORT/metrics while running (the prometheus extra)",
    )


def port_number(text: str) -> int:
    """A TCP port, 0-65535, as argparse reads an option's value."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"the port {port} is out of range (0-65535)")
    return port


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (see `gym_failures.cli._commands`)."""
    from gym_failures.cli._commands import COMMANDS

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
    from gym_failures.cli._commands import EXTRA_MODULES

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
            hint = " ".join(part for part in (program(), name, "--help") if part)
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
