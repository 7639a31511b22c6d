"""The breaker for fast failures (issue 30): a run whose attempts all fail alike holds dispatch to one
probe at a time, resumes when a probe does not fail so, and ends when its probes do, the rollouts
never tried keeping their budgets.

Against the real test agent (`tests.collection.agent_app`, mode `fail_as`: every attempt fails with
the task's kind at its boundary until the file its `fixed` names exists; the test creates the file
to "fix the model server", from the collector's own progress hook, so nothing races a sleep). One
slot (`concurrency=1`) and no backoff make the order of the attempts exact: a retry before a rollout
not yet tried, a probe a rollout not yet tried first. Waits are read from the collector's clock.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gym_failures.cli._live import counts_text
from gym_failures.collection import BreakerOpen, CollectionConfig, collect, read_rows
from gym_failures.collection._breaker import BREAKER_ATTEMPTS, BREAKER_PROBES
from gym_failures.telemetry import CollectionProgress

ROOT = Path(__file__).resolve().parents[2]


class TestClock:
    """The collector's clock in a test: its sleeps return at once and are recorded."""

    __test__ = False

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def _down(tmp_path: Path, kind: str = "model_server_error", boundary: str = "model") -> dict[str, Any]:
    """A task whose agent fails with `kind` at `boundary` until the test creates `fixed`."""
    return {"mode": "fail_as", "kind": kind, "boundary": boundary, "fixed": str(tmp_path / "fixed")}


def _config(tmp_path: Path, agent_url: str, tasks: list[dict[str, Any]], **options: Any) -> CollectionConfig:
    path = tmp_path / "tasks.jsonl"
    # Each task its own line (an `id`): identical lines would be one task's rollouts.
    path.write_text("".join(json.dumps({**task, "id": index}) + "\n" for index, task in enumerate(tasks)))
    defaults: dict[str, Any] = {
        "concurrency": 1,
        "max_attempts": 3,
        "backoff_initial_s": 0.0,
        "wait_ready_s": 0.0,
    }
    return CollectionConfig(
        input_path=path,
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url=agent_url,
        **{**defaults, **options},
    )


def _failures(config: CollectionConfig) -> list[dict[str, Any]]:
    return list(read_rows(config.failures_path)) if config.failures_path.exists() else []


def _successes(config: CollectionConfig) -> list[dict[str, Any]]:
    return list(read_rows(config.output_path)) if config.output_path.exists() else []


def _fix(tmp_path: Path) -> None:
    (tmp_path / "fixed").touch()


# --- It ends a run that fails alike -------------------------------------------------------------


async def test_the_breaker_ends_a_run_whose_attempts_all_fail_alike_and_the_untried_keep_their_budgets(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [_down(tmp_path)] * 20)
    with pytest.raises(BreakerOpen) as ended:
        await collect(config, clock=TestClock())
    trip = ended.value.trip
    # 3 rollouts spend their 3 attempts, the 10th attempt (rollout 3's first) opens it, then 3 probes,
    # each a rollout not yet tried: 13 attempts, not 20 rollouts' 60.
    assert (trip.failure_kind, trip.boundary, trip.in_a_row, trip.probes) == (
        "model_server_error",
        "model",
        BREAKER_ATTEMPTS + BREAKER_PROBES,
        BREAKER_PROBES,
    )
    assert ended.value.summary.breaker == trip
    assert ended.value.summary.attempts == 13
    assert ended.value.reason == (
        "the breaker opened: 13 attempts in a row failed with model_server_error at the model boundary, "
        "the last 3 of them probes sent one at a time (breaker_attempts 10); 17 rollouts have no final "
        "outcome yet (13 never tried, their budgets whole): collect again once what fails them is fixed"
    )
    rows = _failures(config)
    assert len(rows) == 13
    assert [row["rollout_id"] for row in rows[-3:]] == ["4:0", "5:0", "6:0"], "probes: untried rollouts"
    assert {row["attempt"] for row in rows[-3:]} == {1}, "a probe is a real attempt, counted in its budget"
    assert not any(row["final"] for row in rows[-4:]), "the probed rollouts stay open"
    tried = {row["rollout_id"] for row in rows}
    assert tried == {f"{task}:0" for task in range(7)}, "the 13 others have no row: their budgets whole"

    # The model server is back: the resume sends the untried rollouts at attempt 1, the rest on.
    _fix(tmp_path)
    summary = await collect(config, clock=TestClock())
    assert (summary.succeeded, summary.attempts, summary.breaker) == (17, 17, None)
    attempts = {row["rollout_id"]: row["attempt"] for row in _successes(config)}
    assert {attempts[f"{task}:0"] for task in range(7, 20)} == {1}
    assert [attempts[f"{task}:0"] for task in range(3, 7)] == [2, 2, 2, 2]


async def test_with_many_in_flight_the_run_ends_after_about_n_attempts(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [_down(tmp_path)] * 40, concurrency=4)
    with pytest.raises(BreakerOpen) as ended:
        await collect(config, clock=TestClock())
    # The attempts in flight when it opened come back and count; then one probe at a time.
    attempts = ended.value.summary.attempts
    assert BREAKER_ATTEMPTS + BREAKER_PROBES <= attempts <= BREAKER_ATTEMPTS + 3 + BREAKER_PROBES
    assert ended.value.trip.in_a_row == attempts
    assert len(_failures(config)) == attempts


async def test_each_probe_waits_the_backoff_on_the_collectors_clock(tmp_path: Path, agent_url: str) -> None:
    # One attempt a rollout: no retry backs off, so the clock's sleeps are the probes' waits.
    config = _config(
        tmp_path, agent_url, [_down(tmp_path)] * 20, max_attempts=1, backoff_initial_s=1.0, backoff_max_s=30.0
    )
    clock = TestClock()
    with pytest.raises(BreakerOpen):
        await collect(config, clock=clock)
    assert len(clock.sleeps) == BREAKER_PROBES
    assert all(1.0 <= wait <= 30.0 for wait in clock.sleeps)


async def test_the_breaker_sees_a_transport_failure_when_the_readiness_pause_is_off(tmp_path: Path) -> None:
    # Nothing listens, and no readiness wait (`wait_ready_s` 0): every attempt fails at once, alike.
    from tests.processes import free_port

    config = _config(tmp_path, f"http://127.0.0.1:{free_port()}", [{"mode": "ok"}] * 30)
    with pytest.raises(BreakerOpen) as ended:
        await collect(config, clock=TestClock())
    assert (ended.value.trip.failure_kind, ended.value.trip.boundary) == (
        "transport_unreachable",
        "collection",
    )
    assert ended.value.summary.attempts == BREAKER_ATTEMPTS + BREAKER_PROBES


# --- It resumes when a probe succeeds ------------------------------------------------------------


async def test_a_probe_that_succeeds_resumes_the_run_at_full_concurrency(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [_down(tmp_path)] * 30, concurrency=4)
    shown: list[str] = []

    def fix_when_it_opens(progress: CollectionProgress) -> None:
        if progress.breaker is not None:
            shown.append(counts_text(progress))
            _fix(tmp_path)  # before the probe is let through: the probe finds the model server back

    summary = await collect(config, fix_when_it_opens, clock=TestClock())
    assert shown, "the live line said the breaker was open"
    assert "breaker open: model_server_error at model, probing" in shown[0]
    closed = sum(1 for row in _failures(config) if row["final"])
    assert summary.succeeded == 30 - closed, "every rollout its budget left open scored"
    assert summary.breaker is None


async def test_a_probe_is_a_rollout_of_a_task_the_failures_did_not_come_from(
    tmp_path: Path, agent_url: str
) -> None:
    # 14 rollouts of a broken task, then 14 of a good one: after the broken task's 10th, the next
    # rollouts not yet tried are its own (the probes would fail and end the run); the probe is the
    # good task's first rollout instead, and the run completes.
    config = _config(tmp_path, agent_url, [_down(tmp_path), {"mode": "ok"}], num_repeats=14, max_attempts=1)
    opened: list[str] = []
    summary = await collect(config, lambda progress: opened.extend(filter(None, [progress.breaker])))
    assert opened, "it opened"
    assert (summary.attempts, summary.succeeded, summary.failed_final) == (28, 14, 14)


@pytest.mark.parametrize("broken_first", [True, False], ids=["broken-task-first", "broken-task-last"])
async def test_one_task_that_always_fails_is_no_broken_dependency(
    tmp_path: Path, agent_url: str, broken_first: bool
) -> None:
    # 4 rollouts of one broken task make 12 attempts alike in a row: the breaker opens at the 10th.
    # First in the run, the probe is a rollout of another task, which succeeds: the breaker closes.
    # Last, every open rollout is the broken task's: no probe could tell, the breaker stands down,
    # and the rollouts spend their budgets as without it. Neither ends the run.
    ok: list[dict[str, Any]] = [{"mode": "ok"}] * 5
    tasks = [_down(tmp_path), *ok] if broken_first else [*ok, _down(tmp_path)]
    config = _config(tmp_path, agent_url, tasks, num_repeats=4)
    opened: list[str] = []
    summary = await collect(config, lambda progress: opened.extend(filter(None, [progress.breaker])))
    assert opened, "it opened"
    assert (summary.attempts, summary.succeeded, summary.failed_final) == (32, 20, 4)
    assert {row["attempt"] for row in _failures(config) if row["final"]} == {3}, "every budget spent"


# --- It never trips on a mix ------------------------------------------------------------------


@pytest.mark.parametrize(
    "pair",
    [
        pytest.param(("model_server_error", "model", "model_context_limit", "model"), id="kinds"),
        pytest.param(("model_server_error", "model", "model_server_error", "agent"), id="boundaries"),
    ],
)
async def test_failures_of_two_kinds_or_boundaries_interleaved_never_open_it(
    tmp_path: Path, agent_url: str, pair: tuple[str, str, str, str]
) -> None:
    first, second = _down(tmp_path, *pair[:2]), _down(tmp_path, *pair[2:])
    config = _config(tmp_path, agent_url, [first, second] * 15, max_attempts=1, breaker_attempts=2)
    opened: list[str] = []
    summary = await collect(config, lambda progress: opened.extend(filter(None, [progress.breaker])))
    assert opened == []
    assert (summary.attempts, summary.failed_final) == (30, 30), "every rollout spent its budget"


async def test_a_success_among_the_failures_resets_the_count(tmp_path: Path, agent_url: str) -> None:
    n = 4
    tasks = ([_down(tmp_path)] * (n - 1) + [{"mode": "ok"}]) * 6
    config = _config(tmp_path, agent_url, tasks, max_attempts=1, breaker_attempts=n)
    opened: list[str] = []
    summary = await collect(config, lambda progress: opened.extend(filter(None, [progress.breaker])))
    assert opened == []
    assert (summary.attempts, summary.succeeded, summary.failed_final) == (24, 6, 18)


@pytest.mark.parametrize(("alike", "opens"), [(4, False), (5, True)])
async def test_it_opens_at_n_attempts_alike_and_not_at_n_minus_1(
    tmp_path: Path, agent_url: str, alike: int, opens: bool
) -> None:
    # N = 5: `alike` failures in a row, then rollouts that succeed (the first of them the probe).
    tasks = [_down(tmp_path)] * alike + [{"mode": "ok"}] * 3
    config = _config(tmp_path, agent_url, tasks, max_attempts=1, breaker_attempts=5)
    opened: list[str] = []
    summary = await collect(config, lambda progress: opened.extend(filter(None, [progress.breaker])))
    assert bool(opened) is opens
    assert (summary.attempts, summary.succeeded) == (alike + 3, 3), "the run completes either way"


async def test_a_breaker_of_0_is_off(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [_down(tmp_path)] * 12, breaker_attempts=0)
    summary = await collect(config, clock=TestClock())
    assert (summary.attempts, summary.failed_final) == (36, 12), "every rollout spent its whole budget"


def test_the_breaker_is_a_whole_number_of_at_least_0(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        _config(tmp_path, "http://127.0.0.1:1", [{"mode": "ok"}], breaker_attempts=-1)
    assert _config(tmp_path, "http://127.0.0.1:1", [{"mode": "ok"}]).breaker_attempts == BREAKER_ATTEMPTS


# --- The command -------------------------------------------------------------------------------


def _command(*arguments: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "collect", *map(str, arguments)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_collect_ends_with_exit_1_and_one_line_and_a_resume_after_the_fix_completes(
    tmp_path: Path, agent_url: str
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({**_down(tmp_path), "id": index}) + "\n" for index in range(10)))
    output = tmp_path / "out.jsonl"
    command = (tasks, "--agent-url", agent_url, "--output", output, "--concurrency", 1, "--max-attempts", 2)
    done = _command(*command, "--breaker", 3, "--json")
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith("collecting: ")]
    # Rollout 0 spends its 2 attempts, rollout 1's first opens it, rollouts 2-4 are the probes.
    assert lines == [
        "gym-failures collect: error: the breaker opened: 6 attempts in a row failed with "
        "model_server_error at the model boundary, the last 3 of them probes sent one at a time "
        "(--breaker 3); 9 rollouts have no final outcome yet (5 never tried, their budgets whole): "
        "collect again once what fails them is fixed"
    ]
    figures = json.loads(done.stdout)
    assert figures["breaker"] == {
        "failure_kind": "model_server_error",
        "boundary": "model",
        "in_a_row": 6,
        "probes": 3,
        "breaker_attempts": 3,
    }
    assert figures["attempts"] == 6
    assert {row["rollout_id"] for row in read_rows(tmp_path / "out_failures.jsonl")} == {
        f"{task}:0" for task in range(5)
    }

    _fix(tmp_path)
    again = _command(*command, "--breaker", 3, "--json")
    assert again.returncode == 0, again.stderr
    figures = json.loads(again.stdout)
    assert (figures["succeeded"], figures["breaker"]) == (9, None)
    firsts = {row["rollout_id"] for row in read_rows(output) if row["attempt"] == 1}
    assert firsts == {f"{task}:0" for task in range(5, 10)}, "the untried rollouts at their first attempt"


def test_collect_with_breaker_0_spends_every_budget(tmp_path: Path, agent_url: str) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({**_down(tmp_path), "id": index}) + "\n" for index in range(6)))
    done = _command(
        *(tasks, "--agent-url", agent_url, "--output", tmp_path / "out.jsonl", "--concurrency", 1),
        *("--max-attempts", 2, "--breaker", 0, "--json"),
    )
    assert done.returncode == 1, "no rollout succeeded"
    assert "breaker" not in done.stderr
    figures = json.loads(done.stdout)
    assert (figures["attempts"], figures["failed_final"], figures["breaker"]) == (12, 6, None)


@pytest.mark.parametrize("value", ["-1", "ten"])
def test_collect_refuses_a_breaker_that_is_no_whole_number_of_at_least_0(tmp_path: Path, value: str) -> None:
    done = _command(
        tmp_path / "t.jsonl", "--agent-url", "http://127.0.0.1:1", "--output", "o", "--breaker", value
    )
    assert done.returncode == 2
    assert "--breaker" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_breaker_asked_for_on_ray_is_warned_about(capsys: pytest.CaptureFixture[str]) -> None:
    from argparse import Namespace

    from gym_failures.cli._collect import _defaulted_options

    given: dict[str, object] = {"max_attempts": None, "agent_name": None, "backoff_initial": None}
    given.update(wait_ready=None, min_valid_per_group=None, fill_short_groups=False)
    assert _defaulted_options(Namespace(**given, breaker=5, ray="")) == {"breaker_attempts": 5}
    assert "--breaker has no effect with --ray" in capsys.readouterr().err
    assert _defaulted_options(Namespace(**given, breaker=None, ray="")) == {}
    assert capsys.readouterr().err == "", "the default is no request: nothing to warn about"


def test_the_live_view_says_when_the_breaker_holds_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from gym_failures.cli import _live as live

    assert "breaker open: model_server_error at model, probing" in counts_text(
        CollectionProgress(breaker="model_server_error at model")
    )
    assert "breaker" not in counts_text(CollectionProgress())
    monkeypatch.setattr(live, "PLAIN_INTERVAL_S", 1e9)  # no line for the interval's sake
    stream = io.StringIO()
    with live._plain_lines(stream) as update:
        update(CollectionProgress(expected=4))
        assert stream.getvalue() == ""
        update(CollectionProgress(expected=4, breaker="model_server_error at model"))
        assert "breaker open: model_server_error at model, probing" in stream.getvalue(), "said when it opens"
        update(CollectionProgress(expected=4, breaker="model_server_error at model"))
        assert len(stream.getvalue().splitlines()) == 1, "once"
