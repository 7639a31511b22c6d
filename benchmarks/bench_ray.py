"""Collection on a local Ray against the plain collector, same run, same agent: wall time of 2,000
rollouts (64 in flight in all), Ray's start-up, and the rate at which the driver takes and writes rows.

The agent is a real uvicorn server in its own process that takes 20 ms per rollout (an
`asyncio.sleep`) and answers a success. The plain collector runs at concurrency 64; the Ray run uses
two workers with 32 each, on a local Ray started once before the rounds (`ray.init` excluded, as on a
cluster that is up; the workers' own start is inside the Ray run's wall time, as a `collect --ray`
pays it, and shown apart). A third subject runs on a `RayWorkers` pool of two workers x 32, started
once before the rounds and kept through them (its start shown apart, as `ray.init`'s): the issue's
"Ray already started" setting, and what a training loop collecting a batch per step pays. Ray is
given four logical CPUs so the pool and a per-run subject's workers both fit. Rounds rotate the
three, each into a fresh output, and the medians are kept (`benchmarks/_timing.py`'s rule: ratios
against a baseline measured under the same drift).

Ray leaves a worker process per CPU idle for the first job after `ray.init`; a `collect --ray` that
joins a cluster already up is a new job and finds none, so each of its workers is a new process.
The bench takes those idle processes first (two empty actors, untimed), so that every timed Ray run
starts its workers as such a `collect --ray` does. Beside the workers' start, two empty actors'
start and end is Ray's own floor: a process each, that imports Ray and nothing of ours.

The driver's row rate is measured with a dispatcher that answers each attempt at once with a built
row: what is left is the collector's own queue, budget and row writing (`Collector._save`), the bound
on any cluster's throughput; beside it, a Ray run against the agent with no delay, which adds Ray's
own cost per attempt.

Run with `python -m benchmarks ray`; needs the ray, aiohttp and demo extras (not run by `make test`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks._timing import markdown_table
from gym_failures.collection import CollectionConfig, collect
from gym_failures.collection._attempt_row import AttemptFunction, AttemptRow
from gym_failures.collection._collector import Collector
from gym_failures.collection._resume import PendingRollout
from gym_failures.ray import RayCollector, RayWorkers, collect_on_ray

ROLLOUTS = 2000
ROUNDS = 5
_AGENT = """
import asyncio, sys
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

async def run(request: Request) -> JSONResponse:
    await request.body()
    await asyncio.sleep(float(sys.argv[2]))
    return JSONResponse({"result": {"reward": 1.0}})

app = Starlette(routes=[Route("/run", run, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


@contextlib.contextmanager
def _agent(delay_s: float) -> Iterator[str]:
    from tests.processes import free_port, stop, wait_listening

    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", _AGENT, str(port), str(delay_s)])
    try:
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def _config(directory: Path, agent_url: str, concurrency: int, **options: Any) -> CollectionConfig:
    tasks = directory / "tasks.jsonl"
    if not tasks.exists():
        tasks.write_text('{"id": "t"}\n' * ROLLOUTS)
    output = Path(tempfile.mkdtemp(dir=directory)) / "rollouts.jsonl"
    return CollectionConfig(
        input_path=tasks,
        output_path=output,
        agent_url=agent_url,
        concurrency=concurrency,
        max_attempts=3,
        **options,
    )


def _timed(run: Callable[[], object]) -> float:
    # The workers a Ray run ends exit after it returns: let them go before the next timed run starts,
    # as they would between two runs of `collect`, rather than bill their exit to whatever runs next.
    time.sleep(0.5)
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


class _Instant(Collector):
    """The collector with a dispatcher that answers each attempt at once: the driver's own cost."""

    @contextlib.asynccontextmanager
    async def dispatcher(self) -> AsyncIterator[AttemptFunction]:
        async def attempt(rollout: PendingRollout, number: int) -> AttemptRow:
            row: dict[str, Any] = {"task_index": rollout.task_index, "rollout_index": rollout.rollout_index}
            row.update({"rollout_id": f"{rollout.task_index}:{rollout.rollout_index}", "attempt": number})
            row.update({"result": {"reward": 1.0}, "reward": 1.0})
            return AttemptRow(row, succeeded=True, final=True)

        yield attempt


class _Timed(RayCollector):
    """A Ray run that notes when all its workers are up: the dispatch alone is timed from there."""

    ready_at = 0.0

    @contextlib.asynccontextmanager
    async def started_workers(self) -> AsyncIterator[list[Any]]:
        async with super().started_workers() as workers:
            noting = asyncio.ensure_future(self._note_ready(workers))
            try:
                yield workers
            finally:
                noting.cancel()

    async def _note_ready(self, workers: list[Any]) -> None:
        await asyncio.gather(*(worker.ready.remote() for worker in workers))
        self.ready_at = time.perf_counter()


class _WorkersOnly(RayCollector):
    """Start and end the Ray workers, dispatch nothing: their start-up cost alone."""

    async def start_and_end(self) -> None:
        async with self.started_workers() as workers:
            await asyncio.gather(*(worker.ready.remote() for worker in workers))


def _empty_actors(count: int = 2) -> None:
    """Start `count` actors that import nothing, and end them: what Ray's worker processes cost alone."""
    import ray

    class Empty:  # defined here, so Ray ships it by value and the worker imports nothing of ours
        def ready(self) -> bool:
            return True

    actors: list[Any] = [ray.remote(Empty).options(num_cpus=1).remote() for _ in range(count)]
    ray.get([actor.ready.remote() for actor in actors])
    for actor in actors:
        ray.kill(actor)


def _plain(directory: Path, agent: str) -> None:
    asyncio.run(collect(_config(directory, agent, 64)))


_DISPATCH_ONLY: list[float] = []
"""Each Ray run's wall time from its workers being up to its end."""


def _on_ray(directory: Path, agent: str) -> None:
    collector = _Timed(_config(directory, agent, 32), workers=2)
    asyncio.run(collector.run())
    _DISPATCH_ONLY.append(time.perf_counter() - collector.ready_at)


def _on_pool(directory: Path, agent: str, pool: RayWorkers) -> None:
    asyncio.run(collect_on_ray(_config(directory, agent, 32), workers=pool))


def _started_pool() -> tuple[RayWorkers, float]:
    """A pool of two workers, started and up: the pool and the seconds that took."""
    import ray

    started = time.perf_counter()
    pool = RayWorkers(workers=2).start()
    ray.get([worker.ready.remote() for worker in pool.handles])
    return pool, time.perf_counter() - started


def _workers_only(directory: Path, agent: str) -> None:
    asyncio.run(_WorkersOnly(_config(directory, agent, 32), workers=2).start_and_end())


def main() -> str:
    import ray

    started = time.perf_counter()
    # Four logical CPUs (the machine has two cores): the pool's two workers live through the rounds,
    # beside the two a per-run subject starts each time.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    ray_start_s = time.perf_counter() - started
    try:
        with tempfile.TemporaryDirectory() as scratch, _agent(0.020) as agent:
            directory = Path(scratch)
            plain: list[float] = []
            on_ray: list[float] = []
            pooled: list[float] = []
            workers: list[float] = []
            empty: list[float] = []
            # `ray.init` leaves a worker process per CPU idle for its first job: take them now, so that
            # every timed run (and the pool) starts its workers as a `collect --ray` joining a cluster
            # does (a new process each); the first would otherwise start on them.
            _empty_actors(4)
            time.sleep(0.5)
            pool, pool_start_s = _started_pool()
            subjects: list[tuple[list[float], Callable[[], None]]] = [
                (plain, functools.partial(_plain, directory, agent)),
                (on_ray, functools.partial(_on_ray, directory, agent)),
                (pooled, functools.partial(_on_pool, directory, agent, pool)),
            ]
            try:
                for index in range(ROUNDS):
                    # Rotate which goes first, so none always runs on a warmer machine.
                    for samples, run in subjects[index % 3 :] + subjects[: index % 3]:
                        samples.append(_timed(run))
                    workers.append(_timed(lambda: _workers_only(directory, agent)))
                    empty.append(_timed(_empty_actors))
            finally:
                pool.close()
            driver = [
                _timed(lambda: asyncio.run(_Instant(_config(directory, agent, 64)).run())) for _ in range(3)
            ]
        with tempfile.TemporaryDirectory() as scratch, _agent(0.0) as agent:
            directory = Path(scratch)
            fastest = [_timed(lambda: _on_ray(directory, agent)) for _ in range(3)]
    finally:
        ray.shutdown()
    dispatch_only = _DISPATCH_ONLY[:ROUNDS]
    plain_s, ray_s, dispatch_s, pooled_s = (
        statistics.median(plain),
        statistics.median(on_ray),
        statistics.median(dispatch_only),
        statistics.median(pooled),
    )
    ratio = ray_s / plain_s
    rows = [
        (
            "plain collector, concurrency 64 (baseline)",
            f"{plain_s:.2f}",
            "1.00x",
            f"{ROLLOUTS / plain_s:.0f}",
            "",
        ),
        (
            "Ray, 2 workers x 32 (workers' start included)",
            f"{ray_s:.2f}",
            f"{ratio:.2f}x",
            f"{ROLLOUTS / ray_s:.0f}",
            "≤ 1.2x: " + ("met" if ratio <= 1.2 else "missed"),
        ),
        (
            "Ray, 2 workers x 32, from the workers up",
            f"{dispatch_s:.2f}",
            f"{dispatch_s / plain_s:.2f}x",
            f"{ROLLOUTS / dispatch_s:.0f}",
            "≤ 1.2x: " + ("met" if dispatch_s / plain_s <= 1.2 else "missed"),
        ),
        (
            "Ray, pool of 2 workers x 32, started once before the rounds",
            f"{pooled_s:.2f}",
            f"{pooled_s / plain_s:.2f}x",
            f"{ROLLOUTS / pooled_s:.0f}",
            "≤ 1.2x: " + ("met" if pooled_s / plain_s <= 1.2 else "missed"),
        ),
    ]
    table = markdown_table(
        ("2,000 rollouts, agent 20 ms", "median wall (s)", "vs baseline", "rollouts/s", "target"), rows
    )
    extra = markdown_table(
        ("figure", "value"),
        [
            ("`ray.init(num_cpus=4)`, a local Ray's start (once)", f"{ray_start_s:.2f} s"),
            ("the pool's 2 workers started and up (once)", f"{pool_start_s:.2f} s"),
            ("2 Ray workers started and ended (median)", f"{statistics.median(workers):.2f} s"),
            (
                "2 empty Ray actors started and ended (median): Ray's own floor",
                f"{statistics.median(empty):.2f} s",
            ),
            (
                "driver alone: rows taken and written per second",
                f"{ROLLOUTS / statistics.median(driver):,.0f}",
            ),
            (
                "Ray run, agent with no delay: rows per second",
                f"{ROLLOUTS / statistics.median(fastest):,.0f}",
            ),
        ],
    )
    figures = {
        "plain": plain,
        "ray": on_ray,
        "ray_from_workers_up": dispatch_only,
        "pool": pooled,
        "workers": workers,
        "empty_actors": empty,
        "driver": driver,
        "fastest": fastest,
    }
    raw = json.dumps({name: [round(value, 3) for value in values] for name, values in figures.items()})
    return f"{table}\n\n{extra}\n\nsamples (s): {raw}"


if __name__ == "__main__":
    print(main())
