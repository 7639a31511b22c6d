"""One run's attempts inside a Ray worker: at most `concurrency` at once, their rows sent back in
batches, success rows encoded as the line the driver writes. The actor that holds it is `_pool`'s
`_AttemptWorker`; the driver that feeds it is `_collect`'s `RayCollector`.

Decisions:
- An exchange answers once it has a row and, for at most `_LINGER_S` (10 ms) more, until it has half
  the worker's concurrency (or nothing else is running): a Ray call costs about half a millisecond
  of CPU on each side, and paying it per row was most of what a worker cost beyond the local
  collector. As many attempts again as it runs wait in the worker, so its slots stay busy meanwhile.
  Rows go back in the order their attempts finished; a row waits at most 10 ms more.
- A success row goes back encoded, as the line the driver writes (`EncodedRow`: the row with the
  agent URL's secrets replaced, by `RowWriter`'s rule, with its telemetry outcome): encoding a large
  reply's row is most of its cost, and the one driver would otherwise pay it for every worker. The
  driver asks for it only while no secret is registered in its process (`register_secret`, which a
  worker cannot see); a row encoded before a registration is decoded and saved as any row. Failure
  rows always go back whole: the driver adds their retry wait.
- An attempt whose dispatch raises (the dispatcher records every failed attempt as a row itself, so
  this is a fault of the worker) gets a `collection_dispatch_failed` row (`lost_attempt`): an
  attempt without its row would hold its rollout forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from gym_failures.collection import CollectionConfig, RowWriter
from gym_failures.collection._attempt_row import AttemptRow
from gym_failures.collection._dispatcher import AttemptDispatcher
from gym_failures.collection._resume import PendingRollout
from gym_failures.failure_kinds import COLLECTION_DISPATCH_FAILED
from gym_failures.failures import CollectionFailure, exception_type_name
from gym_failures.ray._failures import gym_failure_of
from gym_failures.redaction import redact_values, url_secrets
from gym_failures.rows import rollout_id
from gym_failures.telemetry import RolloutOutcome, rollout_outcome

__all__ = ["EncodedRow", "Work", "WorkerRun", "decoded", "lost_attempt", "queued_beyond"]

Work = tuple[int, PendingRollout, int]
"""An attempt sent to a worker: its ticket (unique in the run), the rollout, the attempt number."""

_LINGER_S = 0.010
"""Once an exchange has a row, how long it waits for more (`_batch_size`) before it answers: a Ray
call costs about half a millisecond of CPU on each side, paid once for the rows it carries. Each row
waits at most this long more to reach the driver; the worker's slots stay busy meanwhile, as
attempts wait in the worker to take any slot that frees (`queued_beyond`)."""


def _batch_size(concurrency: int) -> int:
    """The rows an exchange waits for (at most `_LINGER_S`) once it has one: half the worker's
    concurrency. From a quarter (and a 5 ms linger) to half, a worker's Ray thread spent a quarter
    less CPU per row (0.09 to 0.07 ms), and the driver a tenth (docs/benchmarks.md)."""
    return max(1, concurrency // 2)


def queued_beyond(concurrency: int) -> int:
    """How many attempts wait in a worker beyond those it runs, so that no slot idles for an
    exchange's round trip and its linger: as many as it runs. An exchange waits for half of them to
    finish, so half a batch's worth were too few: the queue ran dry before the next exchange came."""
    return max(1, concurrency)


@dataclass(frozen=True)
class EncodedRow(AttemptRow):
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
    def of(cls, attempt: AttemptRow, secrets: list[str]) -> EncodedRow:
        row = attempt.row
        small = {key: value for key, value in row.items() if key not in _LARGE_KEYS}
        line = RowWriter.encode(redact_values(row, secrets))
        return cls(small, **_flags(attempt), line=line, outcome=rollout_outcome(row))


def _flags(attempt: AttemptRow) -> dict[str, Any]:
    """What an `AttemptRow` says of its row, every field but the row itself."""
    return {name: getattr(attempt, name) for name in _FLAGS}


_FLAGS = tuple(field.name for field in dataclasses.fields(AttemptRow) if field.name != "row")


_LARGE_KEYS = frozenset({"result", "response"})
"""A success row's keys an `EncodedRow` carries in its line only."""


def decoded(encoded: EncodedRow) -> AttemptRow:
    """A worker-encoded row as the row it encodes, to be saved (and redacted) as any row."""
    return AttemptRow(json.loads(encoded.line), **_flags(encoded))


class WorkerRun:
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
        """Whether success rows go back as the line the driver writes (`EncodedRow`): the driver
        asks for it with each exchange, as long as it has no secret of its own registered."""
        self.done: list[tuple[int, AttemptRow]] = []
        self.ready = asyncio.Event()
        self.running: set[asyncio.Task[None]] = set()
        # Entered once, by whichever exchange of the run comes first; the others await the same.
        self.opened = asyncio.ensure_future(self.dispatcher.__aenter__())
        self.closed = False

    def start(self, work: list[Work]) -> None:
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
                row = self.dispatcher.failure_row(rollout, attempt, lost_attempt(error, rollout, attempt))
        if self.encode and row.succeeded and row.final and row.persisted:
            row = EncodedRow.of(row, self.secrets)
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


def lost_attempt(error: BaseException, rollout: PendingRollout, attempt: int) -> CollectionFailure:
    """The failure of an attempt its worker lost: Ray's own failure (`gym_failure_of`) as it is, or a
    Gym failure raised out of a worker, which the dispatcher would have recorded as a row: a fault of
    the worker itself."""
    failure = gym_failure_of(error)
    if isinstance(failure, CollectionFailure):
        return failure
    key = rollout_id(rollout.task_index, rollout.rollout_index)
    lost = CollectionFailure(
        failure_kind=COLLECTION_DISPATCH_FAILED,
        failure_reason=f"attempt {attempt} of {key}: the Ray worker failed ({type(error).__name__})",
        exception_type=exception_type_name(error),
    )
    lost.__cause__ = failure
    return lost
