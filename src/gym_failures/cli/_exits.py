"""The command line's exit statuses, how `--help` words them, and `CommandError`, the error that
carries one: every module of the command line raises it, and the entry point (`_app.main`) prints
it as one line.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_STATUS_HELP",
    "EXIT_USAGE",
    "CommandError",
    "first_problem",
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
  0    done; gate: the run passed; demo: the demo ran (its gate's verdict is
       printed, not returned)
  1    done, and the answer is no: gate failed the run; explain found no such
       row; no rollout of collect's run succeeded (resumed rows included), it
       could not reach the agent, or its breaker ended it
  2    nothing done: a bad option, a missing or unreadable path, input without
       rollout rows or tasks, a busy port, an extra that is not installed; one
       line on stderr says which
  130  interrupted
  141  the output's reader closed the pipe (| head); nothing printed
  143  serve: ended by SIGTERM, once the server stopped"""
"""The statuses as the README's table words them (tests/cli/test_exits.py compares the two)."""


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


def first_problem(error: Any) -> str:
    """A pydantic `ValidationError`'s first problem as `where: what` (no input, no link), with how
    many more there are."""
    problems = error.errors(include_url=False, include_input=False)
    first = problems[0]
    parts = [str(part) for part in first["loc"]]
    where = ".".join(parts)
    if len(parts) >= 2 and parts[-1] == "[key]":  # pydantic's `rates.bogus.[key]`: a mapping's key
        where = ", ".join([*filter(None, [".".join(parts[:-2])]), f"key {parts[-2]!r}"])
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    message = str(first["msg"]).removeprefix("Value error, ")  # a validator's own words, as it wrote them
    return f"{where + ': ' if where else ''}{message}{more}"
