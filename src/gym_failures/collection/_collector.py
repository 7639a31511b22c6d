"""The collector (`Collector`, `collect`): bring every rollout of a run to a final outcome, each attempt saved

A run takes the output's lock (`_lock`), checks the manifest (`_manifest`), reads its inventory
(`_inventory`), writes the manifest, plans the resume (`_resume`) and the prompt groups (`_groups`:
their live counts, and with `fill_short_groups` only the members short groups need), closes the
rollouts a lowered budget has spent, then dispatches the rest (`dispatch_rollouts`): `in_flight`
workers, each sending one ready attempt at a time from the `Schedule`. What dispatches one attempt
is an `AttemptDispatcher` of the config's protocol (`dispatcher_for`) in this process, or Ray workers
(`gym_failures.ray.RayCollector`, a subclass), whose rows come back to the same `record`. Every row is
written at one place, `Collector._save`, with the collector's own secrets (the agent URL's user info
and query values) replaced wherever the row holds them.

Pacing (`gym_failures.collection._pacing`): a retried rollout waits before its next attempt, the
backoff (`backoff_initial_s`, `backoff_max_s`) or the failure's own hint (`Retry-After`, a quota's
reset; at most `retry_after_max_s`), written on its failure row as `_gf_retry_wait_s` and
`_gf_retry_wait_from`; while it waits it holds no worker. With `wait_ready_s`, no attempt is sent until
the agent accepts a connection, at the start and after `TRANSPORT_RUN` attempts in a row failed with
the same transport kind; an agent that accepts none within `wait_ready_s` ends the run (`AgentDown`),
the rollouts not yet final kept. The breaker (`_breaker`, `breaker_attempts`) holds dispatch to one
probe at a time after a run of attempts failed alike (an agent that answers, every time, with the same
failure), and ends the run (`BreakerOpen`) when its probes fail too; it runs beside the readiness
pause, each with its own flag in the `Schedule` and its own watcher task.

Retry rules (`gym_failures.collection._retry_rules`): the dispatcher decides a failure's budget by
them; a rule's run-wide cap (`max_retries_per_run`) is counted here, in `record_attempt`, where every
row passes, Ray's included (`RetryCaps`); the resume plan keeps open the rollouts a rule gives more
attempts than `max_attempts` (`gym_failures.collection._retry_resume`).

An error while saving a row (a full disk) is not an attempt's outcome: it ends the run and is raised
to the caller; the other workers are cancelled, and the attempts they had in flight have no row and
are dispatched again, under the same attempt numbers, on resume (as after a kill). So does a fault
of the readiness probe (`_watch_agent`): while it probes, dispatch is paused, so a probe that died
unseen would hold the run for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from gym_failures.collection._attempt_row import AttemptFunction, AttemptRow
from gym_failures.collection._breaker import Breaker, BreakerOpen
from gym_failures.collection._config import CollectionConfig
from gym_failures.collection._dispatcher import AttemptDispatcher
from gym_failures.collection._groups import GroupedProgress, group_sizes, plan_groups, refuse_before_run
from gym_failures.collection._inventory import run_inventory
from gym_failures.collection._lock import exclusive
from gym_failures.collection._manifest import check_manifest, write_manifest
from gym_failures.collection._nemo_gym_protocol import NemoGymDispatcher
from gym_failures.collection._pacing import (
    TRANSPORT_RUN,
    Backoff,
    Clock,
    RealClock,
    accepts_connections,
    wait_ready,
)
from gym_failures.collection._protocols import NEMO_GYM_PROTOCOL
from gym_failures.collection._resume import PendingRollout, pending_rollouts
from gym_failures.collection._retry_resume import with_rule_budgets
from gym_failures.collection._retry_rules import RetryCaps
from gym_failures.collection._schedule import Retry, Schedule
from gym_failures.collection._summary import CollectionSummary
from gym_failures.failure_kinds import TRANSPORT_UNREACHABLE
from gym_failures.failures import CollectionFailure
from gym_failures.redaction import redact_values, url_secrets, url_without_secrets
from gym_failures.row_keys import RETRY_WAIT_FROM, RETRY_WAIT_S
from gym_failures.rows import RowWriter
from gym_failures.telemetry import CollectionProgress, RolloutOutcome, record_rollout, rollout_outcome


class AgentDown(CollectionFailure):
    """The agent accepted no connection within `wait_ready_s`: the run ended, its open rollouts kept."""


class Collector:
    """Run one collection: `await Collector(config).run()`.

    The collector keeps the queue, the attempt budgets, the rows and the resume; what dispatches one
    attempt (`dispatcher`) is an `AttemptDispatcher` in this process, or Ray workers
    (`gym_failures.ray.RayCollector`), each row coming back to the one `_save` point. `clock` is what
    it waits on (backoff, readiness): the loop's own, or a test's.
    """

    paces_retries = True
    """Whether a retried rollout waits (backoff, hints) before its next attempt, and the row says so."""

    def __init__(
        self,
        config: CollectionConfig,
        on_progress: Callable[[CollectionProgress], None] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.on_progress = on_progress
        """Called with `progress` after every change: the live view's one hook."""
        self.clock: Clock = clock or RealClock()
        self.summary = CollectionSummary()
        self.progress = GroupedProgress()
        self._secrets = url_secrets(config.agent_url)
        self._backoff = Backoff(config.backoff_initial_s, config.backoff_max_s)
        self._breaker = Breaker(config.breaker_attempts, self._backoff)
        self._retry_caps = RetryCaps(config.retry_rules)
        """The retries each capped retry rule granted in this run (`max_retries_per_run`)."""
        self.run_id = ""
        """The run's id (the manifest's), known once `run` has checked the manifest."""

    async def run(self) -> CollectionSummary:
        config = self.config
        refuse_before_run(config)
        with exclusive(config):
            manifest = check_manifest(config)
            self.run_id = manifest.run_id
            inventory = run_inventory(config, manifest, self.summary)
            sizes = group_sizes(config, inventory)
            write_manifest(config, manifest, len(inventory))
            valid: Counter[int] | None = None if sizes is None else Counter()
            rollouts, closing = pending_rollouts(config, inventory, self.summary, valid)
            rollouts, closing = with_rule_budgets(config, inventory, rollouts, closing, self.summary)
            if sizes is not None and valid is not None:
                planned = plan_groups(config, sizes, valid, rollouts, closing, self.summary)
                self.progress.groups, rollouts, closing = planned
            self.progress.expected = self.summary.expected - self.summary.left_open
            self.progress.already_done = self.summary.already_done
            self.progress.reopened = self.summary.reopened
            self._progress()
            with RowWriter(config.output_path) as successes, RowWriter(config.failures_path) as failures:
                for row in closing:
                    self._save(failures, row, dispatched=False)
                    self.summary.failed_final += 1
                    self.summary.closed_on_resume += 1
                await self.dispatch_rollouts(rollouts, successes, failures)
        return self.summary

    def in_flight(self) -> int:
        """How many attempts are dispatched at once: the concurrency, in this process."""
        return self.config.concurrency

    @contextlib.asynccontextmanager
    async def dispatcher(self) -> AsyncIterator[AttemptFunction]:
        """What dispatches one attempt, for the run's duration: here, this process's client session."""
        async with dispatcher_for(self.config, self.run_id) as dispatcher:
            yield dispatcher.row

    async def dispatch_rollouts(
        self, rollouts: list[PendingRollout], successes: RowWriter, failures: RowWriter
    ) -> None:
        """Bring every rollout to a final outcome, each attempt's row `record`ed here: `in_flight`
        workers, each sending one ready attempt at a time (a rollout backing off holds none); with
        `wait_ready_s`, no attempt is sent until the agent accepts connections, nor after a run of
        transport failures until it does again (`_watch_agent`); with `breaker_attempts`, only one
        probe at a time after a run of attempts failed alike, until one does not (`_watch_breaker`)."""
        if not rollouts:
            return
        watching = self.config.wait_ready_s > 0
        schedule = Schedule(rollouts, paused=watching)
        self._breaker = Breaker(self.config.breaker_attempts, self._backoff)
        async with self.dispatcher() as attempt:
            tasks = [
                asyncio.create_task(self._worker(attempt, schedule, successes, failures))
                for _ in range(min(self.in_flight(), len(rollouts)))
            ]
            watchers = [
                *([asyncio.create_task(self._watch_agent(schedule))] if watching else []),
                *([asyncio.create_task(self._watch_breaker(schedule))] if self._breaker.attempts else []),
            ]
            try:
                await self._until_done(tasks, watchers)
            finally:
                schedule.cancel()
                for task in (*tasks, *watchers):
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*tasks, *watchers, return_exceptions=True)
                self.progress.backing_off = 0
                self.progress.agent_wait_s = None
                self.progress.breaker = None
        if schedule.stopped and self._breaker.gave_up:
            self._breaker_ended(schedule)
        if schedule.stopped:
            untried = len(schedule.untried)
            raise AgentDown(
                failure_kind=TRANSPORT_UNREACHABLE,
                failure_reason=(
                    f"the agent at {url_without_secrets(self.config.agent_url)} accepted no connection "
                    f"within {self.config.wait_ready_s:g} s (wait_ready_s); {without_outcome(schedule.open)} "
                    f"({untried} never tried, {'its budget' if untried == 1 else 'their budgets'} whole): "
                    "collect again once it is up"
                ),
            )

    def _breaker_ended(self, schedule: Schedule) -> None:
        """Raise `BreakerOpen`: the breaker's probes failed as the attempts before them did."""
        trip = self._breaker.trip()
        self.summary.breaker = trip
        untried = len(schedule.untried)
        reason = (
            f"the breaker opened: {trip.in_a_row} attempts in a row failed with {trip.failure_kind} at "
            f"the {trip.boundary} boundary, the last {trip.probes} of them probes sent one at a time "
            f"(breaker_attempts {trip.breaker_attempts}); {without_outcome(schedule.open)} ({untried} "
            f"never tried, {'its budget' if untried == 1 else 'their budgets'} whole): collect again "
            "once what fails them is fixed"
        )
        raise BreakerOpen(reason, trip, self.summary)

    @staticmethod
    async def _until_done(workers: list[asyncio.Task[None]], watchers: list[asyncio.Task[None]]) -> None:
        """Wait for the workers, raising the first error of theirs, or of a watcher's (its probe, its
        clock): dispatch would stay paused for ever otherwise, the workers waiting on the watcher."""
        waiting: set[asyncio.Task[None]] = {*workers, *watchers}
        while not all(worker.done() for worker in workers):
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and (error := task.exception()) is not None:
                    raise error

    async def _watch_agent(self, schedule: Schedule) -> None:
        """Whenever dispatch is paused (at the start, after a run of transport failures), probe the
        agent until it accepts a connection, then resume; past `wait_ready_s`, stop the run."""
        while True:
            async with schedule.changed:
                await schedule.changed.wait_for(lambda: schedule.paused or schedule.open == 0)
                if schedule.open == 0:
                    return
            await schedule.resume(await self._agent_up())

    async def _watch_breaker(self, schedule: Schedule) -> None:
        """Whenever the breaker is open and no attempt is out, wait (`Breaker.probe_wait`, on the
        collector's clock), then let one probe through, of a task the failures did not come from; the
        worker that records it keeps the breaker open, closes it or gives up (`_count_for_breaker`).
        When every open rollout is of such a task, the breaker stands down for the rest of the run."""
        while True:
            async with schedule.changed:
                await schedule.changed.wait_for(
                    lambda: (
                        schedule.open == 0
                        or schedule.stopped
                        or (schedule.probing and schedule.sending == 0 and schedule.permits == 0)
                    )
                )
                if schedule.open == 0 or schedule.stopped:
                    return
                avoid = set(self._breaker.tasks)
                if not schedule.can_probe(avoid):
                    self._breaker.stand_down()
                    schedule.probing = False
                    schedule.changed.notify_all()
                    self.progress.breaker = None
                    self._progress()
                    return
            await self.clock.sleep(self._breaker.probe_wait())
            await schedule.permit(avoid)

    async def _agent_up(self) -> bool:
        """Whether the agent accepts a connection within `wait_ready_s` (`wait_ready`: probed every
        `READY_PROBE_INTERVAL_S`, up to the deadline); the wait shows in `progress.agent_wait_s`. A
        no is said once, by the run's end (`AgentDown`)."""
        connect_s = min(self.config.timeout_s, 10.0)

        def probe() -> Awaitable[bool]:
            return accepts_connections(self.config.agent_url, connect_s)

        def waiting(waited: float) -> None:
            self.progress.agent_wait_s = waited
            self._progress()

        try:
            return await wait_ready(probe, self.clock, self.config.wait_ready_s, waiting)
        finally:
            if self.progress.agent_wait_s is not None:
                self.progress.agent_wait_s = None
                self._progress()

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def _save(self, writer: RowWriter, row: dict[str, Any], *, dispatched: bool = True) -> None:
        """Write `row` (as `_line_of` makes it), then count it: in telemetry when it is an attempt's,
        and in `progress`. The one place a row is written."""
        line, outcome = self._line_of(row)
        try:
            writer.write_line(line)
        except BaseException:
            if dispatched:
                omitted = RolloutOutcome("omitted", final=False)
                record_rollout(omitted, self.config.agent_name)
                self.progress.add(omitted)
            raise
        if dispatched:
            record_rollout(outcome, self.config.agent_name)
        self.progress.add(outcome, dispatched=dispatched)
        self.progress.settle(row, outcome)
        self._progress()

    def _line_of(self, row: dict[str, Any]) -> tuple[bytes, RolloutOutcome]:
        """The line `row` is saved as, and its outcome. The collector's own secrets (the agent URL's
        user info and query values, and the Basic credential the client sends for them) are replaced
        wherever the row holds them: an agent's reply may quote the request it was sent."""
        return RowWriter.encode(redact_values(row, self._secrets)), rollout_outcome(row)

    async def _worker(
        self, attempt: AttemptFunction, schedule: Schedule, successes: RowWriter, failures: RowWriter
    ) -> None:
        while (item := await schedule.take()) is not None:
            rollout, number = item
            outcome = await attempt(rollout, number)
            retry = self.record_attempt(outcome, successes, failures)
            await self._count_for_breaker(schedule, item, outcome, retry)
            if outcome.transport_kind is not None and schedule.streak[0] == outcome.transport_kind:
                schedule.streak = (outcome.transport_kind, schedule.streak[1] + 1)
            else:
                schedule.streak = (outcome.transport_kind, int(outcome.transport_kind is not None))
            if schedule.streak[1] >= TRANSPORT_RUN and self.config.wait_ready_s > 0:
                await schedule.pause()
            await schedule.settle(rollout, number, retry, self.clock)
            self.progress.backing_off = len(schedule.backing_off)

    async def _count_for_breaker(
        self, schedule: Schedule, item: tuple[PendingRollout, int], outcome: AttemptRow, retry: Retry | None
    ) -> None:
        """Count a recorded attempt (`item`, as `take` gave it) for the breaker, and hold, free or
        stop dispatch as it says."""
        change = self._breaker.saw(outcome, retry, item[0].task_index, probe=schedule.probe is item)
        if change == "gave_up":
            await schedule.stop()
        elif change is not None:
            await schedule.hold(change == "opened")
            self.progress.breaker = self._breaker.shown if change == "opened" else None
            self._progress()

    def record(self, outcome: AttemptRow, successes: RowWriter, failures: RowWriter) -> bool:
        """Save one attempt's row (through `_save`) and count it; whether its rollout goes on."""
        return self.record_attempt(outcome, successes, failures) is not None

    def record_attempt(self, outcome: AttemptRow, successes: RowWriter, failures: RowWriter) -> Retry | None:
        """Save one attempt's row (through `_save`) and count it; whether its rollout goes on, and
        after what wait (written in the row, `_gf_retry_wait_s`, when `paces_retries`)."""
        self.summary.attempts += 1
        self.summary.dispatch_errors += outcome.dispatch_error
        if not outcome.persisted:
            self.summary.omitted += 1
            omitted = RolloutOutcome("omitted", final=False)
            record_rollout(omitted, self.config.agent_name)
            self.progress.add(omitted)
            self._progress()
            return None
        if not outcome.succeeded and not outcome.final and not self._retry_caps.allows(outcome.row):
            outcome = dataclasses.replace(outcome, final=True)  # its rule's cap is spent: closed
        retry: Retry | None = None
        key = str(outcome.row.get("rollout_id"))
        if not outcome.succeeded and not outcome.final:
            retry = self._retry(key, outcome) if self.paces_retries else Retry(0.0, "backoff")
            if self.paces_retries:
                outcome.row[RETRY_WAIT_S] = retry.wait_s
                outcome.row[RETRY_WAIT_FROM] = retry.wait_from
        else:
            self._backoff.forget(key)
        self._save(successes if outcome.succeeded else failures, outcome.row)
        if outcome.succeeded:
            self.summary.succeeded += 1
        elif outcome.final:
            self.summary.failed_final += 1
        return retry

    def _retry(self, key: str, outcome: AttemptRow) -> Retry:
        """The wait before a failed rollout's next attempt: the failure's hint, bounded by
        `retry_after_max_s`, else the backoff."""
        # Rounded to the millisecond: the row says the wait the clock is asked for, exactly.
        if outcome.retry_hint_s is not None:
            hint = min(max(outcome.retry_hint_s, 0.0), self.config.retry_after_max_s)
            return Retry(round(hint, 3), "retry_after")
        return Retry(round(self._backoff.wait(key), 3), "backoff")


def dispatcher_for(config: CollectionConfig, run_id: str) -> AttemptDispatcher:
    """The dispatcher of `config`'s agent protocol (`CollectionConfig.agent_protocol`)."""
    if config.agent_protocol == NEMO_GYM_PROTOCOL:
        return NemoGymDispatcher(config, run_id)
    return AttemptDispatcher(config, run_id)


async def collect(
    config: CollectionConfig,
    on_progress: Callable[[CollectionProgress], None] | None = None,
    *,
    clock: Clock | None = None,
) -> CollectionSummary:
    """Run one collection (resuming what is on disk) and return its summary; `AgentDown` when the
    agent accepts no connection within `wait_ready_s`, `BreakerOpen` when the breaker's probes failed
    as the attempts before them did (the rollouts not yet final are kept)."""
    return await Collector(config, on_progress, clock=clock).run()


def without_outcome(count: int) -> str:
    """`count` rollouts have no final outcome yet, in words that agree with `count`."""
    return (
        f"{count} rollout has no final outcome yet"
        if count == 1
        else f"{count} rollouts have no final outcome yet"
    )
