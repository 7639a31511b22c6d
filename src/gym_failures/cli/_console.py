"""The rich consoles the commands print on, and the plain pieces every view uses: a value from a
row as a cell (`cell`), a line, a rule, a tree, a progress bar.

Text from the rows (kinds, boundaries, stages, reasons, ids) is data, never markup or terminal
commands: every such value reaches rich as a `Text` (no `[bold]` or `[link=...]` in a reason is
interpreted), cleaned by `gym_failures.cli._text.clean` (no terminal control characters). A reader
that closes the pipe is a `BrokenPipeError`, which the entry point turns into exit status 141.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from gym_failures.cli._text import clean

__all__ = ["cell", "print_rule", "print_tree", "progress_bar", "stderr", "stdout", "stdout_line"]


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits with status 1 here, which this command line keeps for "the answer is no"; the
        # entry point turns a broken pipe into its own quiet status (141).
        self.quiet = True
        raise BrokenPipeError


def _console(stderr: bool = False) -> Console:
    # Piped output is read by people later (CI logs, files): a fixed width keeps reasons and ids
    # whole instead of cut to the 80 columns rich assumes without a terminal.
    console = _Console(stderr=stderr, highlight=False)
    return console if console.is_terminal else _Console(stderr=stderr, highlight=False, width=160)


def stdout() -> Console:
    """The console for what a command prints."""
    return _console()


def stderr() -> Console:
    """The console for errors, warnings and progress."""
    return _console(stderr=True)


def stdout_line(text: str, style: str = "") -> None:
    """`text` (which may come from the rows or the user) on stdout, control characters stripped."""
    stdout().print(cell(text, style=style))


def print_rule(title: str) -> None:
    """A horizontal rule with `title`, between the sections of the demo's output."""
    stdout().rule(title)


def print_tree(tree: Tree) -> None:
    """A cause tree on stdout."""
    stdout().print(tree)


def cell(value: object, style: str = "") -> Text:
    """A value from a row as plain text (never markup) without terminal control characters."""
    return Text(clean(value), style=style)


@contextmanager
def progress_bar(enabled: bool, description: str) -> Iterator[Callable[[float, float], None] | None]:
    """A progress callback (done, total) drawing a rich bar on stderr, or None when not `enabled` or
    stderr is no terminal (a bar in a log file is noise)."""
    console = stderr()
    if not enabled or not console.is_terminal:
        yield None
        return
    # rich.progress costs 5 ms of every command's start; only a bar drawn on a terminal needs it.
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(description, total=None)

        def update(done: float, total: float) -> None:
            progress.update(task, completed=done, total=total)

        yield update
