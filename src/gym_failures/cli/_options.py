"""How a command declares itself (`add_command`) and the option types and options several commands
share: shares, counts, seconds, ports, an agent URL, `--json`, the row paths, `--metrics-port`.

Every type is an `argparse` type: a refused value is `argparse.ArgumentTypeError`, which the parser
prints as one line naming the option (`argument --rollouts: 0 is below the minimum 1`). Nothing here
imports beyond the standard library, so building the parser stays light.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym_failures.cli._exits import EXIT_STATUS_HELP

__all__ = [
    "Run",
    "Subcommands",
    "add_command",
    "add_json_option",
    "add_metrics_option",
    "add_paths_argument",
    "agent_url",
    "at_least",
    "port_number",
    "positive_seconds",
    "seconds_or_zero",
    "share",
]

Subcommands = Any
"""The object `ArgumentParser.add_subparsers` returns (argparse keeps its class private)."""

Run = Callable[[argparse.Namespace], int]


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


def share(text: str) -> float:
    """A share, a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share between 0 and 1")
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """The type of a whole number of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {minimum}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """A number of seconds above 0 (a limit: none is refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def seconds_or_zero(text: str) -> float:
    """A finite number of seconds of at least 0 (a wait: 0 is none, an endless one is refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number of seconds of at least 0")
    return value


def agent_url(text: str) -> str:
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


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """`--json`: one JSON document instead of tables."""
    parser.add_argument(
        "--json", dest="json_output", action="store_true", help="print one JSON document instead of tables"
    )


def add_paths_argument(parser: argparse.ArgumentParser) -> None:
    """`PATH...`: the row files or run directories a reading command reads (`row_inputs`)."""
    parser.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="JSONL files of saved rows, or run directories (their row files, as the manifest names them)",
    )
