"""The `gym-failures` command line: summarize, explain and gate saved rollout rows; collect; run the demo.

Every command prints tables for people and, with `--json`, one JSON document for machines. Exit
status, for scripts (`gym_failures.cli.EXIT_*`):

- 0: done (the gate passed);
- 1: done, and the answer is no: the gate failed, `explain` found no such row, no rollout of
  `collect`'s run succeeded (the rows of the runs it resumed included);
- 2: nothing done: a bad option, a missing or unreadable path, input without rows or tasks, a busy
  port, a missing extra; one line on stderr says which, never a traceback;
- 130: interrupted;
- 141: the output's reader closed the pipe (`| head`), quietly.

No command raises on a torn or invalid line: such lines are skipped, counted and warned about.
The parser and exit statuses are in `gym_failures.cli._app`, the commands in
`gym_failures.cli._commands`, how their output looks in `gym_failures.cli._render`.

The parser needs nothing beyond the core; `summarize` needs the `cli` extra (duckdb, rich),
`explain` and `gate` rich, `collect` the `aiohttp` extra too, `demo` the `demo` extra.
"""

from gym_failures.cli._app import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, main

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "main"]
