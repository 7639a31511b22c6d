"""A pool of Ray workers that lives across collection runs, on a real local Ray against the real agent
server: the rows a local run saves, the same worker processes from run to run, each run's state
closed at its end, a cancelled run or a killed worker leaving the pool usable, and no worker left."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import ray

from gym_failures.collection import collect
from gym_failures.ray import RayCollector, RayWorkers, collect_on_ray
from gym_failures.ray._pool import _JOIN_PROBE_S, RayJoinError, _init_ray, _unreachable
from tests.on_ray.saved import Held, assert_whole, config_of, gone, plan_of, rows_of, until

pytestmark = pytest.mark.usefixtures("ray_address")

MODES = ("ok", "retry_then_ok", "always_fail", "terminal", "raise", "garbage", "masked")


async def _states(pool: RayWorkers) -> list[dict[str, Any]]:
    """Each worker's process id and the run it holds open (a worker Ray is restarting refuses calls
    for a moment: ask again)."""
    return [await _state(worker) for worker in pool.handles]


async def _state(worker: Any) -> dict[str, Any]:
    for _ in range(600):  # a hang guard, 60 s: a loaded machine may take many seconds to restart one
        with contextlib.suppress(ray.exceptions.ActorUnavailableError):
            state: dict[str, Any] = await worker.state.remote()
            return state
        await asyncio.sleep(0.1)
    raise AssertionError("the worker did not answer within 60 s")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


async def _all_gone(pids: list[int]) -> bool:
    for _ in range(600):  # a hang guard, 60 s
        if not any(_alive(pid) for pid in pids):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_successive_runs_on_one_pool_save_the_rows_a_local_run_saves(
    tmp_path: Path, agent_url: str
) -> None:
    """Two runs with different configs (tasks, concurrency, budget, timeout, agent URL, output) on
    the same worker processes; each run's state is closed in the workers when it ends."""
    first = [{"mode": MODES[index % len(MODES)]} for index in range(14)]
    second = [{"mode": MODES[(index + 3) % len(MODES)]} for index in range(10)]
    configs = [
        (first, agent_url, {}),
        (second, agent_url + "/", {"concurrency": 2, "max_attempts": 2, "timeout_s": 20}),
    ]
    async with RayWorkers(workers=2) as pool:
        pids: list[list[int]] = []
        for index, (tasks, url, options) in enumerate(configs):
            on_pool = config_of(tmp_path / f"pool{index}", url, tasks, **options)
            local = config_of(tmp_path / f"local{index}", url, tasks, **options)
            pooled_summary = await collect_on_ray(on_pool, workers=pool)
            local_summary = await collect(local)
            assert plan_of(rows_of(on_pool)) == plan_of(rows_of(local))
            assert (pooled_summary.attempts, pooled_summary.succeeded) == (
                local_summary.attempts,
                local_summary.succeeded,
            )
            states = await _states(pool)
            assert [state["run"] for state in states] == [None, None], "the run's session was closed"
            pids.append([state["pid"] for state in states])
        assert pids[0] == pids[1], "the same worker processes ran both runs"
    assert pool.handles == []
    assert await _all_gone(pids[0]), "the pool's workers ended with it"
    assert ray.is_initialized(), "the session's Ray is left running"


@pytest.mark.parametrize("ending", ["normally", "KeyboardInterrupt"])
async def test_the_pool_ends_its_workers_however_its_block_ends(ending: str) -> None:
    pool = RayWorkers(workers=2)
    with pytest.raises(KeyboardInterrupt) if ending == "KeyboardInterrupt" else contextlib.nullcontext():
        async with pool:
            pids = [state["pid"] for state in await _states(pool)]
            handles = list(pool.handles)
            if ending == "KeyboardInterrupt":
                raise KeyboardInterrupt
    assert await _all_gone(pids)
    with pytest.raises(ray.exceptions.RayActorError):
        await handles[0].ready.remote()
    pool.close()  # closing again does nothing
    assert pool.handles == []


async def test_a_run_cancelled_on_a_pool_leaves_it_usable_and_the_resume_loses_nothing(
    tmp_path: Path, agent_url: str
) -> None:
    # The rollouts after the first sixteen hold their replies until the run was cancelled: it is
    # cancelled mid-run by construction (`Held`).
    held = Held(tmp_path / "held")
    tasks = [held.task(mode="ok", sleep=0.2) if i >= 16 else {"mode": "ok", "sleep": 0.2} for i in range(40)]
    config = config_of(tmp_path / "run", agent_url, tasks)
    async with RayWorkers(workers=2) as pool:
        collector = RayCollector(config, workers=pool)
        run = asyncio.create_task(collector.run())
        try:
            await until(lambda: collector.progress.attempts >= 6, "six rows")
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
        finally:
            held.release()
        before = rows_of(config)
        assert 6 <= len(before) < 40, "the cancel landed mid-run"
        summary = await asyncio.wait_for(collect_on_ray(config, workers=pool), 60)
        rows = assert_whole(config, 40)
        assert all(row in rows for row in before), "no row is lost"
        assert summary.succeeded == 40 - len(before)
        assert [state["run"] for state in await _states(pool)] == [None, None]


async def test_a_worker_killed_between_runs_is_back_for_the_next_run(tmp_path: Path, agent_url: str) -> None:
    tasks = [{"mode": "ok", "sleep": 0.05} for _ in range(16)]
    async with RayWorkers(workers=2) as pool:
        await collect_on_ray(config_of(tmp_path / "a", agent_url, tasks), workers=pool)
        handles = list(pool.handles)
        before = await _states(pool)
        ray.kill(pool.handles[0], no_restart=False)  # Ray restarts it, under the same handle
        assert await _restarted(pool.handles[0], before[0]["pid"])
        config = config_of(tmp_path / "b", agent_url, tasks)
        summary = await asyncio.wait_for(collect_on_ray(config, workers=pool), 60)
        assert (summary.succeeded, summary.dispatch_errors) == (16, 0)
        after = await _states(pool)
        assert pool.handles == handles
        assert after[0]["pid"] != before[0]["pid"], "the restarted worker is a new process"
        assert after[1]["pid"] == before[1]["pid"]
        assert [state["run"] for state in after] == [None, None], "both ran the run, and closed it"


async def test_a_worker_killed_mid_run_on_a_pool_loses_nothing_and_stays_in_the_pool(
    tmp_path: Path, agent_url: str
) -> None:
    # The rollouts after the first eight hold their replies until the killed worker is gone; the kill
    # comes once each worker runs four of them (`Held`): it dies with attempts in hand.
    held = Held(tmp_path / "held")
    tasks = [held.task(mode="ok", sleep=0.2) if i >= 8 else {"mode": "ok", "sleep": 0.2} for i in range(24)]
    async with RayWorkers(workers=2) as pool:
        before = await _states(pool)
        config = config_of(tmp_path / "a", agent_url, tasks)
        collector = RayCollector(config, workers=pool)
        run = asyncio.create_task(collector.run())
        try:
            await held.running(2 * 4)
            ray.kill(pool.handles[0], no_restart=False)
            await until(lambda: gone(before[0]["pid"]), "the killed worker's process ends")
        finally:
            held.release()
        summary = await asyncio.wait_for(run, 60)
        assert summary.succeeded == 24
        lost = [row for row in assert_whole(config, 24) if "failure" in row]
        assert lost, "the kill landed while attempts were in flight"
        assert all(row["rollout_failure"]["delivery"] == "possibly_delivered" for row in lost)
        assert await _restarted(pool.handles[0], before[0]["pid"]), "Ray restarted it under the same handle"
        again = config_of(tmp_path / "b", agent_url, tasks[:8])
        assert (await collect_on_ray(again, workers=pool)).succeeded == 8
        assert [state["run"] for state in await _states(pool)] == [None, None]


async def test_a_worker_killed_just_before_a_run_loses_nothing(tmp_path: Path, agent_url: str) -> None:
    """`ray.kill` returns before the worker is gone: the run may send it attempts that are lost as it
    dies (rows `possibly_delivered`, retried), then waits for it to be restarted."""
    tasks = [{"mode": "ok", "sleep": 0.05} for _ in range(16)]
    async with RayWorkers(workers=2) as pool:
        await asyncio.gather(*(worker.ready.remote() for worker in pool.handles))
        ray.kill(pool.handles[0], no_restart=False)
        config = config_of(tmp_path / "b", agent_url, tasks)
        summary = await asyncio.wait_for(collect_on_ray(config, workers=pool), 60)
        assert summary.succeeded == 16
        for row in assert_whole(config, 16):
            if "failure" in row:
                assert row["failure"]["failure_kind"] == "collection_dispatch_failed"
                assert (row["final"], row["rollout_failure"]["delivery"]) == (False, "possibly_delivered")
        assert [state["run"] for state in await _states(pool)] == [None, None]


async def _restarted(worker: Any, pid: int) -> bool:
    """Whether `worker` answers from a process other than `pid` within 60 s (a hang guard)."""
    for _ in range(600):
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            if (await worker.state.remote())["pid"] != pid:
                return True
        await asyncio.sleep(0.1)
    return False


async def test_two_runs_at_once_on_one_pool_are_refused(tmp_path: Path, agent_url: str) -> None:
    # The first run's replies are held until the second was refused: it is still running (`Held`).
    held = Held(tmp_path / "held")
    first = config_of(tmp_path / "a", agent_url, [held.task(mode="ok") for _ in range(4)])
    second = config_of(tmp_path / "b", agent_url, [{"mode": "ok"}])
    async with RayWorkers(workers=1) as pool:
        running = asyncio.create_task(collect_on_ray(first, workers=pool))
        try:
            await held.running(1)
            with pytest.raises(RuntimeError, match="running another collection"):
                await collect_on_ray(second, workers=pool)
        finally:
            held.release()
        assert (await running).succeeded == 4, "the first run went on"
        assert not second.output_path.exists(), "the refused run touched nothing"
        assert (await collect_on_ray(second, workers=pool)).succeeded == 1, "after it, the next run goes"


async def test_a_pool_not_open_is_refused(tmp_path: Path, agent_url: str) -> None:
    config = config_of(tmp_path / "a", agent_url, [{"mode": "ok"}])
    pool = RayWorkers(workers=1)
    with pytest.raises(RuntimeError, match="not open"):
        await collect_on_ray(config, workers=pool)
    async with pool:
        pass
    with pytest.raises(RuntimeError, match="not open"):
        await collect_on_ray(config, workers=pool)
    with pytest.raises(RuntimeError, match="already closed"):
        pool.start()


@pytest.mark.parametrize("workers", [0, -1, True, 1.5])
def test_a_pool_of_no_workers_is_a_clear_value_error(workers: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="workers must be a whole number of at least 1"):
        RayWorkers(workers=workers)
    config = config_of(tmp_path, "http://127.0.0.1:1", [{"mode": "ok"}])
    with pytest.raises(ValueError, match="workers must be a whole number of at least 1"):
        RayCollector(config, workers=workers)


def test_an_address_goes_to_the_pool_not_to_a_run_on_it(tmp_path: Path) -> None:
    config = config_of(tmp_path, "http://127.0.0.1:1", [{"mode": "ok"}])
    with pytest.raises(ValueError, match="address goes to the RayWorkers pool"):
        RayCollector(config, workers=RayWorkers(1), address="ray://head:10001")


# --- a worker out of reach, frozen, or slow to start (review findings) ------------------------


class _OutOfReachOnce:
    """A worker handle whose third exchange reports Ray's `ActorUnavailableError` while the real call
    goes on in the worker, as a network blip to a live actor on a cluster does (Ray's own text: "the
    task may or may not have been executed"). One machine cannot make that fault: it is injected
    here, in front of a real worker."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.calls = handle, 0
        self.exchange = self

    def remote(self, *args: Any) -> Any:
        reference = self.handle.exchange.remote(*args)
        self.calls += 1
        if self.calls != 3:
            return reference
        return self._unavailable()

    async def _unavailable(self) -> Any:
        await asyncio.sleep(0.05)  # the real call is under way in the worker
        raise ray.exceptions.ActorUnavailableError("injected: connection reset", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


class _Counted:
    """An `end_run` call's reference that counts, on its handle, being waited for."""

    def __init__(self, handle: _EndsRecorded, reference: Any) -> None:
        self.handle, self.reference = handle, reference

    def __await__(self) -> Any:
        self.handle.awaited += 1
        return self.reference.__await__()


class _EndsRecorded:
    """A worker handle that counts the `end_run` calls a run sends it, and those it waited for."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.ended, self.awaited = handle, 0, 0
        self.end_run = self

    def remote(self, *args: Any) -> Any:
        self.ended += 1
        return _Counted(self, self.handle.end_run.remote(*args))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


async def test_rows_of_attempts_already_recorded_as_lost_are_not_taken_twice(
    tmp_path: Path, agent_url: str
) -> None:
    config = config_of(tmp_path, agent_url, [{"mode": "ok", "sleep": 0.3}] * 12)
    async with RayWorkers(workers=1) as pool:
        real = pool.handles
        pool.handles = [_OutOfReachOnce(real[0])]
        summary = await RayCollector(config, workers=pool).run()
        pool.handles = real
    rows = assert_whole(config, 12)
    assert summary.succeeded == 12
    lost = [row for row in rows if "failure" in row]
    assert lost, "the attempts held at the blip are recorded as possibly delivered"
    assert {(row["rollout_failure"] or {}).get("delivery") for row in lost} == {"possibly_delivered"}


async def test_a_frozen_worker_is_lost_after_the_attempt_timeout_and_the_other_finishes(
    tmp_path: Path, agent_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that stops answering without dying (SIGSTOP; a hung node): its exchange has a
    deadline, its attempts are recorded as possibly delivered, and the other worker finishes the run."""
    from gym_failures.ray import _collect

    monkeypatch.setattr(_collect, "_EXCHANGE_GRACE_S", 1.0)
    monkeypatch.setattr(_collect, "_MIN_START_S", 2.0)
    # The exchange deadline (timeout + grace) must end the frozen worker's exchange, which cannot
    # answer, and never the live worker's 0.1 s attempts: every lost row must be the frozen worker's.
    # 10 s is a hang guard for those (2 s left a loaded machine too little room).
    # The rollouts after the first eight hold their replies until the worker is frozen, which comes once
    # each worker runs four of them (`Held`): it freezes with attempts in hand.
    held = Held(tmp_path / "held")
    tasks = [held.task(mode="ok", sleep=0.1) if i >= 8 else {"mode": "ok", "sleep": 0.1} for i in range(40)]
    config = config_of(tmp_path, agent_url, tasks, timeout_s=10)
    async with RayWorkers(workers=2) as pool:
        frozen = (await _states(pool))[0]["pid"]
        real = pool.handles
        pool.handles = [_EndsRecorded(handle) for handle in real]
        collecting = asyncio.create_task(RayCollector(config, workers=pool).run())
        try:
            await held.running(2 * 4)
            os.kill(frozen, signal.SIGSTOP)
        finally:
            held.release()
        try:
            summary = await asyncio.wait_for(collecting, 60)
        finally:
            os.kill(frozen, signal.SIGCONT)
        ends = [(handle.ended, handle.awaited) for handle in pool.handles]
        pool.handles = real
        # The frozen worker closes the run's state once it answers again.
        for _ in range(600):  # a hang guard, 60 s
            if (await _state(pool.handles[0]))["run"] is None:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the thawed worker kept the run's state open")
    # The run's end tells both workers to close its state, and waits for the live one only: the frozen
    # one would hold it for the whole attempt timeout.
    assert ends == [(1, 0), (1, 1)]
    rows = assert_whole(config, 40)
    assert summary.succeeded == 40
    reasons = [row["failure"]["failure_reason"] for row in rows if "failure" in row]
    assert reasons
    assert all("did not answer within the attempt timeout" in reason for reason in reasons)


def test_two_pools_share_the_ray_the_first_started_until_both_close() -> None:
    """A pool that started Ray does not shut it down under another pool still open on it. A fresh
    process: this session's Ray is up already, and a pool only shuts down a Ray it started."""
    code = (
        "import ray\n"
        "from gym_failures.ray import RayWorkers\n"
        "first = RayWorkers(workers=1).start()\n"
        "second = RayWorkers(workers=1).start()\n"
        "ray.get(second.handles[0].ready.remote(), timeout=60)\n"
        "first.close()\n"
        "assert ray.is_initialized()\n"
        "assert ray.get(second.handles[0].ready.remote(), timeout=60)\n"
        "second.close()\n"
        "assert not ray.is_initialized()\n"
        "print('ok')\n"
    )
    environment = {name: value for name, value in os.environ.items() if not name.startswith("RAY_")}
    # A short directory of its own: Ray's socket paths must fit in 107 bytes.
    with tempfile.TemporaryDirectory(prefix="rp", dir="/tmp") as directory:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**environment, "RAY_TMPDIR": directory},
        )
    assert (done.returncode, done.stdout.strip().splitlines()[-1:]) == (0, ["ok"]), done.stderr[-2000:]


def test_an_address_ray_cannot_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": 1}\n')
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gym_failures.cli", "collect", str(tasks)),
            *("--agent-url", "http://127.0.0.1:9", "--output", str(tmp_path / "out.jsonl")),
            *("--ray", "not-an-address"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gym-failures collect: error: --ray: could not join Ray at not-an-address: "
        "Invalid address format: not-an-address"
    ]


@pytest.mark.parametrize("through", ["--ray ADDRESS", "RAY_ADDRESS", "RAY_ADDRESS, --ray auto"])
def test_an_address_nothing_answers_on_is_one_line_and_exit_2_at_once(tmp_path: Path, through: str) -> None:
    """Ray retries an address that refuses for minutes, deaf to Ctrl-C; the probe before it answers
    at once. Refused by construction: the port is bound (so no one else takes it) and not listening."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": 1}\n')
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{bound.getsockname()[1]}"
        environment = {name: value for name, value in os.environ.items() if not name.startswith("RAY_")}
        if through.startswith("RAY_ADDRESS"):
            environment["RAY_ADDRESS"] = address
        option = ("--ray", address) if through == "--ray ADDRESS" else None
        done = subprocess.run(
            [
                *(sys.executable, "-m", "gym_failures.cli", "collect", str(tasks)),
                *("--agent-url", "http://127.0.0.1:9", "--output", str(tmp_path / "out" / "r.jsonl")),
                *(option or (("--ray",) if through == "RAY_ADDRESS" else ("--ray", "auto"))),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=environment,
        )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"gym-failures collect: error: --ray: could not join Ray at {address}: "
        "nothing answers there (Connection refused)"
    ]
    assert not (tmp_path / "out").exists(), "nothing is written"


def test_a_loopback_address_is_probed_where_ray_dials_it() -> None:
    """Ray dials a loopback host at the node's own address; a cluster that listens only there
    answers Ray, so the probe must not call it unreachable."""
    from ray._private.services import get_node_ip_address

    node: str = get_node_ip_address()  # type: ignore[no-untyped-call]
    with socket.socket() as listening:
        listening.bind((node, 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert _unreachable(f"127.0.0.1:{port}") is None
        assert _unreachable(f"localhost:{port}") is None


def test_an_addresss_userinfo_never_reaches_the_line() -> None:
    with pytest.raises(RayJoinError) as raised:
        _init_ray("alice:s3cretPassw0rd@127.0.0.1:1")
    assert "s3cretPassw0rd" not in str(raised.value)
    assert "alice" not in str(raised.value)
    assert str(raised.value).startswith("could not join Ray at ***@127.0.0.1:1: ")


@pytest.mark.parametrize("address", ["auto", "local", "ray://head:10001", "not-an-address", "head:", ":6379"])
def test_an_address_that_is_no_host_and_port_is_left_to_ray(address: str) -> None:
    assert _unreachable(address) is None


def test_an_address_that_does_not_answer_in_time_is_named_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's timeout, without waiting for one: the connection is what times out."""
    asked: list[float | None] = []

    def silent(address: tuple[str, int], timeout: float | None = None) -> socket.socket:
        asked.append(timeout)
        raise TimeoutError

    monkeypatch.setattr(socket, "create_connection", silent)
    assert _unreachable("192.0.2.2:6379") == f"no answer within {_JOIN_PROBE_S:.0f} s"
    assert asked == [_JOIN_PROBE_S]


async def test_a_short_attempt_timeout_still_gives_new_workers_time_to_start(
    tmp_path: Path, agent_url: str
) -> None:
    """A worker's start (a new process importing Ray and the collector, 0.5 s or more) is no attempt:
    an attempt timeout of half a second does not fail the first run on a pool just started."""
    # speed-ok: the subject is a timeout shorter than a worker's start; an attempt over 0.5 s is retried
    # (3 attempts), and the run fails only if the start window used it (a CollectionFailure)
    config = config_of(tmp_path, agent_url, [{"mode": "ok"}] * 4, timeout_s=0.5)
    async with RayWorkers(workers=2) as pool:
        summary = await collect_on_ray(config, workers=pool)
    assert summary.succeeded == 4
