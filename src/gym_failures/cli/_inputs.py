"""What the reading commands read: the row files their paths name (`row_inputs`), each once, a run's
failures with its successes; and the checks that refuse a path before any work (`require_file`,
`writable_file`), naming it.

Decisions:

- A directory argument stands for its row files (`gym_failures.rows.row_files`): the files its
  manifests name, never its tasks or injected faults. An input that names no file, or whose files
  hold no rollout row, is an error (exit status 2), never an empty table with exit status 0.
- A run's success rows named alone (`out.jsonl` beside its manifest) bring the run's failures
  (`out_failures.jsonl`), with a line on stderr: a run's rows without its failures count its final
  failures as missing. Not the other way round: the failures alone are what a user asks for when
  naming them (unless the run's materialized inputs sit beside them, which would count each success
  as a rollout that left no row). Every input is read once, however often it is named.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from gym_failures.cli._exits import CommandError
from gym_failures.cli._shell import shell_path
from gym_failures.cli._text import plural, stderr_line

__all__ = ["quiet_row_reader", "require_file", "row_inputs", "writable_file"]


def require_file(path: Path, label: str) -> None:
    """Refuse `path` unless it is a file that can be read, naming what it is instead; `label` is how
    the message names it (`--fault-plan plan.json`, or the path itself)."""
    if path.is_dir():
        raise CommandError(f"{label} is a directory; name a file")
    if not path.exists():
        raise CommandError(f"{label}: no such file")
    if not path.is_file():
        raise CommandError(f"{label} is not a regular file")


def _runs_inside(directory: Path, shown: int = 3) -> str:
    """ ", it holds runs: a, b (name one)" for a directory of run directories (`runs/`, `make demo`'s
    parent of its runs), naming the newest `shown`; "" for any other."""
    from gym_failures.rows import row_files

    runs = sorted(
        (child for child in directory.iterdir() if child.is_dir() and row_files(child)), reverse=True
    )
    if not runs:
        return ""
    names = ", ".join(shell_path(run) for run in runs[:shown])
    more = f" and {len(runs) - shown} more" if len(runs) > shown else ""
    return f"; it holds {plural(len(runs), 'run')}: {names}{more} (name one)"


def row_inputs(paths: Iterable[Path], *, run_failures: bool = True) -> list[Path]:
    """The row files `paths` name, each once: a file as itself, a directory as its row files.

    A run's success rows named alone (`out.jsonl`, its collection manifest `out.manifest.json`
    beside it) bring the run's failures (`out_failures.jsonl`) with them unless `run_failures` is
    false (`explain --line` reads the one file named): without them the run's final failures would
    count as missing. Likewise a run's failures named alone bring its successes when its materialized
    inputs sit beside them (which the gate counts rollouts that left no row against). One line on
    stderr says so. A file named twice, or also through its directory,
    is read once.

    Raises `CommandError` for a path that does not exist, is not a file or a directory, or is a
    directory without row files.
    """
    from gym_failures.nemo_gym import materialized_inputs_path
    from gym_failures.rows import row_files, run_failures_file, run_row_files

    named: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = row_files(path)
            if not found:
                raise CommandError(f"{path}: no row files (*.jsonl) in this directory{_runs_inside(path)}")
            named.extend(found)
        elif path.is_file():
            _readable(path)
            named.append(path)
        elif path.exists():
            raise CommandError(f"{path}: not a file or a directory")
        else:
            raise CommandError(f"{path}: no such file or directory")
    files: dict[Path, Path] = {}
    for path in named:
        files.setdefault(path.resolve(), path)  # the first spelling of each
    ordered = list(files.values())
    if not run_failures:
        return ordered
    result: list[Path] = []
    for path in ordered:
        result.append(path)
        failures = run_failures_file(path)
        if failures is not None and failures.resolve() not in files:
            files[failures.resolve()] = failures
            result.append(failures)
            stderr_line(f"reading {failures} too: the failures of {path}'s run")
        if failures is None and materialized_inputs_path(path).is_file():
            # A run's failures named alone, its materialized inputs beside them: its successes too,
            # else each would count as a rollout that left no row at all.
            for rows in run_row_files(path)[1:]:
                if rows.resolve() not in files:
                    files[rows.resolve()] = rows
                    result.append(rows)
                    stderr_line(f"reading {rows} too: the successes of {path}'s run")
    return result


def _readable(path: Path) -> None:
    """Refuse a file whose first bytes cannot be read, naming it (a read error names no file)."""
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as error:
        raise CommandError(f"{path}: {error.strerror or error}") from None


def writable_file(path: Path, option: str) -> None:
    """Refuse, before any work, an output file that cannot be written where it is named."""
    if path.is_dir():
        raise CommandError(f"{option} {path}: is a directory; name a file")
    parent = path.parent
    if not parent.is_dir():
        raise CommandError(f"{option} {path}: the directory {parent} does not exist")


@contextlib.contextmanager
def quiet_row_reader() -> Iterator[None]:
    """Silence the row and task readers' warning per skipped line for the block: the collection warns
    about those lines itself, when it reads the same files."""
    import logging

    rows = logging.getLogger("gym_failures.collection")  # `gym_failures.rows` logs under this name
    level = rows.level
    rows.setLevel(logging.ERROR)
    try:
        yield
    finally:
        rows.setLevel(level)
