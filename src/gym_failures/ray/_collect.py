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
- A worker not back within the attempt timeout (`timeout_s`), or that Ray will not restart, hands
  its rollouts to the other workers; when every worker is gone the run ends with a
  `CollectionFailure` (`collection_dispatch_failed`, `gym-failures collect` exit status 1) and the
  rollouts left have no final row, for a resume to finish.
- A driver killed mid-run leaves no row for the attempts in flight; its workers die with it (Ray ends
  an owner's actors), and the resume dispatches those attempts again, as after a local kill.
- The driver joins the Ray this process already runs, else `ray.init(address)` (no address: Ray's
  own rule, `RAY_ADDRESS` or the cluster last started on this machine, else a new local Ray), and
  then calls `ray.shutdown` when the run ends, cancelled or not: a local Ray it started is stopped,
  a cluster is only disconnected from. The workers it started are always ended.
- The workers are asked for first, before the driver reads the tasks and the manifest, and each is
  fed from the moment it is up, not once all are: a worker's start (a Python process that imports
  Ray, pydantic, aiohttp and the collector) is most of what a short run pays for Ray. The run's id
  travels with each exchange, as the workers start before the driver has read the manifest.
- Workers ask one CPU each, and are spread over the cluster's nodes (`SPREAD`). When a worker is not
  up within the attempt timeout (no CPU free for it) while rollouts are open, the run sends no more
  attempts, saves the rows of those in flight on the workers that did start, and ends with a
  `CollectionFailure` (`collection_dispatch_failed`) that says how many workers did not start; the
  next `collect`, with fewer workers, resumes it. A run whose rollouts are all final first just ends
  the workers that never started.
- The workers need `gym-failures[aiohttp]` installed where they run (the cluster's image); no
  runtime environment is shipped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

import ray
import ray.exceptions

from gym_failures.collection import CollectionConfig, CollectionSummary, RowWriter
from gym_failures.collection._run import AttemptDispatcher, AttemptRow, Collector, PendingRollout
from gym_failures.failure_kinds import COLLECTION_DISPATCH_FAILED
from gym_failures.failures import CollectionFailure, exception_type_name
from gym_failures.ray import gym_failure_of
from gym_failures.rows import rollout_id
from gym_failures.telemetry import CollectionProgress

_Work = tuple[int, PendingRollout, int]
"""An attempt sent to a worker: its ticket (unique in the run), the rollout, the attempt number."""


class _AttemptWorker:
    """A Ray actor's body: one `AttemptDispatcher`, entered in the actor's own event loop, running
    at most `concurrency` attempts at once; the attempts it was given wait their turn here."""

    def __init__(self, config: CollectionConfig) -> None:
        self._config = config
        self._dispatcher: AttemptDispatcher | None = None
        self._slots: asyncio.Semaphore | None = None
        self._done: list[tuple[int, AttemptRow]] = []
        self._ready: asyncio.Event | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._incarnation = secrets.token_hex(8)
        """Made anew when Ray restarts the worker: what it held before is gone."""

    async def exchange(self, run_id: str, work: list[_Work]) -> tuple[str, list[tuple[int, AttemptRow]]]:
        """Start `work` (attempts of run `run_id`), then wait for at least one row and return every row
        finished since the last exchange (with its ticket), beside this incarnation's token; nothing
        to wait for returns at once."""
        if self._dispatcher is None:
            # No await between the test and the set: concurrent first calls enter once. The run's id
            # comes with the work: the worker starts before the driver has read the manifest.
            self._dispatcher = AttemptDispatcher(self._config, run_id)
            self._slots = asyncio.Semaphore(self._config.concurrency)
            self._ready = asyncio.Event()
            await self._dispatcher.__aenter__()
        assert self._ready is not None
        for ticket, rollout, attempt in work:
            task = asyncio.create_task(self._run(ticket, rollout, attempt))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        if not self._done and self._running:
            await self._ready.wait()
        done, self._done = self._done, []
        self._ready.clear()
        return self._incarnation, done

    async def _run(self, ticket: int, rollout: PendingRollout, attempt: int) -> None:
        assert self._dispatcher is not None
        assert self._slots is not None
        assert self._ready is not None
        async with self._slots:
            try:
                row = await self._dispatcher.row(rollout, attempt)
            except Exception as error:
                # `row` records every failed attempt itself; this is a fault of the worker, and
                # an attempt without its row would hold its rollout forever.
                row = self._dispatcher.failure_row(rollout, attempt, _lost(error, rollout, attempt))
        self._done.append((ticket, row))
        self._ready.set()

    def ready(self) -> bool:
        return True


class RayCollector(Collector):
    """A `Collector` whose attempts run on `workers` Ray workers, each with the config's concurrency.

    `address` is a Ray cluster's address (`ray.init(address)`); `None` joins the Ray this process
    already runs, else Ray's own choice (`RAY_ADDRESS`, else a new local Ray) for the run's duration.
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
        self._tickets = itertools.count()
        self._open = 0
        """Rollouts of this run without a final outcome yet."""
        self._stopping = False
        """No attempt is sent any more: the attempts in flight come back, then the run ends."""
        self._changed = asyncio.Condition()

    async def run(self) -> CollectionSummary:
        # The workers start (a process each) while the driver takes its lock, reads the tasks and
        # the manifest and opens its files, rather than after.
        async with self.started_workers():
            return await super().run()

    def in_flight(self) -> int:
        return self.worker_count * self.config.concurrency

    async def dispatch_rollouts(
        self, rollouts: list[PendingRollout], successes: RowWriter, failures: RowWriter
    ) -> None:
        """Feed every worker from one queue, each from the moment it is up; a feeder keeps the
        rollouts it took (their retries included) until they are final, or hands them back when its
        worker is gone for good."""
        if not rollouts:
            return
        queue = collections.deque((rollout, rollout.next_attempt) for rollout in rollouts)
        self._open = len(rollouts)
        self._stopping = False
        self._changed = asyncio.Condition()
        up = [asyncio.ensure_future(worker.ready.remote()) for worker in self.workers]
        lost = AttemptDispatcher(self.config, self.run_id)
        feeders = [
            asyncio.create_task(self._feed(worker, started, queue, lost, successes, failures))
            for worker, started in zip(self.workers, up, strict=True)
        ]
        placement = asyncio.create_task(self._placed(up))
        try:
            await asyncio.gather(*feeders)
            not_started = placement.result() if placement.done() else 0
        finally:
            for task in (*feeders, placement, *up):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*feeders, placement, *up, return_exceptions=True)
        if self._open and not_started:
            raise CollectionFailure(
                failure_kind=COLLECTION_DISPATCH_FAILED,
                failure_reason=(
                    f"{not_started} of {len(self.workers)} Ray workers did not start within "
                    f"{self.config.timeout_s:g} s (each asks for one CPU; the cluster has "
                    f"{_cluster_cpus():g}); {self._open} rollout(s) have no final outcome yet: collect "
                    "again with fewer workers to resume them"
                ),
            )
        if self._open:
            raise CollectionFailure(
                failure_kind=COLLECTION_DISPATCH_FAILED,
                failure_reason=(
                    f"every Ray worker was lost and did not come back; {self._open} rollout(s) have no "
                    "final outcome yet: collect again to resume them"
                ),
            )

    async def _placed(self, up: list[asyncio.Future[Any]]) -> int:
        """How many workers did not start within the attempt timeout; when some did not and rollouts
        are open, the run stops: a worker Ray cannot place (no CPU free for it) would otherwise hold
        the run forever without a word. The workers that did start go on meanwhile."""
        _, waiting = await asyncio.wait(up, timeout=self.config.timeout_s)
        if waiting:
            async with self._changed:
                self._stopping = True
                self._changed.notify_all()
        return len(waiting)

    async def _came_up(self, started: asyncio.Future[Any]) -> bool:
        """Wait until the worker answers (True), or the run no longer needs it (False)."""
        ended = asyncio.ensure_future(self._no_more_wanted())
        try:
            await asyncio.wait({started, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
        return started.done() and not self._stopping and self._open > 0

    async def _no_more_wanted(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._open == 0 or self._stopping)

    async def _feed(
        self,
        worker: Any,
        started: asyncio.Future[Any],
        queue: collections.deque[tuple[PendingRollout, int]],
        lost: AttemptDispatcher,
        successes: RowWriter,
        failures: RowWriter,
    ) -> None:
        if not await self._came_up(started):
            return
        # What this worker was given and has not answered, by ticket; and this feeder's retries.
        sent: dict[int, tuple[PendingRollout, int]] = {}
        retries: collections.deque[tuple[PendingRollout, int]] = collections.deque()
        # A few more than the worker runs at once wait in the worker, so no slot idles for a round trip.
        capacity = self.config.concurrency + max(1, self.config.concurrency // 4)
        incarnation: str | None = None
        while True:
            work: list[_Work] = []
            while not self._stopping and len(sent) + len(work) < capacity and (retries or queue):
                rollout, attempt = retries.popleft() if retries else queue.popleft()
                work.append((next(self._tickets), rollout, attempt))
            if not sent and not work:
                if self._stopping:
                    return
                # Nothing here: wait for rollouts a lost worker's feeder hands back, or the end.
                async with self._changed:
                    await self._changed.wait_for(lambda: bool(queue) or self._open == 0 or self._stopping)
                if self._open == 0:
                    return
                continue
            held = sorted(sent)
            sent.update((ticket, (rollout, attempt)) for ticket, rollout, attempt in work)
            gone: BaseException | None = None
            try:
                token, done = await worker.exchange.remote(self.run_id, work)
            except ray.exceptions.RayError as error:
                # The worker was lost: every attempt it held may have reached the agent.
                gone, incarnation = error, None
                done = [
                    (ticket, lost.failure_row(rollout, attempt, _lost(error, rollout, attempt)))
                    for ticket, (rollout, attempt) in sorted(sent.items())
                ]
            else:
                if incarnation is not None and token != incarnation:
                    # Ray restarted the worker between two exchanges: what it held before is lost.
                    done.extend((ticket, _restarted_row(lost, *sent[ticket])) for ticket in held)
                incarnation = token
            finished = 0
            for ticket, outcome in done:
                rollout, attempt = sent.pop(ticket)
                if self.record(outcome, successes, failures):
                    retries.append((rollout, attempt + 1))
                else:
                    finished += 1
            # A worker Ray cannot bring back hands its rollouts to the others, and its feeder ends.
            handed_back = gone is not None and not await self._restarted(worker)
            if handed_back:
                queue.extend(retries)
                retries.clear()
            if finished or handed_back:
                async with self._changed:
                    self._open -= finished
                    self._changed.notify_all()
            if handed_back:
                return

    async def _restarted(self, worker: Any) -> bool:
        """Whether a lost worker is back (Ray restarts it) within the attempt timeout."""
        try:
            await asyncio.wait_for(worker.ready.remote(), self.config.timeout_s)
        except (ray.exceptions.RayError, TimeoutError):
            return False
        return True

    @contextlib.asynccontextmanager
    async def started_workers(self) -> AsyncIterator[list[Any]]:
        """Ray joined (or started) and the workers asked for, for the block (they start meanwhile:
        nothing here waits for them); the workers are always ended, and a Ray this run started is
        shut down."""
        # `ray.shutdown` ends what `ray.init` started here (a local Ray), and only disconnects from
        # a cluster that was already up: a Ray this process already ran is left as it was.
        started = not ray.is_initialized()
        if started:
            ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
        try:
            actor = ray.remote(_AttemptWorker).options(
                num_cpus=1,
                max_concurrency=2,
                max_restarts=-1,
                max_task_retries=0,
                scheduling_strategy="SPREAD",
            )
            self.workers = [actor.remote(self.config) for _ in range(self.worker_count)]
            yield self.workers
        finally:
            for worker in self.workers:
                with contextlib.suppress(Exception):
                    ray.kill(worker)
            self.workers = []
            if started:
                ray.shutdown()


def _restarted_row(lost: AttemptDispatcher, rollout: PendingRollout, attempt: int) -> AttemptRow:
    key = rollout_id(rollout.task_index, rollout.rollout_index)
    failure = CollectionFailure(
        failure_kind=COLLECTION_DISPATCH_FAILED,
        failure_reason=f"attempt {attempt} of {key}: its Ray worker was restarted; it may have run",
    )
    return lost.failure_row(rollout, attempt, failure)


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


def _cluster_cpus() -> float:
    resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return resources.get("CPU", 0.0)
