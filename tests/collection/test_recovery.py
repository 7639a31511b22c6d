"""A collector that recovers (issue 21): backoff between a rollout's attempts, the server's hints
honoured, a readiness wait, no retry storm, and a raised budget reopening closed rollouts.

Against real agent processes (`tests.collection.agent_app`). Waits are read from the collector's own
clock (`TestClock`: its sleeps return at once and are recorded) and asserted as lower bounds, never as
at most a time; the few tests that need the real clock wait well under a second on it, or for an
agent process to start.
"""

from __future__ import annotations

import asyncio
import email.utils
import io
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gym_failures.cli import _live as live
from gym_failures.cli._live import counts_text
from gym_failures.collection import AgentDown, CollectionConfig, collect, read_rows
from gym_failures.collection._pacing import READY_PROBE_INTERVAL_S, TRANSPORT_RUN, Backoff, wait_ready
from gym_failures.failure_kinds import TRANSPORT_UNREACHABLE
from gym_failures.telemetry import CollectionProgress
from tests.processes import free_port, stop, wait_listening

ROOT = Path(__file__).resolve().parents[2]


class TestClock:
    """The collector's clock in a test: time moves only by what it is asked to sleep."""

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


class HeldClock(TestClock):
    """A clock whose backoff sleeps (over 0.5 s) wait until the test lets them end."""

    __test__ = False

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.held = 0

    async def sleep(self, seconds: float) -> None:
        if seconds > READY_PROBE_INTERVAL_S:
            self.held += 1
            await self.release.wait()
        await super().sleep(seconds)


def _config(tmp_path: Path, agent_url: str, tasks: list[dict[str, Any]], **options: Any) -> CollectionConfig:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    defaults: dict[str, Any] = {"backoff_initial_s": 1.0, "backoff_max_s": 30.0, "wait_ready_s": 5.0}
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


@pytest.fixture
def late_agent() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """An agent process that listens only after 1.5 s, as one still starting does."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.collection.agent_app", str(port), "1.5"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        stop(process)


def _agent(port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.collection.agent_app", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(port, process)
    return process


# --- Backoff -----------------------------------------------------------------------------------


async def test_a_retried_rollout_backs_off_and_the_row_says_how_long(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "always_fail"}], max_attempts=5)
    clock = TestClock()
    await collect(config, clock=clock)
    rows = _failures(config)
    assert [row["attempt"] for row in rows] == [1, 2, 3, 4, 5]
    waits = [row["_gf_retry_wait_s"] for row in rows[:-1]]
    assert [row["_gf_retry_wait_from"] for row in rows[:-1]] == ["backoff"] * 4
    assert "_gf_retry_wait_s" not in rows[-1], "a final row has no next attempt"
    assert all(1.0 <= wait <= 30.0 for wait in waits)
    for before, after in itertools.pairwise(waits):
        assert after <= 3 * before + 0.001, "decorrelated jitter: at most three times the last wait"
    assert sorted(clock.sleeps) == sorted(waits), "the clock slept each wait the rows say"


def test_the_backoff_is_bounded_at_its_cap_and_at_least_its_first_wait() -> None:
    backoff = Backoff(initial=1.0, cap=30.0)
    waits = [backoff.wait("0:0") for _ in range(200)]
    assert all(1.0 <= wait <= 30.0 for wait in waits)
    assert max(waits) == 30.0, "the cap is reached"
    assert Backoff(initial=0.0, cap=30.0).wait("0:0") == 0.0, "0 retries at once"
    assert Backoff(initial=30.0, cap=30.0).wait("0:0") == 30.0, "at the bound"


async def test_a_rollout_backing_off_holds_no_slot(tmp_path: Path, agent_url: str) -> None:
    tasks = [{"mode": "always_fail"}, {"mode": "ok"}, {"mode": "ok"}, {"mode": "ok"}]
    config = _config(tmp_path, agent_url, tasks, concurrency=1, max_attempts=2)
    clock = HeldClock()
    progress: list[CollectionProgress] = []
    running = asyncio.create_task(collect(config, progress.append, clock=clock))
    while not (clock.held and progress and progress[-1].succeeded == 3):
        assert not running.done()
        await asyncio.sleep(0.01)
    # One slot, and the failed rollout is still waiting: the other three ran in it meanwhile.
    assert progress[-1].backing_off == 1
    assert "1 backing off" in counts_text(progress[-1])
    clock.release.set()
    summary = await running
    assert (summary.succeeded, summary.failed_final, summary.attempts) == (3, 1, 5)


async def test_a_wait_of_0_retries_at_once(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "always_fail"}], max_attempts=3, backoff_initial_s=0)
    clock = TestClock()
    await collect(config, clock=clock)
    assert [row["_gf_retry_wait_s"] for row in _failures(config)[:-1]] == [0.0, 0.0]
    assert clock.sleeps == []


# --- Server hints ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        ({"retry_after": "7", "status": 429}, 7.0),
        ({"retry_after": "4", "status": 503}, 4.0),
        ({"retry_after_ms": "2500", "retry_after": "9"}, 2.5),
        ({"retry_after": "100000"}, 120.0),  # past the bound: the bound
        ({"retry_after": "120"}, 120.0),  # at the bound
    ],
)
async def test_a_retry_after_takes_the_place_of_the_backoff_within_its_bound(
    tmp_path: Path, agent_url: str, hint: dict[str, Any], expected: float
) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "shed_then_ok", **hint}], retry_after_max_s=120)
    clock = TestClock()
    summary = await collect(config, clock=clock)
    (row,) = _failures(config)
    assert (row["_gf_retry_wait_s"], row["_gf_retry_wait_from"]) == (expected, "retry_after")
    assert clock.sleeps == [expected]
    assert summary.succeeded == 1


async def test_a_retry_after_as_an_http_date_is_honoured(tmp_path: Path, agent_url: str) -> None:
    sent = time.time()
    when = email.utils.formatdate(sent + 60, usegmt=True)  # whole seconds: up to 1 s earlier
    config = _config(tmp_path, agent_url, [{"mode": "shed_then_ok", "retry_after": when}])
    await collect(config, clock=TestClock())
    done = time.time()
    (row,) = _failures(config)
    assert row["_gf_retry_wait_from"] == "retry_after"
    # The date less the wall clock when the reply was read, some time between `sent` and `done`:
    # bounds from the test's own clock readings, however long the run took.
    assert sent + 59 - done - 0.01 <= row["_gf_retry_wait_s"] <= 60


async def test_a_quota_reset_in_the_agents_failure_is_waited_for_within_the_bound(
    tmp_path: Path, agent_url: str
) -> None:
    soon = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() + 600))
    config = _config(
        tmp_path, agent_url, [{"mode": "quota_then_ok", "resets_at": soon}], retry_after_max_s=90
    )
    await collect(config, clock=TestClock())
    (row,) = _failures(config)
    assert (row["_gf_retry_wait_s"], row["_gf_retry_wait_from"]) == (90.0, "retry_after")


async def test_a_retry_after_is_waited_on_the_real_clock(tmp_path: Path, agent_url: str) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "shed_then_ok", "retry_after_ms": "400"}])
    started = time.monotonic()
    summary = await collect(config)
    assert time.monotonic() - started >= 0.4
    assert summary.succeeded == 1


# --- Readiness ---------------------------------------------------------------------------------


async def test_an_agent_still_starting_costs_no_attempt(
    tmp_path: Path, late_agent: tuple[str, subprocess.Popen[bytes]]
) -> None:
    url, _ = late_agent
    config = _config(tmp_path, url, [{"mode": "ok"}] * 6, wait_ready_s=60, num_repeats=2)
    progress: list[float | None] = []
    summary = await collect(config, lambda seen: progress.append(seen.agent_wait_s))
    assert (summary.succeeded, summary.attempts) == (12, 12), "every rollout scored at its first attempt"
    assert _failures(config) == []
    assert any(wait is not None for wait in progress), "the live view showed the wait"
    assert progress[-1] is None


# Times a readiness wait starts at (a sum of random backoffs, on the test's clock) at which the wait
# once never ended: it slept `wait_ready_s - waited`, `waited` rounded, and near the deadline that
# remainder (8.9e-16 s) was half a unit in the last place of the clock's time, so the clock stayed where
# it was and the wait probed for ever (a test hung on it 1 run in 3). Found by replaying that arithmetic.
STARTS_THAT_HUNG = [3.2, 4.31, 6.06, 7.36]


class BoundedClock(TestClock):
    """A test clock that fails the test, rather than hang it, when it is asked to sleep past `limit`
    times: what a wait that never ends does."""

    __test__ = False

    def __init__(self, now: float = 0.0, limit: int = 1000) -> None:
        super().__init__()
        self.now = now
        self.limit = limit

    async def sleep(self, seconds: float) -> None:
        assert len(self.sleeps) < self.limit, f"slept {self.limit} times; the clock reads {self.now!r}"
        await super().sleep(seconds)


@pytest.mark.parametrize("start", [0.0, *STARTS_THAT_HUNG])
async def test_the_readiness_wait_ends_at_its_deadline_whatever_time_the_clock_starts_at(
    start: float,
) -> None:
    clock = BoundedClock(start)
    probes = 0

    async def refused() -> bool:
        nonlocal probes
        probes += 1
        return False

    assert not await wait_ready(refused, clock, 5.0)
    assert clock.now >= start + 5.0, "it waited the whole bound"
    assert probes <= math.ceil(5.0 / READY_PROBE_INTERVAL_S) + 2


@pytest.mark.parametrize("start", STARTS_THAT_HUNG)
async def test_an_agent_down_ends_the_run_whatever_time_the_clock_starts_at(
    tmp_path: Path, start: float
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    config = _config(tmp_path, url, [{"mode": "ok"}] * 2, wait_ready_s=5)  # speed-ok: on the test's own clock
    clock = BoundedClock(start)
    with pytest.raises(AgentDown):
        await collect(config, clock=clock)
    assert clock.now >= start + 5.0, "it waited the whole bound"


async def test_a_fault_of_the_readiness_probe_ends_the_run_rather_than_leaving_it_paused(
    tmp_path: Path,
) -> None:
    """The probe's wait runs beside the paused workers: when it fails, the run must end with its
    error, or the workers would wait for a resume that never comes."""

    class BrokenClock(TestClock):
        __test__ = False

        def monotonic(self) -> float:
            raise RuntimeError("the clock broke")

    url = f"http://127.0.0.1:{free_port()}"
    config = _config(tmp_path, url, [{"mode": "ok"}] * 2, wait_ready_s=5)  # speed-ok: on the test's own clock
    run = asyncio.ensure_future(collect(config, clock=BrokenClock()))
    # No wait on the real clock: the probe's wait reads the clock before it probes, so the run
    # has no I/O in flight when it fails, and ends within a bounded number of turns of the event
    # loop (a run left paused never ends).
    for _ in range(10_000):
        if run.done():
            break
        await asyncio.sleep(0)
    else:
        run.cancel()
    assert run.done(), "the run stayed paused after its probe failed"
    assert not run.cancelled(), "the run stayed paused after its probe failed"
    with pytest.raises(RuntimeError, match="the clock broke"):
        run.result()
    assert _failures(config) == [], "no attempt was spent"


async def test_an_agent_down_for_good_ends_the_run_with_every_budget_kept(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    config = _config(tmp_path, url, [{"mode": "ok"}] * 5, wait_ready_s=5)  # speed-ok: on the TestClock
    clock = TestClock()
    with pytest.raises(AgentDown) as ended:
        await collect(config, clock=clock)
    assert ended.value.failure_kind == TRANSPORT_UNREACHABLE
    assert "within 5 s" in ended.value.failure_reason
    assert "5 never tried" in ended.value.failure_reason
    assert sum(clock.sleeps) >= 5.0, "it waited the whole bound"
    assert _failures(config) == [], "no attempt was spent"


async def test_a_run_of_transport_failures_pauses_dispatch_and_the_rollouts_not_tried_keep_their_budget(
    tmp_path: Path,
) -> None:
    port = free_port()
    agent = _agent(port)
    config = _config(tmp_path, f"http://127.0.0.1:{port}", [{"mode": "ok"}] * 10, concurrency=1)

    def kill_after_the_first(progress: CollectionProgress) -> None:
        if progress.succeeded == 1 and agent.poll() is None:
            agent.kill()
            agent.wait()

    try:
        with pytest.raises(AgentDown):
            await collect(config, kill_after_the_first, clock=TestClock())
        failures = _failures(config)
        assert len(_successes(config)) == 1
        # The run of failures paused dispatch: no storm. (A kept-alive connection to the killed agent
        # may fail first as a dropped one, another kind, before the refused ones make the run.)
        assert TRANSPORT_RUN <= len(failures) <= TRANSPORT_RUN + 1
        kinds = [row["failure"]["failure_kind"] for row in failures]
        assert kinds[-TRANSPORT_RUN:] == [TRANSPORT_UNREACHABLE] * TRANSPORT_RUN
        tried = {row["rollout_id"] for row in _successes(config) + failures}
        assert len(tried) <= 1 + TRANSPORT_RUN
        # The agent is back: the resume scores every rollout, the ones never tried at their first attempt.
        agent = _agent(port)
        summary = await collect(config, clock=TestClock())
        assert summary.succeeded == 9
        firsts = [row for row in _successes(config) if row["rollout_id"] not in tried]
        assert len(firsts) == 10 - len(tried)
        assert {row["attempt"] for row in firsts} == {1}
    finally:
        stop(agent)


async def test_an_agent_that_goes_down_and_comes_back_within_the_wait_scores_every_rollout(
    tmp_path: Path,
) -> None:
    port = free_port()
    agents = [_agent(port)]
    config = _config(
        tmp_path,
        f"http://127.0.0.1:{port}",
        [{"mode": "ok"}] * 12,
        concurrency=2,
        wait_ready_s=60,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )
    waited: list[float] = []

    def restart() -> None:
        time.sleep(1.0)
        agents.append(_agent(port))

    def kill_after_the_first(progress: CollectionProgress) -> None:
        if progress.agent_wait_s is not None:
            waited.append(progress.agent_wait_s)
        if progress.succeeded == 1 and len(agents) == 1 and agents[0].poll() is None:
            agents[0].kill()
            agents[0].wait()
            threading.Thread(target=restart, daemon=True).start()

    try:
        summary = await collect(config, kill_after_the_first)
        assert summary.succeeded == 12, "every rollout scored"
        # The run of failures paused dispatch, whatever the order: the 2 slots' connections to the
        # killed agent fail as dropped (another kind) at most twice, breaking the run of refused ones at
        # most twice, and one attempt is in flight when it pauses; not an attempt of every rollout.
        assert len(_failures(config)) <= 3 * TRANSPORT_RUN + 1 < 12
        assert waited, "dispatch waited for the agent to come back"
    finally:
        for agent in agents:
            stop(agent)


async def test_transport_failures_with_the_agent_up_pause_only_for_a_probe(
    tmp_path: Path, agent_url: str
) -> None:
    tasks = [{"mode": "ok", "sleep": 2}] * 2
    # speed-ok: fires: the agent holds each reply 2 s, 10 times the timeout
    config = _config(tmp_path, agent_url, tasks, concurrency=1, max_attempts=2, timeout_s=0.2)
    summary = await collect(config, clock=TestClock())
    assert summary.attempts == 4 > TRANSPORT_RUN, (
        "the agent accepts connections: every budget is used, none burned early"
    )


async def test_a_wait_ready_of_0_dispatches_at_once(tmp_path: Path) -> None:
    # speed-ok: 0 is no wait at all (the subject), on the TestClock
    config = _config(tmp_path, f"http://127.0.0.1:{free_port()}", [{"mode": "ok"}], wait_ready_s=0)
    summary = await collect(config, clock=TestClock())
    assert summary.attempts == 3


# --- Reopening ---------------------------------------------------------------------------------


async def test_a_raised_budget_reopens_the_rollouts_it_closed(tmp_path: Path, agent_url: str) -> None:
    tasks = [{"mode": "always_fail"}, {"mode": "terminal"}, {"mode": "ok"}]
    config = _config(tmp_path, agent_url, tasks, max_attempts=2, backoff_initial_s=0)
    await collect(config)
    again = await collect(config.model_copy(update={"max_attempts": 4}))
    assert (again.reopened, again.already_done, again.attempts) == (1, 2, 2)
    rows = [row for row in _failures(config) if row["rollout_id"] == "0:0"]
    assert [row["attempt"] for row in rows] == [1, 2, 3, 4], "its attempt numbers continue"
    assert rows[-1]["final_reason"] == "attempt_budget_exhausted"
    same = await collect(config.model_copy(update={"max_attempts": 4}))
    assert (same.reopened, same.attempts) == (0, 0), "at the same budget nothing reopens"


async def test_a_terminal_failure_is_reopened_only_with_retry_terminal(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "terminal"}], max_attempts=2)
    await collect(config)
    assert (await collect(config.model_copy(update={"max_attempts": 3}))).attempts == 0
    again = await collect(config.model_copy(update={"max_attempts": 3, "retry_terminal": True}))
    assert (again.reopened, again.attempts) == (1, 1)
    assert [row["attempt"] for row in _failures(config)] == [1, 2]


def test_the_live_view_counts_the_reopened_rollouts_and_the_wait_for_the_agent() -> None:
    progress = CollectionProgress(reopened=3, agent_wait_s=12.4)
    assert "3 reopened" in counts_text(progress)
    assert "waiting for the agent 12 s" in counts_text(progress)


@pytest.mark.parametrize("field", ["backoff_initial_s", "backoff_max_s", "retry_after_max_s", "wait_ready_s"])
@pytest.mark.parametrize("value", [-0.001, math.inf, math.nan])
def test_a_wait_is_a_finite_number_of_seconds_of_at_least_0(tmp_path: Path, field: str, value: float) -> None:
    with pytest.raises(ValidationError) as refused:
        _config(tmp_path, "http://127.0.0.1:1", [{"mode": "ok"}], **{field: value})
    assert [error["loc"] for error in refused.value.errors()] == [(field,)]
    assert getattr(_config(tmp_path, "http://127.0.0.1:1", [{"mode": "ok"}], **{field: 0.0}), field) == 0.0


def test_a_default_from_the_environment_that_is_no_number_of_seconds_is_warned_and_not_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GYM_FAILURES_WAIT_READY_S", "nan")
    monkeypatch.setenv("GYM_FAILURES_BACKOFF_INITIAL_S", "2.5")
    config = CollectionConfig(input_path=Path("t.jsonl"), output_path=Path("o.jsonl"), agent_url="http://h")
    assert (config.wait_ready_s, config.backoff_initial_s) == (60.0, 2.5)
    assert "GYM_FAILURES_WAIT_READY_S='nan' is not a number of seconds; using 60" in caplog.text


# --- The command -------------------------------------------------------------------------------


def _command(*arguments: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "collect", *map(str, arguments)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("rollouts", "said"),
    [
        (2, "2 rollouts have no final outcome yet (2 never tried, their budgets whole)"),
        (1, "1 rollout has no final outcome yet (1 never tried, its budget whole)"),
    ],
)
def test_collect_ends_with_exit_1_and_one_line_when_the_agent_stays_down(
    tmp_path: Path, rollouts: int, said: str
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"mode": "ok"}\n' * rollouts)
    url = f"http://127.0.0.1:{free_port()}"
    done = _command(tasks, "--agent-url", url, "--output", tmp_path / "out.jsonl", "--wait-ready", "0.5")
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if not line.startswith("collecting: ")]
    assert lines == [
        f"gym-failures collect: error: the agent at {url} accepted no connection within 0.5 s "
        f"(--wait-ready); {said}: collect again once it is up"
    ]
    assert not (tmp_path / "out_failures.jsonl").read_text()


def test_the_line_that_ends_a_run_never_shows_the_agent_urls_credentials(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"mode": "ok"}\n')
    url = f"http://user:Zq9UrlPassword@127.0.0.1:{free_port()}/?token=Zq9UrlQueryToken"
    done = _command(tasks, "--agent-url", url, "--output", tmp_path / "out.jsonl", "--wait-ready", "0.2")
    assert done.returncode == 1
    assert "accepted no connection" in done.stderr
    for secret in ("Zq9UrlPassword", "Zq9UrlQueryToken"):
        assert secret not in done.stdout + done.stderr


def test_a_log_says_at_once_that_dispatch_waits_for_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "PLAIN_INTERVAL_S", 1e9)  # no line for the interval's sake
    stream = io.StringIO()
    with live._plain_lines(stream) as update:
        update(CollectionProgress(expected=4))
        assert stream.getvalue() == "", "not a line on every change"
        update(CollectionProgress(expected=4, agent_wait_s=0.5))
        assert "waiting for the agent 0 s" in stream.getvalue(), "said when the wait starts"
        update(CollectionProgress(expected=4, agent_wait_s=1.0))
        assert len(stream.getvalue().splitlines()) == 1, "once"


def test_collect_reports_how_many_rollouts_it_reopened(tmp_path: Path, agent_url: str) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"mode": "always_fail"}\n{"mode": "ok"}\n')
    command = (tasks, "--agent-url", agent_url, "--output", tmp_path / "out.jsonl", "--json")
    assert _command(*command, "--max-attempts", "1").returncode == 0
    done = _command(*command, "--max-attempts", "3", "--retry-terminal")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert (figures["reopened"], figures["attempts"]) == (1, 2)


@pytest.mark.parametrize("value", ["-1", "inf", "nan", "soon"])
def test_collect_refuses_a_wait_that_is_no_finite_number_of_seconds(tmp_path: Path, value: str) -> None:
    done = _command(
        tmp_path / "t.jsonl", "--agent-url", "http://127.0.0.1:1", "--output", "o", "--wait-ready", value
    )
    assert done.returncode == 2
    assert "--wait-ready" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_kill_during_a_backoff_wait_loses_and_duplicates_nothing(tmp_path: Path, agent_url: str) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"mode": "retry_then_ok"}\n{"mode": "ok"}\n')
    output = tmp_path / "out.jsonl"
    failures = tmp_path / "out_failures.jsonl"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "gym_failures.cli", "collect", str(tasks), "--agent-url", agent_url),
            *("--output", str(output), "--backoff-initial", "60", "--backoff-max", "60"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not (failures.exists() and failures.read_text().strip()):
            assert process.poll() is None, "it ended before its first failure was saved"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)  # waiting out its 60 s backoff
        process.wait(timeout=10)
    finally:
        stop(process)
    (waiting,) = list(read_rows(failures))
    assert waiting["_gf_retry_wait_s"] == 60.0
    done = _command(tasks, "--agent-url", agent_url, "--output", output, "--backoff-initial", "0", "--json")
    assert done.returncode == 0, done.stderr
    rows = list(read_rows(output))
    assert sorted((row["rollout_id"], row["attempt"]) for row in rows) == [("0:0", 2), ("1:0", 1)]
    assert len(list(read_rows(failures))) == 1
