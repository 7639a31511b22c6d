"""The collector with its attempts dispatched by Ray workers; the driver alone saves the rows.

Each worker is a Ray actor holding an `AttemptDispatcher` (the collector's own "dispatch one attempt,
build its row"), running up to `concurrency` attempts at once in its event loop. The driver keeps
the queue, the attempt budgets, the manifest, the lock and every row (the collector's one `_save`
point), so a Ray run's directory is a local run's: `summarize`, `gate`, `explain` and resume read it
alike, and a run may be resumed locally or on Ray, either way round.

Decisions:
- An attempt is sent to the worker with the fewest attempts in flight; in all, `workers` times
  `concurrency` attempts are in flight.
- A worker lost with attempts in flight (its actor or node died): each such attempt is recorded as a
  `collection_dispatch_failed` failure row, delivery `possibly_delivered` (it may have reached the
  agent), not final, and retried within the attempt budget, as any other attempt that may have
  been delivered (`replay_possibly_delivered`). Ray restarts the worker (`max_restarts=-1`); Ray
  itself never retries the call (`max_task_retries=0`), so every attempt has exactly one row.
- A driver killed mid-run leaves no row for the attempts in flight; its workers die with it (Ray ends
  an owner's actors), and the resume dispatches those attempts again, as after a local kill.
- The driver joins the Ray this process already runs, else `ray.init(address)` (no address: Ray's
  own rule, `RAY_ADDRESS` or the cluster last started on this machine, else a new local Ray), and
  then calls `ray.shutdown` when the run ends, cancelled or not: a local Ray it started is stopped,
  a cluster is only disconnected from. The workers it started are always ended.
- Workers ask one CPU each, and are spread over the cluster's nodes (`SPREAD`).
- The workers need `gym-failures[aiohttp]` installed where they run (the cluster's image); no
  runtime environment is shipped.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import ray
import ray.exceptions

from gym_failures.collection import CollectionConfig, CollectionSummary
from gym_failures.collection._run import (
    AttemptDispatcher,
    AttemptFunction,
    AttemptRow,
    Collector,
    PendingRollout,
)
from gym_failures.failure_kinds import COLLECTION_DISPATCH_FAILED
from gym_failures.failures import CollectionFailure, exception_type_name
from gym_failures.ray import gym_failure_of
from gym_failures.rows import rollout_id
from gym_failures.telemetry import CollectionProgress


class _AttemptWorker:
    """A Ray actor's body: one `AttemptDispatcher`, entered in the actor's own event loop."""

    def __init__(self, config: CollectionConfig, run_id: str) -> None:
        self._dispatcher = AttemptDispatcher(config, run_id)
        self._entered = False

    async def row(self, rollout: PendingRollout, attempt: int) -> AttemptRow:
        if not self._entered:
            # No await between the test and the set: concurrent first calls enter once.
            self._entered = True
            await self._dispatcher.__aenter__()
        return await self._dispatcher.row(rollout, attempt)

    def ready(self) -> bool:
        return True


class RayCollector(Collector):
    """A `Collector` whose attempts run on `workers` Ray workers, each with the config's concurrency.

    `address` is a Ray cluster's address (`ray.init(address)`); `None` connects to the Ray this
    process already runs, else to `RAY_ADDRESS`, else starts a local Ray for the run's duration.
    """

    def __init__(
        self,
        config: CollectionConfig,
        on_progress: Callable[[CollectionProgress], None] | None = None,
        *,
        workers: int = 2,
        address: str | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        super().__init__(config, on_progress)
        self.worker_count = workers
        self.address = address
        self.workers: list[Any] = []
        """The running workers' actor handles (for tests and operators; empty outside a run)."""

    def in_flight(self) -> int:
        return self.worker_count * self.config.concurrency

    @contextlib.asynccontextmanager
    async def dispatcher(self) -> AsyncIterator[AttemptFunction]:
        # `ray.shutdown` ends what `ray.init` started here (a local Ray), and only disconnects from
        # a cluster that was already up: a Ray this process already ran is left as it was.
        started = not ray.is_initialized()
        if started:
            ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
        try:
            actor = ray.remote(_AttemptWorker).options(
                num_cpus=1,
                max_concurrency=self.config.concurrency + 1,
                max_restarts=-1,
                max_task_retries=0,
                scheduling_strategy="SPREAD",
            )
            self.workers = [actor.remote(self.config, self.run_id) for _ in range(self.worker_count)]
            await _all_ready(self.workers)
            yield _Pool(self.workers, AttemptDispatcher(self.config, self.run_id)).attempt
        finally:
            for worker in self.workers:
                with contextlib.suppress(Exception):
                    ray.kill(worker)
            self.workers = []
            if started:
                ray.shutdown()


async def _all_ready(workers: list[Any]) -> None:
    for worker in workers:
        await worker.ready.remote()


class _Pool:
    """Route each attempt to the worker with the fewest in flight; a lost worker's attempt is a row."""

    def __init__(self, workers: list[Any], local: AttemptDispatcher) -> None:
        self._workers = workers
        self._load = [0] * len(workers)
        self._local = local

    async def attempt(self, rollout: PendingRollout, attempt: int) -> AttemptRow:
        index = min(range(len(self._workers)), key=self._load.__getitem__)
        self._load[index] += 1
        try:
            row: AttemptRow = await self._workers[index].row.remote(rollout, attempt)
            return row
        except ray.exceptions.RayError as error:
            return self._local.failure_row(rollout, attempt, _lost(error, rollout, attempt))
        finally:
            self._load[index] -= 1


def _lost(error: BaseException, rollout: PendingRollout, attempt: int) -> CollectionFailure:
    failure = gym_failure_of(error)
    if isinstance(failure, CollectionFailure):
        return failure
    # A Gym failure raised out of a worker: the dispatcher records failed attempts as rows, so this
    # is a fault of the worker itself.
    key = rollout_id(rollout.task_index, rollout.rollout_index)
    lost = CollectionFailure(
        failure_kind=COLLECTION_DISPATCH_FAILED,
        failure_reason=f"attempt {attempt} of {key}: the Ray worker failed ({type(error).__name__})",
        exception_type=exception_type_name(error),
    )
    lost.__cause__ = failure
    return lost


async def collect_on_ray(
    config: CollectionConfig,
    on_progress: Callable[[CollectionProgress], None] | None = None,
    *,
    workers: int = 2,
    address: str | None = None,
) -> CollectionSummary:
    """Run one collection on Ray workers (resuming what is on disk) and return its summary."""
    return await RayCollector(config, on_progress, workers=workers, address=address).run()
