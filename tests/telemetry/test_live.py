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
