"""What a long-running command shows and serves while it runs: the live view of a collection (a rich
progress bar on a terminal, plain lines otherwise) and its `/metrics` endpoint (`metrics_endpoint`).

On a terminal (stderr) the bar shows rollouts done of expected, this run's scored rollouts (as the
gate counts them: a verdict, else a finite reward, and no gate class), its degraded, masked, tainted and
gate-derived successes when there are any, final failures by class, attempts retried, the rollouts
reopened and backing off, the prompt groups complete, short and pending when a group has more than one
member (`groups (min 2 valid): 3 complete, 1 short, 2 pending`, `gym_failures.collection._groups`),
how long dispatch has waited for the agent to accept connections, whether the breaker holds dispatch
to probes (`breaker open: <kind> at <boundary>, probing`), the rate and the time left; it is
transient. When stderr is no terminal (a CI log, a file) the same figures go out as
one plain line every `PLAIN_INTERVAL_S` seconds and once at the end, so a log shows a long run moving
without a line per rollout (and once when dispatch starts waiting for the agent, and once when the
breaker opens).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from gym_failures.cli._console import stderr
from gym_failures.cli._exits import CommandError
from gym_failures.telemetry import CollectionProgress

if TYPE_CHECKING:
    from gym_failures.collection._groups import GroupTally

__all__ = ["PLAIN_INTERVAL_S", "counts_text", "live_collection", "metrics_endpoint"]

PLAIN_INTERVAL_S = 10.0
_CLASSES = ("model", "evaluation", "unknown")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def _by_class(counts: dict[str, int]) -> str:
    return ", ".join(
        f"{name} {counts[name]}"
        for name in (*_CLASSES, *sorted(set(counts) - set(_CLASSES)))
        if counts.get(name)
    )


def counts_text(progress: CollectionProgress) -> str:
    """The counts beside the bar: scored (of which degraded), masked and gate-derived successes, final
    failures by class, retried attempts, the groups; the words and counts `gym-failures gate` prints."""
    text = f"{progress.scored} scored"
    if progress.degraded:
        text += f" ({progress.degraded} degraded)"
    if progress.masked:
        text += f" · {progress.masked} masked"
    if sum(progress.tainted.values()):
        text += f" · tainted: {_by_class(progress.tainted)}"
    if sum(progress.gate_derived.values()):
        text += f" · gate-derived: {_by_class(progress.gate_derived)}"
    text += f" · failed: {_by_class(progress.failed) or 'none'} · {progress.retried} retried"
    if progress.omitted:
        text += f" · {progress.omitted} omitted"
    if progress.reopened:
        text += f" · {progress.reopened} reopened"
    if progress.backing_off:
        text += f" · {progress.backing_off} backing off"
    # The collector's `GroupedProgress` holds them; not imported here, as `serve` needs no collector.
    groups: GroupTally | None = getattr(progress, "groups", None)
    if groups is not None and groups.shown:
        text += f" · {groups.text()}"
    if progress.agent_wait_s is not None:
        text += f" · waiting for the agent {progress.agent_wait_s:.0f} s"
    if progress.breaker is not None:
        text += f" · breaker open: {progress.breaker}, probing"
    return text


def _plain_line(progress: CollectionProgress) -> str:
    return (
        f"collecting: {progress.done}/{progress.expected} done · {counts_text(progress)} · "
        f"{progress.rate:.1f}/s · ETA {_duration(progress.eta_s)}"
    )


@contextmanager
def live_collection(description: str = "collecting") -> Iterator[Callable[[CollectionProgress], None]]:
    """The collector's `on_progress` hook, drawing the live view on stderr while the block runs."""
    console = stderr()
    if not console.is_terminal:
        with _plain_lines(sys.stderr) as update:
            yield update
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TextColumn("{task.fields[rate]}/s ETA {task.fields[eta]}"),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=None, counts="", rate="0.0", eta="?")

        def update(progress: CollectionProgress) -> None:
            bar.update(
                task,
                completed=progress.done,
                total=progress.expected,
                counts=counts_text(progress),
                rate=f"{progress.rate:.1f}",
                eta=_duration(progress.eta_s),
            )

        yield update


@contextmanager
def _plain_lines(stream: TextIO) -> Iterator[Callable[[CollectionProgress], None]]:
    last: list[CollectionProgress] = []
    printed = [time.monotonic()]

    waiting = [False]
    opened: list[str | None] = [None]

    def update(progress: CollectionProgress) -> None:
        last[:] = [progress]
        now = time.monotonic()
        # A wait for the agent, or the breaker's hold, is said when it starts: a log shows why
        # nothing moves.
        started_waiting = progress.agent_wait_s is not None and not waiting[0]
        waiting[0] = progress.agent_wait_s is not None
        breaker_opened = progress.breaker is not None and progress.breaker != opened[0]
        opened[0] = progress.breaker
        if started_waiting or breaker_opened or now - printed[0] >= PLAIN_INTERVAL_S:
            printed[0] = now
            print(_plain_line(progress), file=stream, flush=True)

    try:
        yield update
    finally:
        if last:
            print(_plain_line(last[0]), file=stream, flush=True)


@contextmanager
def metrics_endpoint(port: int, service_name: str, host: str = "0.0.0.0") -> Iterator[None]:
    """`/metrics` on `host:port` while the block runs; one line and exit status 2 when it cannot be served
    (the port is taken, say). The commands check the `prometheus` extra when they read their options
    (`require_extra`)."""
    import errno

    from gym_failures.telemetry import MetricsUnavailable, serve_metrics

    try:
        server = serve_metrics(port, host, service_name=service_name)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise CommandError(f"port {port} is in use (--metrics-port)") from None
        raise CommandError(f"cannot serve metrics on port {port}: {error.strerror or error}") from None
    except MetricsUnavailable as error:
        raise CommandError(f"cannot serve metrics on port {port}: {error}") from None
    stderr().print(f"metrics: {server.url}", style="dim", highlight=False)
    with server:
        yield
