"""Shared timing helpers: compare callables measured in the same process, in alternating rounds.

A machine's speed drifts (frequency scaling, a noisy neighbour, the allocator warming up), so a
figure is only worth reporting as a ratio against a baseline measured under the same drift. Each
round times every callable once, in an order that rotates from round to round, and the median over
rounds is kept: one disturbed round moves a mean, not a median.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

__all__ = ["calibrate", "compare", "compare_samples", "markdown_table", "ratio_row"]


def calibrate(function: Callable[[], object], *, target_ns: int = 20_000_000) -> int:
    """How many calls of `function` take about `target_ns`, so that one timed batch is long enough
    for `perf_counter_ns` resolution and loop overhead to vanish."""
    number = 1
    while True:
        start = time.perf_counter_ns()
        for _ in range(number):
            function()
        elapsed = time.perf_counter_ns() - start
        if elapsed >= target_ns // 4 or number >= 1 << 30:
            return max(1, number * target_ns // max(elapsed, 1))
        number *= 4


def _time_batch(function: Callable[[], object], number: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(number):
        function()
    return (time.perf_counter_ns() - start) / number


def compare(
    subjects: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 21,
    target_ns: int = 20_000_000,
) -> dict[str, float]:
    """The median nanoseconds per call of each of `subjects`, timed in `rounds` alternating rounds."""
    samples = compare_samples(subjects, rounds=rounds, target_ns=target_ns)
    return {name: statistics.median(values) for name, values in samples.items()}


def compare_samples(
    subjects: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 21,
    target_ns: int = 20_000_000,
) -> dict[str, list[float]]:
    """The nanoseconds per call of each of `subjects` in each of `rounds` alternating rounds (a
    round's figures were taken back to back, so their ratio is a same-round ratio).

    Collection is disabled while a batch runs: a collection triggered by one subject's garbage
    would otherwise be billed to whichever subject runs next.
    """
    names = list(subjects)
    numbers = {name: calibrate(subjects[name], target_ns=target_ns) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    enabled = gc.isenabled()
    try:
        for index in range(rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                gc.collect()
                gc.disable()
                try:
                    samples[name].append(_time_batch(subjects[name], numbers[name]))
                finally:
                    if enabled:
                        gc.enable()
    finally:
        if enabled:
            gc.enable()
    return samples


def ratio_row(
    name: str, subject_ns: float, baseline_ns: float, target: float | None = None
) -> tuple[str, ...]:
    """One table row: µs per call of the subject and its baseline, their ratio, and the target."""
    ratio = subject_ns / baseline_ns
    verdict = "" if target is None else (f"≤ {target:g}x: " + ("met" if ratio <= target else "missed"))
    return (name, f"{subject_ns / 1000:.2f}", f"{baseline_ns / 1000:.2f}", f"{ratio:.2f}x", verdict)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """`rows` under `header` as a GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)
