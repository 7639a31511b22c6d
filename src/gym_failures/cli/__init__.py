"""The `gym-failures` command line: summarize, explain, gate and collect saved rollout rows; run the demo.

Every command prints rich tables for people and, with `--json`, one JSON document for machines.
Exit status: 0 on success (and when the gate passes), 1 when the gate fails or a requested row is not
found, 2 for usage errors (a missing path, a bad option, a refused resume). No command raises on a
torn or invalid line: such lines are skipped and counted.

The commands (options, exit status) are in `gym_failures.cli._commands`; how their output looks,
and how text from the rows is kept from acting on the terminal, in `gym_failures.cli._render`.

Needs the `cli` extra (typer, rich, duckdb); `collect` also needs the `aiohttp` extra.
"""

from gym_failures.cli._commands import app

__all__ = ["app", "main"]


def main() -> None:
    """The console script's entry point."""
    app()
