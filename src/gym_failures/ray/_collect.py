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
- The driver joins the Ray this process already runs, else `ray.init(address)` (no address: Ray's
  own rule, `RAY_ADDRESS` or the cluster last started on this machine, else a new local Ray), and
  then calls `ray.shutdown` when the last pool or run using the Ray it started ends, cancelled or
  not: a local Ray it started is stopped, a cluster is only disconnected from. The workers it
  started are always ended. An address Ray cannot use or reach is a `RayJoinError`.
- The workers are asked for first, before the driver reads the tasks and the manifest, and each is
  fed from the moment it is up, not once all are: a worker's start (a Python process that imports
  Ray, pydantic, aiohttp and the collector) is most of what a short run pays for Ray. The run's id
  travels with each exchange, as the workers start before the driver has read the manifest.
- Workers ask one CPU each, and are spread over the cluster's nodes (`SPREAD`). When a worker is not
  up within the attempt timeout and at least `_MIN_START_S` (no CPU free for it) while rollouts are
  open, the run sends no more attempts, saves the rows of those in flight on the workers that did
  start, and ends with a `CollectionFailure` (`collection_dispatch_failed`) that says how many
  workers did not start; the next `collect`, with fewer workers, resumes it. A run whose rollouts
  are all final first just ends the workers that never started.
- The workers need `gym-failures[aiohttp]` installed where they run (the cluster's image); no
  runtime environment is shipped.
- An exchange answers once it has a row and, for at most `_LINGER_S` (10 ms) more, until it has half
  the worker's concurrency (or nothing else is running): a Ray call costs about half a millisecond
  of CPU on each side, and paying it per row was most of what a worker cost beyond the local
  collector. As many attempts again as it runs wait in the worker, so its slots stay busy meanwhile.
  Rows go back in the order their attempts finished; a row waits at most 10 ms more.
- A success row goes back encoded, as the line the driver writes (`_EncodedRow`: the row with the
  agent URL's secrets replaced, by `RowWriter`'s rule, with its telemetry outcome): encoding a large
  reply's row is most of its cost, and the one driver would otherwise pay it for every worker. The
  driver asks for it only while no secret is registered in its process (`register_secret`, which a
  worker cannot see); a row encoded before a registration is decoded and saved as any row. Failure
  rows always go back whole: the driver adds their retry wait.
- Workers live for one run (a number of workers: the run makes its own `RayWorkers` and closes it),
  or across runs (a `RayWorkers` pool the caller keeps open). A worker holds one run's state at a
  time, keyed by a token new each run (the manifest's run id survives a resume), opened by the run's
  first exchange (which carries the config) and closed at the run's end or when another run's
  exchange comes. One run at a time per pool: a second is refused (`RuntimeError`), as two runs would
  share each worker's slots. The command line stays per run: workers that outlive their process
  must be detached actors, which outlive Ctrl-C too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
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
from gym_failures.failures import CollectionFailure, exception_type_name
from gym_failures.ray._failures import gym_failure_of
from gym_failures.redaction import has_registered_secrets, redact, redact_values, url_secrets
from gym_failures.rows import rollout_id
from gym_failures.telemetry import CollectionProgress, RolloutOutcome, rollout_outcome

_Work = tuple[int, PendingRollout, int]
"""An attempt sent to a worker: its ticket (unique in the run), the rollout, the attempt number."""

_MIN_START_S = 60.0
"""A worker is given at least this long to start (a new Python process that imports Ray, pydantic,
aiohttp and the collector; longer on a busy node), whatever the attempt timeout."""

_EXCHANGE_GRACE_S = 30.0
"""Beyond the attempt timeout, how long an exchange may take before its worker counts as lost: a
worker holding attempts answers within the attempt timeout, as each attempt is bounded by it."""

_LINGER_S = 0.010
"""Once an exchange has a row, how long it waits for more (`_batch_size`) before it answers: a Ray
call costs about half a millisecond of CPU on each side, paid once for the rows it carries. Each row
waits at most this long more to reach the driver; the worker's slots stay busy meanwhile, as
attempts wait in the worker to take any slot that frees (`_queued_beyond`)."""


def _batch_size(concurrency: int) -> int:
    """The rows an exchange waits for (at most `_LINGER_S`) once it has one: half the worker's
    concurrency. From a quarter (and a 5 ms linger) to half, a worker's Ray thread spent a quarter
    less CPU per row (0.09 to 0.07 ms), and the driver a tenth (docs/benchmarks.md)."""
    return max(1, concurrency // 2)


def _queued_beyond(concurrency: int) -> int:
    """How many attempts wait in a worker beyond those it runs, so that no slot idles for an
    exchange's round trip and its linger: as many as it runs. An exchange waits for half of them to
    finish, so half a batch's worth were too few: the queue ran dry before the next exchange came."""
    return max(1, concurrency)


@dataclass(frozen=True)
class _EncodedRow(AttemptRow):
    """A success row, encoded in the worker as the line the driver writes: the driver writes `line`
    as it is and counts `outcome`, so the row's encoding (most of a large reply's cost) is spread
    over the workers rather than paid by the one driver. `row` keeps the row's small keys only (its
    `result` and `response` are in `line`).

    The line is what the driver's `_save` would write: the row with the agent URL's secrets
    replaced (`redact_values`), encoded by `RowWriter`'s rule. The driver asks for it only while it
    has no secret of its own registered (`has_registered_secrets`), which a worker cannot know."""

    line: bytes = b""
    outcome: RolloutOutcome | None = None

    @classmethod
    def of(cls, attempt: AttemptRow, secrets: list[str]) -> _EncodedRow:
        row = attempt.row
        small = {key: value for key, value in row.items() if key not in _LARGE_KEYS}
        line = RowWriter.encode(redact_values(row, secrets))
        return cls(small, **_flags(attempt), line=line, outcome=rollout_outcome(row))


def _flags(attempt: AttemptRow) -> dict[str, Any]:
    """What an `AttemptRow` says of its row, every field but the row itself."""
    return {name: getattr(attempt, name) for name in _FLAGS}


_FLAGS = tuple(field.name for field in dataclasses.fields(AttemptRow) if field.name != "row")


_LARGE_KEYS = frozenset({"result", "response"})
"""A success row's keys an `_EncodedRow` carries in its line only."""


class RayJoinError(RuntimeError):
    """Ray could not be joined or started (`ray.init` refused the address, or could not reach it)."""


class _SharedRay:
    """The Ray this module started, shut down when the last pool using it closes: a pool that joined
    it must not lose it to another's `close`."""

    users = 0
    started_here = False


class _WorkerRun:
    """One run's state in a worker: its `AttemptDispatcher` (the client session for that run's config),
    at most `concurrency` attempts at once, and the rows finished since the last exchange."""

    def __init__(self, key: str, config: CollectionConfig, dispatcher: AttemptDispatcher) -> None:
        self.key = key
        self.dispatcher = dispatcher
        self.slots = asyncio.Semaphore(config.concurrency)
        self.batch = _batch_size(config.concurrency)
        """An exchange waits (at most `_LINGER_S`) for this many rows once it has one."""
        self.secrets = url_secrets(config.agent_url)
        self.agent_name = config.agent_name
        self.encode = False
        """Whether success rows go back as the line the driver writes (`_EncodedRow`): the driver
        asks for it with each exchange, as long as it has no secret of its own registered."""
        self.done: list[tuple[int, AttemptRow]] = []
        self.ready = asyncio.Event()
        self.running: set[asyncio.Task[None]] = set()
        # Entered once, by whichever exchange of the run comes first; the others await the same.
        self.opened = asyncio.ensure_future(self.dispatcher.__aenter__())
        self.closed = False

    def start(self, work: list[_Work]) -> None:
        for ticket, rollout, attempt in work:
            task = asyncio.create_task(self._run(ticket, rollout, attempt))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    async def _run(self, ticket: int, rollout: PendingRollout, attempt: int) -> None:
        async with self.slots:
            try:
                row = await self.dispatcher.row(rollout, attempt)
            except Exception as error:
                # `row` records every failed attempt itself; this is a fault of the worker, and
                # an attempt without its row would hold its rollout forever.
                row = self.dispatcher.failure_row(rollout, attempt, _lost(error, rollout, attempt))
        if self.encode and row.succeeded and row.final and row.persisted:
            row = _EncodedRow.of(row, self.secrets)
        self.done.append((ticket, row))
        self.ready.set()

    async def fill(self) -> None:
        """Once a row is done, wait up to `_LINGER_S` for `batch` rows (or for every attempt held
        here to end): one exchange then carries several rows, and the Ray call's cost, on both
        sides, is paid once for them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _LINGER_S
        while len(self.done) < self.batch and not self.closed and self._unfinished():
            left = deadline - loop.time()
            if left <= 0:
                return
            self.ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), left)

    def _unfinished(self) -> bool:
        """Whether an attempt held here has no row yet."""
        return any(not task.done() for task in self.running)

    async def close(self) -> None:
        """End the run here: its attempts still running are cancelled (the driver has no use for their
        rows: a resume dispatches them again), an exchange waiting on it returns, its session closes."""
        self.closed = True
        self.ready.set()
        for task in list(self.running):
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.opened
        await self.dispatcher.__aexit__(None, None, None)


class _AttemptWorker:
    """A Ray actor's body: it runs the attempts of one run at a time, each run's state (`_WorkerRun`)
    set up at the run's first exchange and closed at its end, or when another run's exchange comes."""

    def __init__(self) -> None:
        self._run: _WorkerRun | None = None
        self._ended: collections.deque[str] = collections.deque(maxlen=64)
        """The keys of the last runs ended here: an exchange of one that comes late is not started."""
        self._incarnation = secrets.token_hex(8)
        """Made anew when Ray restarts the worker: what it held before is gone."""

    async def exchange(
        self, key: str, config: CollectionConfig, run_id: str, work: list[_Work], encode: bool = False
    ) -> tuple[str, list[tuple[int, AttemptRow]]]:
        """Start `work` (attempts of run `key`, whose config and run id come with each exchange: the
        worker may be new to the run, or restarted), then wait for at least one row (and a moment
        for more, `_WorkerRun.fill`) and return every row finished since the last exchange (with its
        ticket), in the order they finished, beside this incarnation's token; nothing to wait for
        returns at once. `encode`: success rows come back as the driver's line (`_EncodedRow`)."""
        if key in self._ended:
            return self._incarnation, []
        run = self._run
        if run is None or run.key != key:
            # No await between the test and the set: a concurrent exchange of the same run finds it.
            stale, run = run, _WorkerRun(key, config, self.dispatcher(config, run_id))
            self._run = run
            if stale is not None:
                self._ended.append(stale.key)
                await stale.close()
        await run.opened
        if run.closed:
            return self._incarnation, []
        run.encode = encode
        run.start(work)
        if not run.done and run.running:
            await run.ready.wait()
        if run.done:
            await run.fill()
        done, run.done = run.done, []
        if not run.closed:
            run.ready.clear()
        return self._incarnation, done

    async def end_run(self, key: str) -> None:
        """Close run `key`'s state here (its session, its attempts still running), if it is open."""
        self._ended.append(key)
        run = self._run
        if run is not None and run.key == key:
            self._run = None
            await run.close()

    def dispatcher(self, config: CollectionConfig, run_id: str) -> AttemptDispatcher:
        """The dispatcher of a run's attempts here (the benchmarks put one of their own in its place)."""
        return dispatcher_for(config, run_id)

    def ready(self) -> bool:
        return True

    async def state(self) -> dict[str, Any]:
        """This worker's process id, the key of the run it holds open (None: none) and its event
        loop's class (`uvloop.Loop` when uvloop is installed), for tests and operators."""
        loop = type(asyncio.get_running_loop())
        return {
            "pid": os.getpid(),
            "run": None if self._run is None else self._run.key,
            "loop": f"{loop.__module__}.{loop.__qualname__}",
        }


class RayWorkers:
    """Ray workers that live across collection runs: `async with RayWorkers(workers=4) as pool:`, then
    `await collect_on_ray(config, workers=pool)` as often as needed (each run's config may differ).

    Entering (or `start()`) joins the Ray this process runs, else `ray.init(address)`, and asks for
    the `workers` actors, which start in the background (the first run feeds each from the moment it
    is up). Leaving (or `close()`, safe to call again) ends them with `ray.kill`, whatever ended the
    block (an error, a cancellation, Ctrl-C), and shuts down a Ray that `start` started. A run on the
    pool never ends its workers; one run at a time: a second run while one is going raises
    `RuntimeError`.
    """

    _body: type[Any] = _AttemptWorker
    """The workers' actor class (the benchmarks put one of their own in its place)."""

    def __init__(self, workers: int = 2, *, address: str | None = None) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a whole number of at least 1, not {workers!r}")
        self.size = workers
        self.address = address
        self.handles: list[Any] = []
        """The workers' actor handles while the pool is open (Ray restarts a lost one under the same
        handle); empty before `start` and after `close`."""
        self._started_ray = False
        """Whether this pool holds the Ray this module started (`_SharedRay`)."""
        self._state = "new"
        self._running: str | None = None
        """The key of the run going on, if any."""

    def start(self) -> RayWorkers:
        """Join (or start) Ray and ask for the workers; nothing here waits for them to be up."""
        if self._state != "new":
            raise RuntimeError(f"this pool of Ray workers was already {self._state}; make a new one")
        self._state = "started"
        try:
            # `ray.shutdown` ends what `ray.init` started here (a local Ray), and only disconnects
            # from a cluster that was already up: a Ray this process already ran is left as it was.
            if not ray.is_initialized():
                _init_ray(self.address)
                _SharedRay.started_here = True
            if _SharedRay.started_here:
                _SharedRay.users += 1
                self._started_ray = True
            actor = ray.remote(self._body).options(
                num_cpus=1,
                # A run's exchange, the end of the run before it, `ready` and `state` may overlap.
                max_concurrency=8,
                max_restarts=-1,
                max_task_retries=0,
                scheduling_strategy="SPREAD",
            )
            self.handles = [actor.remote() for _ in range(self.size)]
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """End the workers (`ray.kill`) and shut down a Ray `start` started; again, it does nothing."""
        if self._state == "closed":
            return
        self._state = "closed"
        handles, self.handles = self.handles, []
        for worker in handles:
            with contextlib.suppress(Exception):
                ray.kill(worker)
        if self._started_ray:
            self._started_ray = False
            _SharedRay.users -= 1
            if _SharedRay.users == 0:
                _SharedRay.started_here = False
                ray.shutdown()

    async def __aenter__(self) -> RayWorkers:
        return self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def claimed(self, key: str) -> Iterator[list[Any]]:
        """The workers for run `key`, for the block; a run already going on, or a pool not open, is
        refused (`RuntimeError`)."""
        if self._state != "started":
            raise RuntimeError(
                "this pool of Ray workers is not open: use it inside `async with RayWorkers(...)`, or "
                "call its start() first"
            )
        if self._running is not None:
            raise RuntimeError(
                "this pool of Ray workers is running another collection; runs on one pool take turns "
                "(await the first, or make a second pool)"
            )
        self._running = key
        try:
            yield list(self.handles)
        finally:
            self._running = None


_JOIN_PROBE_S = 10.0
"""How long `_init_ray` waits for a TCP answer from a `host:port` address before it calls it
unreachable: Ray itself retries an address that does not answer for minutes (20 tries of a 5 s
connect and a 1 s sleep, and more), ignoring Ctrl-C meanwhile."""


def _init_ray(address: str | None) -> None:
    """`ray.init(address)`, or `RayJoinError` naming what Ray said in one line (an address it cannot
    parse, a Ray Client address without `ray[client]`, a cluster it cannot reach). A `host:port`
    address (given, or in `RAY_ADDRESS` when none or `auto` is given, as Ray reads it) is probed first
    (`_unreachable`): one that nothing answers on fails at once, rather than after Ray's minutes of
    retries. Userinfo in an address (`user:password@host:port`) is shown as `***@`."""
    target = address
    if address is None or address == "auto":
        target = os.environ.get("RAY_ADDRESS") or address
    unreachable = _unreachable(target) if target else None
    if unreachable is not None:
        raise RayJoinError(f"could not join Ray at {_shown(target or '')}: {unreachable}")
    try:
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    except Exception as error:  # Ray raises ValueError, RuntimeError, ConnectionError and its own
        said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if address:
            said = said.replace(address, _shown(address))
        where = f" at {_shown(address)}" if address else ""
        raise RayJoinError(f"could not join Ray{where}: {redact(said)}") from error


def _shown(address: str) -> str:
    """`address` as a message may show it: its userinfo (`user:password@`) as `***@`, redacted."""
    scheme, separator, rest = address.rpartition("://")
    _, at, host = rest.rpartition("@")
    return redact(f"{scheme}{separator}{'***@' if at else ''}{host}")


def _unreachable(address: str) -> str | None:
    """Why nothing can answer at a `host:port` address (a host that does not resolve, a refused
    connection, no answer within `_JOIN_PROBE_S`), or None: it answers, or it is no `host:port`
    (`auto`, `local`, `ray://...`, which Ray reads its own way). A loopback host is probed where Ray
    dials it, the node's own address (`resolve_ip_for_localhost`)."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or "/" in address or "@" in address or not port.isdigit():
        return None
    host = host.strip("[]")  # an IPv6 address, `[::1]:6379`
    with contextlib.suppress(Exception):  # Ray's own rule, private to it: as typed when it moves
        from ray._private.services import resolve_ip_for_localhost

        host = resolve_ip_for_localhost(host)
    try:
        with socket.create_connection((host, int(port)), timeout=_JOIN_PROBE_S):
            return None
    except socket.gaierror:
        return "cannot resolve its host"
    except TimeoutError:
        return f"no answer within {_JOIN_PROBE_S:.0f} s"
    except OSError as error:
        return f"nothing answers there ({error.strerror or type(error).__name__})"


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
        """The workers this run sent attempts to."""
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
        self._encoded: _EncodedRow | None = None
        """The worker-encoded row `record_attempt` is saving, for `_save`."""

    async def run(self) -> CollectionSummary:
        # The workers start (a process each) while the driver takes its lock, reads the tasks and
        # the manifest and opens its files, rather than after.
        async with self.started_workers():
            return await super().run()

    def in_flight(self) -> int:
        return self.worker_count * self.config.concurrency

    def record_attempt(self, outcome: AttemptRow, successes: RowWriter, failures: RowWriter) -> Retry | None:
        """The collector's own `record_attempt`; a row the worker encoded (`_EncodedRow`) is written
        as the worker encoded it (`_save`), unless a secret was registered here since it was asked
        for: then it is decoded, and saved as any row, redacted here."""
        if not isinstance(outcome, _EncodedRow):
            return super().record_attempt(outcome, successes, failures)
        if has_registered_secrets():
            return super().record_attempt(_decoded(outcome), successes, failures)
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
        capacity = self.config.concurrency + _queued_beyond(self.config.concurrency)
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
            finished = 0
            for ticket, outcome in done:
                if ticket not in sent:
                    # Recorded already, as lost: the worker was only out of reach (Ray's
                    # `ActorUnavailableError` while it ran on), and its attempt finished after all.
                    continue
                rollout, attempt = sent.pop(ticket)
                retry = self.record_attempt(outcome, successes, failures)
                if retry is None:
                    finished += 1
                elif retry.wait_s <= 0:
                    retries.append((rollout, attempt + 1))
                else:
                    # Backing off: not this feeder's any more; any worker's once the wait ends.
                    self._back_off(retry.wait_s, rollout, attempt + 1, queue)
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
                self.workers, self._fed = workers, []
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
                    await self._end_run(self._fed)
        finally:
            if owned:
                pool.close()

    async def _end_run(self, workers: list[Any]) -> None:
        """Have the workers this run fed close its state (their client sessions), within the attempt
        timeout; a worker lost meanwhile has none left."""
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


def _decoded(encoded: _EncodedRow) -> AttemptRow:
    """A worker-encoded row as the row it encodes, to be saved (and redacted) as any row."""
    return AttemptRow(json.loads(encoded.line), **_flags(encoded))


def _restarted_row(lost: AttemptDispatcher, rollout: PendingRollout, attempt: int) -> AttemptRow:
    key = rollout_id(rollout.task_index, rollout.rollout_index)
    failure = CollectionFailure(
        failure_kind=COLLECTION_DISPATCH_FAILED,
        failure_reason=f"attempt {attempt} of {key}: its Ray worker was restarted; it may have run",
    )
    return lost.failure_row(rollout, attempt, failure)


def _lost(error: BaseException, rollout: PendingRollout, attempt: int) -> CollectionFailure:
    key = rollout_id(rollout.task_index, rollout.rollout_index)
    if isinstance(error, TimeoutError):
        return CollectionFailure(
            failure_kind=COLLECTION_DISPATCH_FAILED,
            failure_reason=(
                f"attempt {attempt} of {key}: its Ray worker did not answer within the attempt timeout "
                f"and {_EXCHANGE_GRACE_S:g} s more (frozen, or starved of CPU); it may have run"
            ),
        )
    failure = gym_failure_of(error)
    if isinstance(failure, CollectionFailure):
        return failure
    # A Gym failure raised out of a worker: the dispatcher records failed attempts as rows, so this
    # is a fault of the worker itself.
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
