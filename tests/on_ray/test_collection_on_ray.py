"""Collection on a real local Ray against the real agent server: the rows a local run saves, nothing
lost when a worker or the driver dies, resume across Ray and local runs, and Ctrl-C leaves no Ray."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from gym_failures.collection import CollectionConfig, RowWriter, collect
from gym_failures.collection._attempt_row import AttemptRow
from gym_failures.collection._schedule import Retry
from gym_failures.failures import CollectionFailure
from gym_failures.ray import RayCollector, collect_on_ray
from tests.collection.test_recovery import TestClock
from tests.on_ray.saved import Held, assert_whole, gone, pid_of, plan_of, rows_of, until

pytestmark = pytest.mark.usefixtures("ray_address")

ROOT = Path(__file__).resolve().parents[2]
MODES = ("ok", "retry_then_ok", "always_fail", "terminal", "raise", "garbage", "masked")


def _config(directory: Path, agent_url: str, tasks: list[dict[str, Any]], **options: Any) -> CollectionConfig:
    directory.mkdir(parents=True, exist_ok=True)
    tasks_path = directory.parent / "tasks.jsonl"
    if not tasks_path.exists():
        tasks_path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return CollectionConfig(
        input_path=tasks_path,
        output_path=directory / "rollouts.jsonl",
        agent_url=agent_url,
        **{"concurrency": 4, "max_attempts": 3, **options},
    )


async def test_a_ray_run_saves_the_rows_a_local_run_saves(tmp_path: Path, agent_url: str) -> None:
    tasks = [{"mode": MODES[index % len(MODES)]} for index in range(21)]
    local = _config(tmp_path / "local", agent_url, tasks)
    on_ray = _config(tmp_path / "ray", agent_url, tasks)
    local_summary = await collect(local)
    ray_summary = await collect_on_ray(on_ray, workers=2)
    assert plan_of(rows_of(on_ray)) == plan_of(rows_of(local))
    assert ray_summary.attempts == local_summary.attempts
    assert (ray_summary.succeeded, ray_summary.failed_final) == (
        local_summary.succeeded,
        local_summary.failed_final,
    )
    manifest = json.loads(on_ray.manifest_path.read_text())
    assert manifest["expected_rollouts"] == 21
    assert ray.get_runtime_context() is not None, "the session's Ray is left running"


async def test_a_retried_rollout_backs_off_on_ray_too(tmp_path: Path, agent_url: str) -> None:
    tasks = [{"mode": "always_fail"}, {"mode": "shed_then_ok", "retry_after": "7"}, {"mode": "ok"}]
    config = _config(tmp_path / "ray", agent_url, tasks, backoff_initial_s=1.0, backoff_max_s=30.0)
    clock = TestClock()
    summary = await collect_on_ray(config, workers=1, clock=clock)
    assert (summary.succeeded, summary.failed_final, summary.attempts) == (2, 1, 6)
    retried = [row for row in rows_of(config) if "failure" in row and not row["final"]]
    waits = sorted(
        (row["rollout_id"], row["_gf_retry_wait_from"], row["_gf_retry_wait_s"]) for row in retried
    )
    assert [(key, source) for key, source, _ in waits] == [("0:0", "backoff")] * 2 + [("1:0", "retry_after")]
    assert waits[2][2] == 7.0
    assert all(wait >= 1.0 for _, _, wait in waits[:2])
    assert sorted(clock.sleeps) == sorted(wait for *_, wait in waits), "the driver waited each wait"


def _report(command: str, directory: Path) -> tuple[int, Any]:
    """`gym-failures <command> --json DIRECTORY` run for real: its exit status and its document."""
    done = subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", command, "--json", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    return done.returncode, json.loads(done.stdout)


async def test_summarize_and_gate_read_a_ray_run_as_a_local_one(tmp_path: Path, agent_url: str) -> None:
    tasks = [{"mode": MODES[index % len(MODES)]} for index in range(14)]
    local = _config(tmp_path / "local", agent_url, tasks)
    on_ray = _config(tmp_path / "ray", agent_url, tasks)
    await collect(local)
    await collect_on_ray(on_ray, workers=2)
    for config in (local, on_ray):
        _forget_durations(config)
    for command in ("summarize", "gate"):
        ray_status, ray_document = _report(command, on_ray.output_path.parent)
        local_status, local_document = _report(command, local.output_path.parent)
        assert ray_status == local_status
        assert _without_paths(ray_document) == _without_paths(local_document)


def _forget_durations(config: CollectionConfig) -> None:
    """Take `_gf_duration_s` out of the run's rows, after checking that every row has one (measured on
    the worker as locally): an attempt's duration is a measurement, never the same in two runs, and a
    summary of durations (and an order by them) would differ for that alone."""
    for path in (config.output_path, config.failures_path):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert all(row.pop("_gf_duration_s") >= 0 for row in rows)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _without_paths(document: Any) -> Any:
    """`document` without the values that name where the run is (its files, its directory)."""
    if isinstance(document, dict):
        return {key: _without_paths(value) for key, value in document.items() if "path" not in key}
    if isinstance(document, list):
        return [_without_paths(value) for value in document]
    if isinstance(document, str) and ("/local/" in document or "/ray/" in document):
        return "<path>"
    return document


async def test_a_worker_killed_mid_run_loses_nothing(tmp_path: Path, agent_url: str) -> None:
    # The rollouts after the first eight hold their replies until the killed worker is gone; the kill
    # comes once each worker runs four of them (`Held`): the worker killed dies with attempts in hand,
    # however fast the run goes and whichever worker came up first.
    held = Held(tmp_path / "held")
    tasks = [held.task(mode="ok", sleep=0.3) if i >= 8 else {"mode": "ok", "sleep": 0.3} for i in range(24)]
    config = _config(tmp_path / "out", agent_url, tasks)
    collector = RayCollector(config, workers=2)

    async def kill_a_worker() -> None:
        try:
            await held.running(2 * 4)
            pid = await pid_of(collector.workers[0])
            # Ray restarts it (the collector asks for restarts); its attempts in flight are lost.
            ray.kill(collector.workers[0], no_restart=False)
            await until(lambda: gone(pid), "the killed worker's process ends")
        finally:
            held.release()

    killer = asyncio.create_task(kill_a_worker())
    summary = await collector.run()
    await killer
    rows = assert_whole(config, 24)
    lost = [
        row for row in rows if (row.get("failure") or {}).get("failure_kind") == "collection_dispatch_failed"
    ]
    assert lost, "the kill landed while attempts were in flight"
    assert summary.dispatch_errors == len(lost)
    for row in lost:
        assert row["final"] is False
        assert row["rollout_failure"]["delivery"] == "possibly_delivered"
        assert row["rollout_failure"]["source"] == "collector"
    assert summary.succeeded == 24


class _KillsBetweenExchanges(RayCollector):
    """Kills its first worker (Ray restarts it) while saving the run's first row: between two
    exchanges with the worker that sent it. Then it lets the held attempts answer."""

    killed = False
    held: Held
    pid = 0
    """The first worker's process id, asked before the first row can come."""

    def record_attempt(self, outcome: AttemptRow, successes: RowWriter, failures: RowWriter) -> Retry | None:
        if not self.killed:
            self.killed = True
            ray.kill(self.workers[0], no_restart=False)
            # The next exchange then finds the worker dead or already restarted.
            deadline = time.monotonic() + 60  # a hang guard
            while not gone(self.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.held.release()
        return super().record_attempt(outcome, successes, failures)


async def test_a_worker_restarted_between_exchanges_loses_nothing(tmp_path: Path, agent_url: str) -> None:
    # Every reply is held (`Held`). Once each worker runs four attempts, the first rollout's reply
    # alone is let go: the run's first row comes while each worker holds three attempts or more that
    # cannot have answered, so the worker killed had attempts in hand, whichever came up first.
    held, first = Held(tmp_path / "held"), tmp_path / "first"
    tasks = [held.task(mode="ok") for _ in range(24)]
    tasks[0]["until"] = str(first)  # the first worker up runs it first (its slots are taken in order)
    config = _config(tmp_path / "out", agent_url, tasks)
    collector = _KillsBetweenExchanges(config, workers=2)
    collector.held = held

    async def let_the_first_go() -> None:
        await held.running(2 * 4)
        collector.pid = await pid_of(collector.workers[0])
        first.touch()

    try:
        opener = asyncio.create_task(let_the_first_go())
        summary = await asyncio.wait_for(collector.run(), 60)
        await opener
    finally:
        held.release()
    assert collector.killed
    assert_whole(config, 24)
    assert summary.succeeded == 24
    assert summary.dispatch_errors >= 1, "the attempts the first worker held were recorded as lost"


async def test_a_worker_gone_for_good_hands_its_rollouts_to_the_others(
    tmp_path: Path, agent_url: str
) -> None:
    # The rollouts after the first eight hold their replies until the worker is gone, which comes
    # once each worker runs four of them (`Held`): it dies with attempts in hand however fast the run
    # goes, and whichever worker came up first.
    held = Held(tmp_path / "held")
    tasks = [held.task(mode="ok", sleep=0.2) if i >= 8 else {"mode": "ok", "sleep": 0.2} for i in range(24)]
    config = _config(tmp_path / "out", agent_url, tasks)
    collector = RayCollector(config, workers=2)

    async def end_a_worker() -> None:
        try:
            await held.running(2 * 4)
            pid = await pid_of(collector.workers[0])
            ray.kill(collector.workers[0], no_restart=True)
            await until(lambda: gone(pid), "the killed worker's process ends")
        finally:
            held.release()

    killer = asyncio.create_task(end_a_worker())
    summary = await collector.run()
    await killer
    assert_whole(config, 24)
    assert summary.dispatch_errors >= 1
    assert summary.succeeded == 24


async def test_every_worker_gone_ends_the_run_and_a_resume_finishes_it(
    tmp_path: Path, agent_url: str
) -> None:
    # The rollouts after the first eight hold their replies until the run has ended: it cannot end
    # before the workers are gone (`Held`).
    held = Held(tmp_path / "held")
    tasks = [held.task(mode="ok", sleep=0.2) if i >= 8 else {"mode": "ok", "sleep": 0.2} for i in range(24)]
    config = _config(tmp_path / "out", agent_url, tasks, max_attempts=5)
    collector = RayCollector(config, workers=2)

    async def end_every_worker() -> None:
        await held.running(2 * 4)
        for worker in collector.workers:
            ray.kill(worker, no_restart=True)

    killer = asyncio.create_task(end_every_worker())
    try:
        with pytest.raises(CollectionFailure, match="every Ray worker was lost") as ended:
            await collector.run()
        await killer
    finally:
        held.release()
    assert ended.value.failure_kind == "collection_dispatch_failed"
    before = rows_of(config)
    assert len(before) < 24 + 2 * 5, "the run ended early"
    await collect(config)
    rows = assert_whole(config, 24)
    assert all(row in rows for row in before), "no row is lost"


async def test_workers_ray_cannot_place_end_the_run_with_a_clear_failure(
    tmp_path: Path, agent_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's Ray has two CPUs and each worker asks one: a third never starts. The two that
    start work meanwhile; when the start window closes the run sends no more attempts, saves those
    in flight and ends, and a resume with two workers finishes it.

    The window runs on the test's own clock, not a real one (which would make the test depend on how
    fast Ray starts a worker here): it closes once the two placeable workers are up and have worked.
    The third is impossible by construction (no CPU is left for it), not by a deadline."""
    from gym_failures.ray import _collect

    # The rollouts after the first eight hold their replies until the window closes: the run cannot
    # be done by then, however fast it goes (`Held`); the attempts in flight then answer.
    held = Held(tmp_path / "held")

    async def window(self: RayCollector, up: list[asyncio.Future[Any]]) -> set[asyncio.Future[Any]]:
        while sum(started.done() for started in up) < 2 or self.progress.attempts < 1:
            await asyncio.sleep(0.01)
        held.release()
        return {started for started in up if not started.done()}

    monkeypatch.setattr(_collect.RayCollector, "_start_window", window)
    tasks = [held.task(mode="ok", sleep=0.4) if i >= 8 else {"mode": "ok", "sleep": 0.4} for i in range(56)]
    config = _config(tmp_path / "long" / "out", agent_url, tasks, timeout_s=60)
    with pytest.raises(CollectionFailure, match=r"1 of 3 Ray workers did not start within 60 s") as ended:
        await collect_on_ray(config, workers=3)
    assert ended.value.failure_kind == "collection_dispatch_failed"
    assert "collect again with fewer workers" in ended.value.failure_reason
    before = rows_of(config)
    assert 0 < len(before) < 56, "the started workers worked until the window closed, and the run then ended"
    assert all("failure" not in row for row in before), "the attempts in flight were saved, not cut off"
    assert (await collect_on_ray(config, workers=2)).succeeded == 56 - len(before), "the workers were ended"
    rows = assert_whole(config, 56)
    assert all(row in rows for row in before)


async def test_a_run_done_before_the_attempt_timeout_ends_a_worker_that_never_started(
    tmp_path: Path, agent_url: str
) -> None:
    tasks = [{"mode": "ok"}]
    summary = await asyncio.wait_for(collect_on_ray(_config(tmp_path / "3", agent_url, tasks), workers=3), 30)
    assert summary.succeeded == 1, "no failure: every rollout was final before the timeout"
    again = _config(tmp_path / "2", agent_url, tasks, timeout_s=20)
    assert (await collect_on_ray(again, workers=2)).succeeded == 1, "the third worker was ended too"


_RAY_SCRIPT = """
import asyncio, sys
from pathlib import Path
from gym_failures.collection import CollectionConfig, collect
from gym_failures.ray import collect_on_ray
config = CollectionConfig(input_path=Path(sys.argv[1]), output_path=Path(sys.argv[2]), agent_url=sys.argv[3],
    concurrency=4, max_attempts=3)
run = collect_on_ray(config, workers=2, address=sys.argv[5]) if sys.argv[4] == "ray" else collect(config)
asyncio.run(run)
"""


@pytest.mark.parametrize(("killed", "resumed"), [("ray", "local"), ("local", "ray")])
async def test_a_driver_killed_mid_run_resumes_elsewhere_without_loss_or_duplicates(
    tmp_path: Path, agent_url: str, ray_address: str, killed: str, resumed: str
) -> None:
    # The last 20 tasks wait at a gate until the kill: the run is mid-way when killed by construction
    # (the first 40 write at least 40 rows and at most 80, then the gated ones hold every slot).
    gate = tmp_path / "gate"
    tasks = [
        {
            "mode": ("retry_then_ok", "always_fail", "ok")[i % 3],
            "sleep": 0.05,
            **({"until": str(gate)} if i >= 40 else {}),
        }
        for i in range(60)
    ]
    config = _config(tmp_path / "out", agent_url, tasks)
    arguments = [str(config.input_path), str(config.output_path), agent_url, killed, ray_address]
    process = subprocess.Popen([sys.executable, "-c", _RAY_SCRIPT, *arguments], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60  # a hang guard
        while time.monotonic() < deadline and len(rows_of(config)) < 25:
            await asyncio.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        gate.touch()
    before = rows_of(config)
    assert 25 <= len(before) < 100, "the kill must land mid-run"
    if resumed == "ray":
        await collect_on_ray(config, workers=2)
    else:
        await collect(config)
    rows = assert_whole(config, 60)
    assert all(row in rows for row in before), "no row is lost"


def _descendants(pid: int) -> set[int]:
    """Every live process under `pid`, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="reads the process tree from /proc")
def test_ctrl_c_stops_the_workers_and_the_local_ray_the_run_started(tmp_path: Path, agent_url: str) -> None:
    # The rollouts after the first eight hold their replies until the run was interrupted, so the
    # Ctrl-C comes while it runs however fast it goes (`"until"`, tests/collection/agent_app.py).
    gate = tmp_path / "gate"
    tasks = [{"mode": "ok", "sleep": 0.2, **({"until": str(gate)} if i >= 8 else {})} for i in range(200)]
    config = _config(tmp_path / "out", agent_url, tasks)
    command = [
        sys.executable,
        "-m",
        "gym_failures.cli",
        "collect",
        str(config.input_path),
        "--agent-url",
        agent_url,
        "--output",
        str(config.output_path),
        "--concurrency",
        "2",
        "--ray",
        "--workers",
        "2",
    ]
    # No RAY_ADDRESS: the run starts a local Ray of its own, beside the session's.
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(rows_of(config)) < 4:
            started |= _descendants(process.pid)
            time.sleep(0.05)
        started |= _descendants(process.pid)
        assert len(rows_of(config)) >= 4, "the run got going"
        # As a terminal's Ctrl-C does: SIGINT to the whole foreground process group.
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        gate.touch()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    assert process.returncode == 130
    assert b"Traceback" not in stderr
    assert started, "the run started Ray processes"
    deadline = time.monotonic() + 60  # a hang guard
    while time.monotonic() < deadline and any(_alive(pid) for pid in started):
        time.sleep(0.1)
    assert [pid for pid in started if _alive(pid)] == []
    assert len(rows_of(config)) < 200, "the run stopped early"


async def test_the_agent_urls_credentials_never_reach_a_row_from_a_ray_worker(
    tmp_path: Path, agent_url: str
) -> None:
    """Workers send with the agent URL's Basic credential; the driver's one save point replaces it
    wherever a reply quoted it, as a local run does."""
    password = "Zq9RayAgentUrlPassword"
    url = agent_url.replace("http://", f"http://collector:{password}@")
    config = _config(tmp_path / "out", url, [{"mode": "quote_credentials"}], max_attempts=2)
    await collect_on_ray(config, workers=1)
    saved = config.output_path.read_text() + config.failures_path.read_text()
    token = base64.b64encode(f"collector:{password}".encode()).decode()
    assert "refused" in saved, "the control: the agent quoted what it was sent"
    assert password not in saved
    assert token not in saved
