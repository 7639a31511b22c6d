"""`python -m gym_failures.demo`: the same as `gym-failures demo`, its one parser and help text
(`gym_failures.cli._demo`), its output and its exit statuses."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run `gym-failures demo` with `argv` (default: the process's arguments); its exit status."""
    from gym_failures.cli import main as command_line

    return command_line(["demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
