"""The live view of a collection: a rich bar on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import pytest

from gym_failures.cli import _live
from gym_failures.cli._live import counts_text, live_collection
from gym_failures.telemetry import CollectionProgress, RolloutOutcome


def _progress() -> CollectionProgress:
    progress = CollectionProgress(expected=10, already_done=2)
    progress.add(RolloutOutcome("scored", True))
    progress.add(RolloutOutcome("failed", True, "model"))
    progress.add(RolloutOutcome("failed", True, "evaluation"))
    progress.add(RolloutOutcome("failed", False, "evaluation"))
    return progress


def test_the_counts_name_successes_failures_by_class_and_retries() -> None:
    assert counts_text(_progress()) == "1 scored · failed: model 1, evaluation 1 · 1 retried"


def test_without_a_terminal_a_plain_line_goes_out_at_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    with live_collection() as update:
        update(_progress())
        update(_progress())
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1  # within the interval: only the closing line
    assert lines[0].startswith(
        "collecting: 5/10 done · 1 scored · failed: model 1, evaluation 1 · 1 retried · "
    )
    assert " ETA " in lines[0]


def test_the_masked_degraded_and_gate_derived_successes_have_their_own_counts() -> None:
    progress = CollectionProgress(expected=10)
    progress.add(RolloutOutcome("scored", True, degraded=True))
    progress.add(RolloutOutcome("scored", True))
    progress.add(RolloutOutcome("masked", True))
    progress.add(RolloutOutcome("gate_derived", True, "evaluation", "grading_without_verdict"))
    progress.add(RolloutOutcome("failed", True, "model"))
    assert counts_text(progress) == (
        "2 scored (1 degraded) · 1 masked · gate-derived: evaluation 1 · failed: model 1 · 0 retried"
    )


def test_the_live_line_in_docs_telemetry_is_one_the_collector_prints() -> None:
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "telemetry.md").read_text()
    line = next(line for line in docs.splitlines() if line.startswith("collecting: "))
    progress = CollectionProgress(expected=200)
    for _ in range(178):
        progress.add(RolloutOutcome("scored", True))
    for kind, cls, count in (
        ("truncated_answer", "model", 9),
        ("grading_without_verdict", "evaluation", 8),
    ):
        for _ in range(count):
            progress.add(RolloutOutcome("gate_derived", True, cls, kind))
    for cls, count in (("model", 1), ("evaluation", 4)):
        for _ in range(count):
            progress.add(RolloutOutcome("failed", True, cls))
    for _ in range(34):
        progress.add(RolloutOutcome("failed", False, "evaluation"))
    printed = f"collecting: {progress.done}/{progress.expected} done · {counts_text(progress)} · "
    assert line.startswith(printed)


def test_without_a_terminal_lines_go_out_once_per_interval(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_live, "PLAIN_INTERVAL_S", 0.0)
    with live_collection() as update:
        update(_progress())
        update(_progress())
    assert len(capsys.readouterr().err.splitlines()) == 3


def test_on_a_terminal_the_bar_shows_the_counts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich then treats the captured stderr as a terminal
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("COLUMNS", "200")
    with live_collection() as update:
        update(_progress())
    err = capsys.readouterr().err
    assert "5/10" in err
    assert "failed: model 1, evaluation 1" in err
    assert "collecting:" not in err  # no plain line on a terminal
