"""The collector with its attempts dispatched by Ray workers; the driver alone saves the rows.

Each worker is a Ray actor holding an `AttemptDispatcher` (the collector's own "dispatch one attempt,
build its row"), running up to `concurrency` attempts at once in its event loop. The driver keeps
the queue, the attempt budgets, the manifest, the lock and every row (the collector's one `_save`
point), so a Ray run's directory is a local run's: `summarize`, `gate`, `explain` and resume read it
alike, and a run may be resumed locally or on Ray, either way round.

`RayWorkers` and the actor each worker runs are in `_pool`; what runs in a worker for one run (its
batches of rows, success rows encoded) in `_worker_run`. `RayWorkers` and `RayJoinError` are
re-exported here, where `gym_failures.ray` loads its collection names from.

Decisions:
- An attempt is sent to the worker with the fewest attempts in flight; in all, `workers` times
  `concurrency` attempts are in flight.
- A worker lost with attempts in flight (its actor or node died): each such attempt is recorded as a
  `collection_dispatch_failed` failure row, delivery `possibly_delivered` (it may have reached the
  agent), not final, and retried within the attempt budget, as any other attempt that may have
  been delivered (`replay_possibly_delivered`). Ray restarts the worker (`max_restarts=-1`); Ray
  itself never retries the call (`max_task_retries=0`), so every attempt has exactly one row.
- An exchange that waits longer than the attempt timeout and `_EXCHANGE_GRACE_S` (a worker holding
  attempts answers within the attempt timeout) counts its worker as lost: a frozen process or a
  hung node never holds the run. A worker Ray reports out of reach (`ActorUnavailableError`) counts
  as lost too; the rows its attempts still make are dropped, as those attempts have rows already.
- A worker not back within the attempt timeout (and at least `_MIN_START_S`, a new process's start),
  or that Ray will not restart, hands its rollouts to the other workers; when every worker is gone
  the run ends with a `CollectionFailure` (`collection_dispatch_failed`, `gym-failures collect`
  exit status 1) and the rollouts left have no final row, for a resume to finish.
- A driver killed mid-run leaves no row for the attempts in flight; its workers die with it (Ray ends
  an owner's actors), and the resume dispatches those attempts again, as after a local kill.
- The workers are asked for first, before the driver reads the tasks and the manifest, and each is
  fed from the moment it is up, not once all are: a worker's start (a Python process that imports
  Ray, pydantic, aiohttp and the collector) is most of what a short run pays for Ray. The run's id
  travels with each exchange, as the workers start before the driver has read the manifest.
- When a worker is not up within the attempt timeout and at least `_MIN_START_S` (no CPU free for
  it: each asks for one) while rollouts are open, the run sends no more attempts, saves the rows of
  those in flight on the workers that did start, and ends with a `CollectionFailure`
  (`collection_dispatch_failed`) that says how many workers did not start; the next `collect`, with
  fewer workers, resumes it. A run whose rollouts are all final first just ends the workers that
  never started.
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
from gym_failures.collection._attempt_row import AttemptRow
from gym_failures.collection._collector import Collector, dispatcher_for, without_outcome
from gym_failures.collection._dispatcher import AttemptDispatcher
from gym_failures.collection._pacing import Clock
from gym_failures.collection._resume import PendingRollout
from gym_failures.collection._schedule import Retry
from gym_failures.failure_kinds import COLLECTION_DISPATCH_FAILED
from gym_failures.failures import CollectionFailure
from gym_failures.ray._pool import RayJoinError, RayWorkers
from gym_failures.ray._worker_run import EncodedRow, Work, decoded, lost_attempt, queued_beyond
from gym_failures.redaction import has_registered_secrets
from gym_failures.rows import rollout_id
from gym_failures.telemetry import CollectionProgress, RolloutOutcome

__all__ = ["RayCollector", "RayJoinError", "RayWorkers", "collect_on_ray"]

_MIN_START_S = 60.0
"""A worker is given at least this long to start (a new Python process that imports Ray, pydantic,
aiohttp and the collector; longer on a busy node), whatever the attempt timeout."""

_EXCHANGE_GRACE_S = 30.0
"""Beyond the attempt timeout, how long an exchange may take before its worker counts as lost: a
worker holding attempts answers within the attempt timeout, as each attempt is bounded by it."""


class RayCollector(Collector):
    """A `Collector` whose attempts run on Ray workers, each with the config's concurrency.

    A retried rollout backs off (or waits out its hint) on the driver, then goes back to the shared
    queue, ahead of the rollouts not yet tried. No readiness wait: the driver may not reach the agent
    the workers reach.

    `workers` is a number of workers started for the run and ended after it, or a `RayWorkers` pool
    (used, never ended, by the run). `address` is a Ray cluster's address (`ray.init(address)`) for
    workers started for the run; `None` joins the Ray this process already runs, else Ray's own
    choice (`RAY_ADDRESS`, else a new local Ray) for the run's duration. A pool has its own address.
    """

    def __init__(
        self,
        config: CollectionConfig,
        on_progress: Callable[[CollectionProgress], None] | None = None,
        *,
        workers: int | RayWorkers = 2,
        address: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        if isinstance(workers, RayWorkers):
            if address is not None:
                raise ValueError("address goes to the RayWorkers pool, not to a run on it")
            self.pool: RayWorkers | None = workers
            self.worker_count = workers.size
        else:
            if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
                raise ValueError(f"workers must be a whole number of at least 1, not {workers!r}")
            self.pool = None
            self.worker_count = workers
        super().__init__(config, on_progress, clock=clock)
        self.address = address
        self._key = ""
        """This run's key in the workers, new each run (the manifest's run id is kept across resumes)."""
        self._fed: list[Any] = []
        """The workers this run sent attempts to, but those handed back."""
        self._handed_back: list[Any] = []
        """The workers this run lost and handed their rollouts back from: frozen, or gone."""
        self.workers: list[Any] = []
        """The running workers' actor handles (for tests and operators; empty outside a run)."""
        self._tickets = itertools.count()
        self._open = 0
        """Rollouts of this run without a final outcome yet."""
        self._stopping = False
        """No attempt is sent any more: the attempts in flight come back, then the run ends."""
        self._changed = asyncio.Condition()
        self._backing_off: set[asyncio.Task[None]] = set()
        """Rollouts waiting out their backoff or hint, each put back in the queue when it ends."""
        self._encoded: EncodedRow | None = None
        """The worker-encoded row `record_attempt` is saving, for `_save`."""

    async def run(self) -> CollectionSummary:
        # The workers start (a process each) while the driver takes its lock, reads the tasks and
        # the manifest and opens its files, rather than after.
        async with self.started_workers():
            return await super().run()

    def in_flight(self) -> int:
        return self.worker_count * self.config.concurrency

    def record_attempt(self, outcome: AttemptRow, successes: RowWriter, failures: RowWriter) -> Retry | None:
        """The collector's own `record_attempt`; a row the worker encoded (`EncodedRow`) is written
        as the worker encoded it (`_save`), unless a secret was registered here since it was asked
        for: then it is decoded, and saved as any row, redacted here."""
        if not isinstance(outcome, EncodedRow):
            return super().record_attempt(outcome, successes, failures)
        if has_registered_secrets():
            return super().record_attempt(decoded(outcome), successes, failures)
        self._encoded = outcome
        try:
            return super().record_attempt(outcome, successes, failures)
        finally:
            self._encoded = None

    def _line_of(self, row: dict[str, Any]) -> tuple[bytes, RolloutOutcome]:
        """The line and outcome the worker made, for the row it encoded; else the collector's own."""
        encoded = self._encoded
        if encoded is None or row is not encoded.row or encoded.outcome is None:
            return super()._line_of(row)
        return encoded.line, encoded.outcome

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
        up: list[asyncio.Future[Any]] = [asyncio.ensure_future(_answered(worker)) for worker in self.workers]
        lost = dispatcher_for(self.config, self.run_id)
        feeders = [
            asyncio.create_task(self._feed(worker, started, queue, lost, successes, failures))
            for worker, started in zip(self.workers, up, strict=True)
        ]
        placement = asyncio.create_task(self._placed(up))
        try:
            await asyncio.gather(*feeders)
            not_started = placement.result() if placement.done() else 0
        finally:
            for task in (*feeders, placement, *up, *self._backing_off):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*feeders, placement, *up, return_exceptions=True)
        if self._open and not_started:
            raise CollectionFailure(
                failure_kind=COLLECTION_DISPATCH_FAILED,
                failure_reason=(
                    f"{not_started} of {len(self.workers)} Ray workers did not start within "
                    f"{self._start_timeout():g} s (each asks for one CPU; the cluster has "
                    f"{_cluster_cpus():g}); {without_outcome(self._open)}: collect "
                    f"again with {'a smaller pool' if self.pool is not None else 'fewer workers'} "
                    "to resume them"
                ),
            )
        if self._open:
            raise CollectionFailure(
                failure_kind=COLLECTION_DISPATCH_FAILED,
                failure_reason=(
                    f"every Ray worker was lost and did not come back; {without_outcome(self._open)}: "
                    "collect again to resume them"
                ),
            )

    async def _placed(self, up: list[asyncio.Future[Any]]) -> int:
        """How many workers did not start in time (`_start_timeout`); when some did not and rollouts
        are open, the run stops: a worker Ray cannot place (no CPU free for it) would otherwise hold
        the run forever without a word. The workers that did start go on meanwhile."""
        waiting = await self._start_window(up)
        if waiting:
            async with self._changed:
                self._stopping = True
                self._changed.notify_all()
        return len(waiting)

    async def _start_window(self, up: list[asyncio.Future[Any]]) -> set[asyncio.Future[Any]]:
        """The workers still not up when the start window (`_start_timeout` from now) closes."""
        _, waiting = await asyncio.wait(up, timeout=self._start_timeout())
        return waiting

    def _start_timeout(self) -> float:
        return max(self.config.timeout_s, _MIN_START_S)

    async def _came_up(self, started: asyncio.Future[Any]) -> bool:
        """Wait until the worker answers (True), or the run no longer needs it (False)."""
        ended = asyncio.ensure_future(self._no_more_wanted())
        try:
            await asyncio.wait({started, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
        if started.done() and started.exception() is not None:
            return False  # gone for good before the run (a pool's worker Ray would not restart)
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
        self._fed.append(worker)
        # What this worker was given and has not answered, by ticket; and this feeder's retries.
        sent: dict[int, tuple[PendingRollout, int]] = {}
        retries: collections.deque[tuple[PendingRollout, int]] = collections.deque()
        # A few more than the worker runs at once wait in the worker, so no slot idles for a round trip.
        capacity = self.config.concurrency + queued_beyond(self.config.concurrency)
        incarnation: str | None = None
        while True:
            work: list[Work] = []
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
                token, done = await asyncio.wait_for(
                    worker.exchange.remote(
                        self._key, self.config, self.run_id, work, not has_registered_secrets()
                    ),
                    self.config.timeout_s + _EXCHANGE_GRACE_S,
                )
            except (ray.exceptions.RayError, TimeoutError) as error:
                # The worker was lost, or froze: every attempt it held may have reached the agent.
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
            finished = self._record(done, sent, retries, queue, (successes, failures))
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
                self._fed.remove(worker)
                self._handed_back.append(worker)
                return

    def _record(
        self,
        done: list[tuple[int, AttemptRow]],
        sent: dict[int, tuple[PendingRollout, int]],
        retries: collections.deque[tuple[PendingRollout, int]],
        queue: collections.deque[tuple[PendingRollout, int]],
        writers: tuple[RowWriter, RowWriter],
    ) -> int:
        """Record the outcomes of an exchange (`done`, by ticket), each taken out of `sent`; an attempt
        to retry now goes to `retries`, one backing off to the `queue` once its wait ends. The rollouts
        finished."""
        finished = 0
        for ticket, outcome in done:
            if ticket not in sent:
                # Recorded already, as lost: the worker was only out of reach (Ray's
                # `ActorUnavailableError` while it ran on), and its attempt finished after all.
                continue
            rollout, attempt = sent.pop(ticket)
            retry = self.record_attempt(outcome, *writers)
            if retry is None:
                finished += 1
            elif retry.wait_s <= 0:
                retries.append((rollout, attempt + 1))
            else:
                # Backing off: not this feeder's any more; any worker's once the wait ends.
                self._back_off(retry.wait_s, rollout, attempt + 1, queue)
        return finished

    def _back_off(
        self,
        wait_s: float,
        rollout: PendingRollout,
        attempt: int,
        queue: collections.deque[tuple[PendingRollout, int]],
    ) -> None:
        async def later() -> None:
            await self.clock.sleep(wait_s)
            async with self._changed:
                queue.appendleft((rollout, attempt))  # ahead of the rollouts not yet tried
                self._changed.notify_all()

        task = asyncio.create_task(later())
        self._backing_off.add(task)
        task.add_done_callback(self._backing_off.discard)

    async def _restarted(self, worker: Any) -> bool:
        """Whether a lost worker is back (Ray restarts it: a new process) within the time a worker
        is given to start."""
        try:
            await asyncio.wait_for(_answered(worker), self._start_timeout())
        except (ray.exceptions.RayError, TimeoutError):
            return False
        return True

    @contextlib.asynccontextmanager
    async def started_workers(self) -> AsyncIterator[list[Any]]:
        """The run's workers, for the block: the pool's, or workers asked for now (they start
        meanwhile: nothing here waits for them) and always ended after the block, with a Ray this
        run started shut down. A pool's workers close the run's state when it ends."""
        self._key = secrets.token_hex(8)
        owned = self.pool is None
        pool = RayWorkers(self.worker_count, address=self.address) if self.pool is None else self.pool
        try:
            if owned:
                pool.start()
            with pool.claimed(self._key) as workers:
                self.workers, self._fed, self._handed_back = workers, [], []
                try:
                    yield workers
                except BaseException:
                    if not owned:
                        # Not awaited: a cancelled run cannot wait; the next run's first exchange
                        # closes the state anyway. Sent, it stops this run's attempts still running.
                        for worker in workers:
                            with contextlib.suppress(Exception):
                                worker.end_run.remote(self._key)
                    raise
                finally:
                    self.workers = []
                if not owned:
                    await self._end_run(self._fed, self._handed_back)
        finally:
            if owned:
                pool.close()

    async def _end_run(self, workers: list[Any], handed_back: list[Any]) -> None:
        """Have the workers this run fed close its state (their client sessions), within the attempt
        timeout. A worker handed back (lost, and not back within its start time) is told too but not
        waited for: a frozen one would hold the run's end for the whole timeout, and closes the
        state when it answers again (a dead one has none)."""
        for worker in handed_back:
            with contextlib.suppress(Exception):
                worker.end_run.remote(self._key)
        ends = [worker.end_run.remote(self._key) for worker in workers]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*ends, return_exceptions=True), self.config.timeout_s)


async def _answered(worker: Any) -> None:
    """Wait until `worker` answers; Ray's error when it is gone for good. A worker Ray is restarting
    refuses calls for a moment (`ActorUnavailableError`) rather than queueing them: ask again."""
    while True:
        try:
            await worker.ready.remote()
        except ray.exceptions.ActorUnavailableError:
            await asyncio.sleep(0.05)
        else:
            return


def _restarted_row(lost: AttemptDispatcher, rollout: PendingRollout, attempt: int) -> AttemptRow:
    key = rollout_id(rollout.task_index, rollout.rollout_index)
    failure = CollectionFailure(
        failure_kind=COLLECTION_DISPATCH_FAILED,
        failure_reason=f"attempt {attempt} of {key}: its Ray worker was restarted; it may have run",
    )
    return lost.failure_row(rollout, attempt, failure)


def _lost(error: BaseException, rollout: PendingRollout, attempt: int) -> CollectionFailure:
    """The failure of an attempt held by a worker that was lost (Ray's error), or that did not answer
    within the exchange's deadline (`TimeoutError`)."""
    if not isinstance(error, TimeoutError):
        return lost_attempt(error, rollout, attempt)
    key = rollout_id(rollout.task_index, rollout.rollout_index)
    return CollectionFailure(
        failure_kind=COLLECTION_DISPATCH_FAILED,
        failure_reason=(
            f"attempt {attempt} of {key}: its Ray worker did not answer within the attempt timeout "
            f"and {_EXCHANGE_GRACE_S:g} s more (frozen, or starved of CPU); it may have run"
        ),
    )


async def collect_on_ray(
    config: CollectionConfig,
    on_progress: Callable[[CollectionProgress], None] | None = None,
    *,
    workers: int | RayWorkers = 2,
    address: str | None = None,
    clock: Clock | None = None,
) -> CollectionSummary:
    """Run one collection on Ray workers (resuming what is on disk) and return its summary: `workers`
    started for the run and ended after it, or a `RayWorkers` pool's (left running). `clock` is what
    the driver's backoff waits on (`Collector`)."""
    return await RayCollector(config, on_progress, workers=workers, address=address, clock=clock).run()


def _cluster_cpus() -> float:
    resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return resources.get("CPU", 0.0)
