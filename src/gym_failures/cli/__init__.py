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

The parser needs nothing beyond the core; `summarize` needs the `cli` extra (duckdb, rich),
`explain` and `gate` rich, `collect` the `aiohttp` extra too, `demo` the `demo` extra.

Where things live, one job a module (each imports only those above it in this list, never one
below: the imports among them form no cycle, those inside functions included):

- `_text`: text from the rows made safe for a terminal, JSON output, stderr lines and warnings,
  the words of counts (`plural`); no rich.
- `_exits`: the exit statuses, how `--help` words them, and `CommandError`, the one-line error.
- `_shell`: how to name this program and a path for a shell (`program`, `shell_path`).
- `_extras`: which missing modules are a missing extra, and the line that says so.
- `_options`: `add_command`, and the option types and options several commands share.
- `_inputs`: the row files the paths name (`row_inputs`), and the checks that refuse a path.
- `_console`, `_tables`, `_tree`: how output looks, with rich: the consoles and plain lines; the
  summary's, the gate's and a collection's tables (the coverage table drawn from
  `gym_failures.gate.coverage_rows`, as the HTML report draws it); a row's cause tree.
- `_live`: what a long run shows and serves while it runs (its progress, `/metrics`).
- one module per command, its options and its run: `_summarize`, `_explain`, `_gate`, `_collect`
  (with `_collect_options`, its options, and `_collect_outcome`, what it says at the end and its
  exit status), `_demo` (which `python -m gym_failures.demo` runs too: one parser, one help text),
  `_serve` (`serve model`), `_verdict`.
- `_app`: the parser of every command (`COMMANDS`, in `--help`'s order) and `main`, the entry point.

A new command is one more module with an `add_<name>(commands)` and its entry in `COMMANDS`.
"""

from gym_failures.cli._app import main
from gym_failures.cli._exits import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "main"]
