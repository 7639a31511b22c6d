"""Rows come back from a Ray worker in batches, success rows encoded by the worker: every row reaches
the driver, in the order its attempts finished, as the line a local run writes, with the driver's own
registered secrets redacted, and nothing lost when a worker dies with a batch in hand."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import ray

from gym_failures.collection import CollectionConfig, RowWriter, collect, read_rows
from gym_failures.collection._attempt_row import AttemptRow
from gym_failures.collection._dispatcher import AttemptDispatcher
from gym_failures.collection._resume import PendingRollout
from gym_failures.ray import RayCollector, collect_on_ray
from gym_failures.ray._pool import _AttemptWorker
from gym_failures.ray._worker_run import EncodedRow, _batch_size
from gym_failures.redaction import REDACTED, forget_registered_secrets, register_secret
from tests.on_ray.saved import Held, assert_whole, config_of, gone, pid_of, until

pytestmark = pytest.mark.usefixtures("ray_address")


_SUCCESS_TASKS: list[dict[str, Any]] = [
    {"mode": "echo", "id": "echo-1", "text": "naïve 東京 ✓"},
    {"mode": "result", "result": {"reward": 0.5, "accuracy": 0.25, "response": {"output": ["a"]}}},
    {"mode": "masked"},
    {"mode": "no_reward"},
]


async def test_success_lines_from_ray_workers_are_the_lines_a_local_run_writes(
    tmp_path: Path, agent_url: str
) -> None:
    tasks = _SUCCESS_TASKS * 4
    local = config_of(tmp_path / "local", agent_url, tasks)
    on_ray = config_of(tmp_path / "ray", agent_url, tasks, concurrency=8)
    await collect(local)
    await collect_on_ray(on_ray, workers=2)
    local_lines = _without_durations(local.output_path.read_bytes())
    ray_lines = _without_durations(on_ray.output_path.read_bytes())
    assert len(ray_lines) == len(tasks)
    assert ray_lines == local_lines


_DURATION = re.compile(rb'"_gf_duration_s": ?[0-9][0-9.eE+-]*')


def _without_durations(saved: bytes) -> list[bytes]:
    """The lines of a row file, sorted, each with its `_gf_duration_s` (which every line has: the
    worker measures it as a local run does) replaced by one placeholder: an attempt's duration is a
    measurement, never the same in two runs."""
    lines = sorted(saved.splitlines())
    assert all(len(_DURATION.findall(line)) == 1 for line in lines)
    return [_DURATION.sub(b'"_gf_duration_s":0', line) for line in lines]


async def test_a_secret_registered_on_the_driver_is_redacted_from_rows_the_workers_made(
    tmp_path: Path, agent_url: str
) -> None:
    """A worker cannot know the driver's registered secrets: while there are any, the rows come back
    whole and are redacted by the driver, as a local run's."""
    secret = "Zq9DriverOnlySecretValue"
    config = config_of(tmp_path, agent_url, [{"mode": "echo", "note": f"key={secret}"}] * 6)
    register_secret(secret)
    try:
        await collect_on_ray(config, workers=2)
    finally:
        forget_registered_secrets()
    saved = config.output_path.read_text()
    assert secret not in saved
    assert saved.count(REDACTED) == 6


def test_a_row_encoded_before_a_secret_was_registered_is_redacted_by_the_driver(tmp_path: Path) -> None:
    """A secret registered mid-run, after a worker encoded a row: the driver decodes it and saves it
    as any row, redacted."""
    secret = "Zq9RegisteredMidRunValue"
    config = config_of(tmp_path, "http://127.0.0.1:9", [{"mode": "ok"}])
    row = {
        "rollout_id": "0:0",
        "task_index": 0,
        "rollout_index": 0,
        "result": {"reward": 1.0, "note": secret},
    }
    encoded = EncodedRow.of(AttemptRow(row, succeeded=True, final=True), [])
    assert secret.encode() in encoded.line
    assert "result" not in encoded.row
    collector = RayCollector(config, workers=1)
    register_secret(secret)
    try:
        with RowWriter(config.output_path) as successes, RowWriter(config.failures_path) as failures:
            assert collector.record_attempt(encoded, successes, failures) is None
    finally:
        forget_registered_secrets()
    saved = json.loads(config.output_path.read_text())
    assert saved["result"]["note"] == REDACTED
    assert collector.summary.succeeded == 1


class _Held(AttemptDispatcher):
    """Each attempt's row waits for its rollout's event: the test decides when, and in what order,
    attempts finish."""

    gates: dict[int, asyncio.Event]

    async def __aenter__(self) -> _Held:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def row(self, rollout: PendingRollout, attempt: int) -> AttemptRow:
        await self.gates[rollout.task_index].wait()
        row = {"rollout_id": f"{rollout.task_index}:0", "task_index": rollout.task_index, "attempt": attempt}
        return AttemptRow({**row, "result": {"reward": 1.0}}, succeeded=True, final=True)


class _HeldWorker(_AttemptWorker):
    """The worker's body, in this process, with `_Held` attempts."""

    def __init__(self, gates: dict[int, asyncio.Event]) -> None:
        super().__init__()
        self.gates = gates

    def dispatcher(self, config: CollectionConfig, run_id: str) -> AttemptDispatcher:
        held = _Held(config, run_id)
        held.gates = self.gates
        return held


def _work(indices: list[int]) -> list[tuple[int, PendingRollout, int]]:
    return [(index, PendingRollout(index, 0, {"id": index}, 1), 1) for index in indices]


async def _turns(count: int = 5) -> None:
    """Let the loop run what is ready (no time passes): a released attempt makes its row."""
    for _ in range(count):
        await asyncio.sleep(0)


async def test_exchanges_return_every_row_in_the_order_the_attempts_finished(tmp_path: Path) -> None:
    config = config_of(tmp_path, "http://127.0.0.1:9", [], concurrency=8)
    assert _batch_size(8) == 4
    gates = {index: asyncio.Event() for index in range(6)}
    worker = _HeldWorker(gates)
    first = asyncio.ensure_future(worker.exchange("run", config, "id", _work(list(range(6))), True))
    await _turns()
    for index in (4, 1, 5, 0, 2, 3):
        gates[index].set()
        await _turns()
    token, done = await asyncio.wait_for(first, 30)
    while len(done) < 6:
        _, more = await asyncio.wait_for(worker.exchange("run", config, "id", [], True), 30)
        done.extend(more)
    assert [ticket for ticket, _ in done] == [4, 1, 5, 0, 2, 3]
    assert all(isinstance(row, EncodedRow) for _, row in done), "encode=True: success rows as lines"
    lines = [row.line for _, row in done if isinstance(row, EncodedRow)]
    assert [json.loads(line)["task_index"] for line in lines] == [4, 1, 5, 0, 2, 3]
    # Nothing held: the next exchange answers at once, with nothing.
    assert await worker.exchange("run", config, "id", [], True) == (token, [])
    await worker.end_run("run")


async def test_an_exchange_answers_with_every_row_finished_meanwhile(tmp_path: Path) -> None:
    """Rows that finish together go back in one exchange (one Ray call for them all)."""
    config = config_of(tmp_path, "http://127.0.0.1:9", [], concurrency=16)
    gates = {index: asyncio.Event() for index in range(4)}
    for gate in gates.values():
        gate.set()
    worker = _HeldWorker(gates)
    _, done = await asyncio.wait_for(worker.exchange("run", config, "id", _work([0, 1, 2, 3]), False), 30)
    assert sorted(ticket for ticket, _ in done) == [0, 1, 2, 3]
    await worker.end_run("run")


async def test_an_exchange_with_one_row_does_not_wait_for_attempts_that_go_on(tmp_path: Path) -> None:
    """Once a row is done the exchange waits a moment for more, never for the attempts still
    running: it answers with what it has, and the rest come in later exchanges, none lost."""
    config = config_of(tmp_path, "http://127.0.0.1:9", [], concurrency=8)
    gates = {index: asyncio.Event() for index in range(4)}
    worker = _HeldWorker(gates)
    gates[2].set()
    _, done = await asyncio.wait_for(worker.exchange("run", config, "id", _work([0, 1, 2, 3]), False), 30)
    assert [ticket for ticket, _ in done] == [2]
    assert not isinstance(done[0][1], EncodedRow), "encode=False: the row whole"
    for index in (3, 0, 1):
        gates[index].set()
    later: list[int] = []
    while len(later) < 3:
        _, more = await asyncio.wait_for(worker.exchange("run", config, "id", [], False), 30)
        later.extend(ticket for ticket, _ in more)
    assert later == [3, 0, 1]
    await worker.end_run("run")


async def test_batched_rows_keep_every_row_in_attempt_order_across_a_worker_killed_mid_run(
    tmp_path: Path, agent_url: str
) -> None:
    # The rollouts after the first sixteen hold their replies until the killed worker is gone. The
    # others' rows come back in batches first; the kill comes once sixteen held attempts run, eight in
    # each worker (`Held`): the worker killed dies with attempts in hand however fast the run goes, and
    # whichever worker came up first (a worker killed before it was up would take no part in the run).
    held = Held(tmp_path / "held")
    tasks = [held.task(mode="ok", sleep=0.2) if i >= 16 else {"mode": "ok", "sleep": 0.2} for i in range(40)]
    config = config_of(tmp_path, agent_url, tasks, concurrency=8)
    collector = RayCollector(config, workers=2)

    async def kill_a_worker() -> None:
        try:
            await held.running(2 * 8)
            pid = await pid_of(collector.workers[0])
            ray.kill(collector.workers[0], no_restart=False)
            await until(lambda: gone(pid), "the killed worker's process ends")
        finally:
            held.release()

    killer = asyncio.create_task(kill_a_worker())
    summary = await collector.run()
    await killer
    rows = assert_whole(config, 40)
    assert summary.succeeded == 40
    assert any("failure" in row for row in rows), "the kill landed while attempts were in flight"
    failures = list(read_rows(config.failures_path))  # in file order, as saved
    successes = list(read_rows(config.output_path))
    by_rollout: dict[str, list[int]] = {}
    for row in failures:
        by_rollout.setdefault(row["rollout_id"], []).append(row["attempt"])
    for numbers in by_rollout.values():
        assert numbers == sorted(numbers), "a rollout's failed attempts are saved in their order"
    for row in successes:
        assert row["attempt"] == 1 + len(by_rollout.get(row["rollout_id"], [])), "the success comes last"
