"""Where Ray pays off, and what it costs: a Ray worker's CPU per row against the local collector's, a
collector bound by its own CPU (large agent replies, many short rollouts) on one process against two
Ray workers, and the driver's ingest rate, the bound on any cluster (issue 24).

Three parts, each in alternating rounds in one run (medians, with each round's ratio kept: the
machine's load moves the figures, a same-round ratio much less), the load average beside each:

1. **CPU per row** (the issue-12 setting: 2,000 rollouts, a uvicorn agent that takes 20 ms, small
   replies): the local collector at concurrency 64 against a `RayWorkers` pool of two workers x 32
   that is up. The local collector's CPU is its process's (the agent runs in its own); a worker's is
   read from `/proc` for its whole process (every Ray thread in it), the driver's from its own.
2. **A collector bound by its CPU**: 2,000 rollouts against an agent that answers at once with a
   large reply (`LARGE_REPLY_KB` of response text, as a long generation's episode), served by a
   bare asyncio server so that the agent costs little of the two cores. The local collector at
   concurrency 64; two Ray workers x 32 on a pool that is up; and two workers started for the run
   (`collect --ray`, their start in its time). Throughput in rows per second, and its ratio to the
   local collector's in the same round.
3. **The driver's ingest rate**: workers that answer each attempt at once with the row the
   collector builds (no HTTP), so that what is measured is the driver taking rows from Ray and
   writing them, with small rows and with `LARGE_REPLY_KB` ones. Beside it, the local collector with
   a dispatcher that answers at once (`bench_ray`'s "driver alone").

The local collector runs on `gym_failures._loop.run` (uvloop when installed, as `collect` does);
the Ray workers take uvloop by themselves when it is installed (Ray's `RAY_USE_UVLOOP`): the loops
each ran are printed. Run alone with `python -m benchmarks ray_cpu`; `BENCH_RAY_ROUNDS` sets the
rounds (default 7; the CPU per row takes three times as many). Needs the ray, aiohttp and demo
extras; Linux (`/proc`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks._timing import markdown_table
from benchmarks.bench_ray import _agent, _empty_actors, _Instant
from benchmarks.bench_ray import _config as bench_ray_config
from gym_failures._loop import loop_factory
from gym_failures._loop import run as run_loop
from gym_failures.collection import CollectionConfig, collect
from gym_failures.collection._dispatcher import AttemptDispatcher
from gym_failures.collection._resume import PendingRollout
from gym_failures.ray import RayCollector, RayWorkers, collect_on_ray
from gym_failures.ray._pool import _AttemptWorker

ROLLOUTS = 2000
ROUNDS = int(os.environ.get("BENCH_RAY_ROUNDS", "7"))
CPU_ROUNDS = 3 * ROUNDS
"""Part 1's rounds: two runs of about a second each, whose same-round ratio swings most on a machine
whose speed drifts from second to second (0.8x to 1.8x in 7 rounds): three times the rounds, which
cost about a minute."""
LARGE_REPLY_KB = 32

_CANNED_AGENT = """
import asyncio, json, sys
try:
    import uvloop
except ImportError:
    uvloop = None

kb = int(sys.argv[2])
words = "lorem ipsum dolor sit amet consectetur " * 6
output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": words}]}
          for _ in range(kb * 1024 // 300)]
body = json.dumps({"result": {"reward": 1.0, "response": {"id": "r", "output": output}}}).encode()
head = b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: %d\\r\\n\\r\\n"
reply = head % len(body) + body

class Agent(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""

    def data_received(self, data):
        self.buffer += data
        while (end := self.buffer.find(b"\\r\\n\\r\\n")) >= 0:
            head = self.buffer[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15:].split(b"\\r\\n", 1)[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            self.transport.write(reply)

async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Agent, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    await server.serve_forever()

(uvloop.run if uvloop else asyncio.run)(main())
"""


@contextlib.contextmanager
def _canned_agent(kb: int) -> Iterator[tuple[str, int]]:
    """An agent that answers every `/run` at once with the same reply of about `kb` KiB: its URL
    and its process id."""
    from tests.processes import free_port, stop, wait_listening

    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", _CANNED_AGENT, str(port), str(kb)])
    try:
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        stop(process)


def _config(directory: Path, agent_url: str, concurrency: int) -> CollectionConfig:
    # No readiness wait: the ingest part's agent is no server, and nothing probes it.
    return bench_ray_config(directory, agent_url, concurrency, wait_ready_s=0)


def _process_cpu(pid: int) -> float:
    """User and system CPU seconds of process `pid`, every thread in it."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


class _Sample:
    """One timed run: its wall seconds, the driver's (or the local collector's) CPU seconds, the
    workers' CPU seconds, and the 1-minute load average as it ended."""

    def __init__(self, wall: float, own_cpu: float, workers_cpu: float) -> None:
        self.wall, self.own_cpu, self.workers_cpu, self.load = wall, own_cpu, workers_cpu, os.getloadavg()[0]


def _measured(run: Callable[[], object], worker_pids: list[int]) -> _Sample:
    time.sleep(0.5)  # the workers a run ended exit, rather than bill their exit to this run
    workers = [_process_cpu(pid) for pid in worker_pids]
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return _Sample(wall, cpu, sum(_process_cpu(pid) for pid in worker_pids) - sum(workers))


def _pool(body: type[Any] | None = None) -> tuple[RayWorkers, list[int], str]:
    """A started pool of two workers x (their `body`), up: the pool, its workers' pids, their loop."""
    import ray

    pool = RayWorkers(workers=2) if body is None else _pool_of(body)
    pool.start()
    states = ray.get([worker.state.remote() for worker in pool.handles])
    return pool, [state["pid"] for state in states], states[0]["loop"]


def _pool_of(body: type[Any]) -> RayWorkers:
    class Pool(RayWorkers):
        _body = body

    return Pool(workers=2)


def _instant_worker(kb: int) -> type[Any]:
    """A worker whose attempts are answered at once, each with the row the collector builds of a
    success reply of about `kb` KiB (0: the 20-ms agent's small reply): no HTTP. Defined here, so Ray
    ships it by value."""
    from gym_failures.collection._attempt_row import AttemptSeen
    from gym_failures.failure_records import BaseEpisodeResponse, FailureReport

    words = "lorem ipsum dolor sit amet consectetur " * 6
    output = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": words}]}
        for _ in range(kb * 1024 // 300)
    ]
    result: dict[str, Any] = {"reward": 1.0, **({"response": {"id": "r", "output": output}} if kb else {})}
    body = json.dumps({"result": result}).encode()

    class Answered(AttemptDispatcher):
        async def _attempt(
            self, session: Any, rollout: PendingRollout, attempt: int, meter: Any = None
        ) -> Any:
            # What `_attempt` makes of a 200 reply with this body, the reply read as it is there.
            seen = AttemptSeen(source="environment", delivery="delivered", http_status=200)
            return BaseEpisodeResponse.model_validate_json(body), FailureReport(), seen

        async def row(self, rollout: PendingRollout, attempt: int) -> Any:
            response, report, seen = await self._attempt(None, rollout, attempt)
            return self.outcome_row(rollout, attempt, response, report, seen)

    class InstantWorker(_AttemptWorker):
        def dispatcher(self, config: CollectionConfig, run_id: str) -> AttemptDispatcher:
            return Answered(config, run_id)

    return InstantWorker


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _median_range(values: list[float], spec: str = ".2f") -> str:
    return f"{statistics.median(values):{spec}} ({min(values):{spec}} to {max(values):{spec}})"


def _cpu_per_row(directory: Path) -> tuple[str, dict[str, Any]]:
    """Part 1: CPU per row, a pooled worker against the local collector, agent 20 ms."""
    with _agent(0.020) as agent:
        pool, pids, worker_loop = _pool()
        try:
            asyncio.run(collect_on_ray(_config(directory, agent, 32), workers=pool))  # warm the pool
            local: list[_Sample] = []
            pooled: list[_Sample] = []
            for index in range(CPU_ROUNDS):
                subjects = [
                    (local, lambda: run_loop(collect(_config(directory, agent, 64))), []),
                    (
                        pooled,
                        lambda: asyncio.run(collect_on_ray(_config(directory, agent, 32), workers=pool)),
                        pids,
                    ),
                ]
                for samples, run, watched in subjects[index % 2 :] + subjects[: index % 2]:
                    samples.append(_measured(run, watched))
        finally:
            pool.close()
    local_ms = [sample.own_cpu / ROLLOUTS * 1000 for sample in local]
    worker_ms = [sample.workers_cpu / ROLLOUTS * 1000 for sample in pooled]
    driver_ms = [sample.own_cpu / ROLLOUTS * 1000 for sample in pooled]
    ratios = [worker / own for worker, own in zip(worker_ms, local_ms, strict=True)]
    loads = [sample.load for sample in local + pooled]
    ratio = statistics.median(ratios)
    rows = [
        ("local collector, concurrency 64: its process", _median_range(local_ms, ".3f"), "1.00x", ""),
        (
            "a Ray worker (pool of 2 x 32, up): its process",
            _median_range(worker_ms, ".3f"),
            f"{ratio:.2f}x ({min(ratios):.2f}x to {max(ratios):.2f}x)",
            "≤ 1.3x: " + ("met" if ratio <= 1.3 else "missed"),
        ),
        ("the Ray run's driver: its process", _median_range(driver_ms, ".3f"), "", ""),
        (
            "the medians' ratio (worker / local)",
            "",
            f"{statistics.median(worker_ms) / statistics.median(local_ms):.2f}x",
            "",
        ),
        (
            "wall (s): local / pool",
            f"{_median([s.wall for s in local]):.2f} / {_median([s.wall for s in pooled]):.2f}",
            "",
            "",
        ),
    ]
    table = markdown_table(
        ("2,000 rollouts, agent 20 ms: CPU per row", "ms (median, range)", "vs local, per round", "target"),
        rows,
    )
    note = (
        f"Loops: local `{_local_loop()}`, Ray workers `{worker_loop}`. "
        f"Load average (1 min) over the rounds: {min(loads):.1f} to {max(loads):.1f}."
    )
    raw = {"local_ms": local_ms, "worker_ms": worker_ms, "driver_ms": driver_ms, "loads": loads}
    return f"{table}\n\n{note}", raw


def _cpu_bound(directory: Path) -> tuple[str, dict[str, Any]]:
    """Part 2: large replies, no delay: throughput of one process against two Ray workers."""
    with _canned_agent(LARGE_REPLY_KB) as (agent, agent_pid):
        agent_started = _process_cpu(agent_pid)
        pool, pids, _ = _pool()
        try:
            asyncio.run(collect_on_ray(_config(directory, agent, 32), workers=pool))  # warm the pool
            local: list[_Sample] = []
            pooled: list[_Sample] = []
            per_run: list[_Sample] = []
            for index in range(ROUNDS):
                subjects = [
                    (local, lambda: run_loop(collect(_config(directory, agent, 64))), []),
                    (
                        pooled,
                        lambda: asyncio.run(collect_on_ray(_config(directory, agent, 32), workers=pool)),
                        pids,
                    ),
                    (
                        per_run,
                        lambda: asyncio.run(RayCollector(_config(directory, agent, 32), workers=2).run()),
                        [],
                    ),
                ]
                for samples, run, watched in subjects[index % 3 :] + subjects[: index % 3]:
                    samples.append(_measured(run, watched))
            # The agent's CPU per row, over every row it answered (the warm-up's too).
            agent_ms = (_process_cpu(agent_pid) - agent_started) / (ROLLOUTS * (3 * ROUNDS + 1)) * 1000
        finally:
            pool.close()
    rate = {
        name: [ROLLOUTS / s.wall for s in samples]
        for name, samples in (("local", local), ("pool", pooled), ("per_run", per_run))
    }
    speedup_pool = [pool_rate / own for pool_rate, own in zip(rate["pool"], rate["local"], strict=True)]
    speedup_run = [run_rate / own for run_rate, own in zip(rate["per_run"], rate["local"], strict=True)]
    loads = [s.load for s in local + pooled + per_run]
    best = statistics.median(speedup_pool)
    rows = [
        ("local collector, concurrency 64 (baseline)", _median_range(rate["local"], ".0f"), "1.00x", ""),
        (
            "Ray, pool of 2 workers x 32 (up)",
            _median_range(rate["pool"], ".0f"),
            f"{best:.2f}x ({min(speedup_pool):.2f}x to {max(speedup_pool):.2f}x)",
            "≥ 1.5x: " + ("met" if best >= 1.5 else "missed"),
        ),
        (
            "Ray, 2 workers x 32 started for the run (`collect --ray`)",
            _median_range(rate["per_run"], ".0f"),
            f"{statistics.median(speedup_run):.2f}x ({min(speedup_run):.2f}x to {max(speedup_run):.2f}x)",
            "",
        ),
    ]
    header = (
        f"2,000 rollouts, {LARGE_REPLY_KB} KiB replies, agent answers at once",
        "rows/s (median, range)",
        "vs local, per round",
        "target",
    )
    per_row = 1000 / ROLLOUTS
    local_ms = _median([s.own_cpu for s in local]) * per_row
    workers_ms = _median([s.workers_cpu for s in pooled]) * per_row
    driver_ms = _median([s.own_cpu for s in pooled]) * per_row
    # What two free cores allow, from CPU alone (load-independent where wall time is not): the local
    # collector is bound by its one core (the agent runs beside it on the other), a Ray run by the
    # two cores its workers, driver and agent share.
    local_bound = 1000 / max(local_ms, agent_ms)
    ray_bound = 2000 / (workers_ms + driver_ms + agent_ms)
    cpu = (
        f"CPU per row (ms, medians): local {local_ms:.3f}; pool: workers {workers_ms:.3f}, "
        f"driver {driver_ms:.3f}; the agent {agent_ms:.3f}. From CPU alone, on two free cores: local "
        f"{local_bound:.0f} rows/s, Ray {ray_bound:.0f} rows/s, **{ray_bound / local_bound:.2f}x**. "
        f"Load average (1 min) over the rounds: {min(loads):.1f} to {max(loads):.1f}."
    )
    raw = {**{f"{name}_rows_per_s": values for name, values in rate.items()}, "loads": loads}
    raw["cpu_ms_local_workers_driver_agent"] = [local_ms, workers_ms, driver_ms, agent_ms]
    return f"{markdown_table(header, rows)}\n\n{cpu}", raw


def _ingest(directory: Path) -> tuple[str, dict[str, Any]]:
    """Part 3: the driver's ingest rate, from workers that answer at once, small and large rows."""
    rows: list[tuple[str, ...]] = []
    raw: dict[str, Any] = {}
    for kb in (0, LARGE_REPLY_KB):
        pool, pids, _ = _pool(_instant_worker(kb))
        try:
            config = _config(directory, "http://127.0.0.1:9", 32)
            asyncio.run(collect_on_ray(config, workers=pool))  # warm
            samples = [
                _measured(
                    lambda pool=pool: asyncio.run(  # type: ignore[misc]
                        collect_on_ray(_config(directory, "http://127.0.0.1:9", 32), workers=pool)
                    ),
                    pids,
                )
                for _ in range(ROUNDS)
            ]
        finally:
            pool.close()
        size = "small rows" if kb == 0 else f"{LARGE_REPLY_KB} KiB rows"
        walls = [ROLLOUTS / s.wall for s in samples]
        by_cpu = [ROLLOUTS / s.own_cpu for s in samples]
        rows.append(
            (
                f"through Ray, 2 instant workers x 32, {size}",
                _median_range(walls, ",.0f"),
                _median_range(by_cpu, ",.0f"),
                _load(),
            )
        )
        raw[f"ray_{kb}kb_rows_per_s"] = walls
        raw[f"ray_{kb}kb_rows_per_driver_cpu_s"] = by_cpu
    local = [
        _measured(lambda: run_loop(_Instant(_config(directory, "http://127.0.0.1:9", 64)).run()), [])
        for _ in range(ROUNDS)
    ]
    rows.append(
        (
            "local collector, a dispatcher that answers at once, small rows",
            _median_range([ROLLOUTS / s.wall for s in local], ",.0f"),
            _median_range([ROLLOUTS / s.own_cpu for s in local], ",.0f"),
            _load(),
        )
    )
    header = (
        "the driver's ingest",
        "rows/s, wall (median, range)",
        "rows per CPU-second of the driver",
        "load",
    )
    return markdown_table(header, rows), raw


def _local_loop() -> str:
    factory = loop_factory()
    return "asyncio" if factory is None else f"{factory.__module__}"


def main() -> str:
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        _empty_actors(4)  # the idle worker processes Ray leaves for its first job: taken, untimed
        with tempfile.TemporaryDirectory() as scratch:
            directory = Path(scratch)
            parts: list[str] = []
            raw: dict[str, Any] = {}
            for title, part in (
                ("CPU per row", _cpu_per_row),
                ("a collector bound by its CPU", _cpu_bound),
                ("the driver's ingest rate", _ingest),
            ):
                started = _load()
                table, figures = part(directory)
                parts.append(
                    f"### {title} (load average {started} at the start, {_load()} at the end)\n\n{table}"
                )
                raw[title] = figures
                print(parts[-1] + "\n", flush=True)
    finally:
        ray.shutdown()
    rounded = json.dumps(
        {
            part: {name: [round(value, 4) for value in values] for name, values in figures.items()}
            for part, figures in raw.items()
        }
    )
    return f"samples: {rounded}"


if __name__ == "__main__":
    print(main())
