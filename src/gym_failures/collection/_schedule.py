"""Which rollout attempts are ready to send (`Schedule`), and a failed rollout's wait (`Retry`).

Retries come before rollouts not yet tried; a rollout backing off is in neither until its wait ends
on the collector's clock, so it holds no worker. Dispatch can be paused (the agent is being probed,
`gym_failures.collection._collector`), held to probes (the breaker is open,
`gym_failures.collection._breaker`: one attempt a permit, of a task the failures did not come from, a
rollout not yet tried first), and stopped (the agent stayed down, or the probes failed): then `take`
gives no more attempts. The schedule counts the rollouts still open, those never tried in this run
(their budgets whole when the run stops), and the attempts taken and not yet settled.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from dataclasses import dataclass

from gym_failures.collection._pacing import Clock, WaitFrom
from gym_failures.collection._resume import PendingRollout


@dataclass(frozen=True)
class Retry:
    """A failed attempt's rollout goes on: after `wait_s` seconds, from `wait_from`."""

    wait_s: float
    wait_from: WaitFrom


class Schedule:
    """Which rollout attempts are ready to send, and whether dispatch is paused for the agent.

    Retries come before rollouts not yet tried; a rollout backing off is in neither until its wait
    ends, so it holds no worker. `take` waits for one ready while dispatch is open."""

    def __init__(self, rollouts: list[PendingRollout], paused: bool) -> None:
        self.fresh: collections.deque[tuple[PendingRollout, int]] = collections.deque(
            (rollout, rollout.next_attempt) for rollout in rollouts
        )
        self.retries: collections.deque[tuple[PendingRollout, int]] = collections.deque()
        self.open = len(rollouts)
        self.paused = paused
        """No attempt is sent: the agent is being probed (`Collector._watch_agent`)."""
        self.stopped = False
        self.untried = {id(rollout) for rollout in rollouts}
        """The rollouts not sent an attempt yet in this run."""
        self.backing_off: set[asyncio.Task[None]] = set()
        self._waiting = collections.Counter[int]()
        """The tasks of the rollouts backing off, with how many of each."""
        self.changed = asyncio.Condition()
        self.streak: tuple[str | None, int] = (None, 0)
        self.probing = False
        """The breaker is open: an attempt is taken only with a permit (`permits`)."""
        self.permits = 0
        """Attempts the breaker lets through while `probing` (a probe each)."""
        self.avoid: set[int] = set()
        """While `probing`, the tasks a probe is not taken from (those the run of failures came from)."""
        self.probe: tuple[PendingRollout, int] | None = None
        """The last attempt taken with a permit (the very item `take` gave)."""
        self.sending = 0
        """Attempts taken and not yet settled (in flight, or being recorded)."""

    def _takeable(self) -> bool:
        if self.stopped or self.open == 0:
            return True
        if self.paused:
            return False
        if self.probing:
            return self.permits > 0 and self._candidate() is not None
        return bool(self.retries or self.fresh)

    def _candidate(self) -> tuple[collections.deque[tuple[PendingRollout, int]], int] | None:
        """Where the next probe is: the first rollout not yet tried, else the first retry, of a task
        not in `avoid`."""
        for queue in (self.fresh, self.retries):
            for index, (rollout, _) in enumerate(queue):
                if rollout.task_index not in self.avoid:
                    return queue, index
        return None

    def can_probe(self, avoid: set[int]) -> bool:
        """Whether a rollout of a task not in `avoid` is open and not in flight (ready, or backing off)."""
        items = itertools.chain(self.fresh, self.retries)
        return any(rollout.task_index not in avoid for rollout, _ in items) or not set(self._waiting) <= avoid

    async def take(self) -> tuple[PendingRollout, int] | None:
        """The next attempt to send, or None when the run has no more (done, or stopped)."""
        async with self.changed:
            await self.changed.wait_for(self._takeable)
            if self.stopped or self.open == 0:
                return None
            if self.probing:
                # A probe (`gym_failures.collection._breaker`).
                found = self._candidate()
                assert found is not None
                queue, index = found
                item = queue[index]
                del queue[index]
                self.permits -= 1
                self.probe = item
            else:
                item = self.retries.popleft() if self.retries else self.fresh.popleft()
            self.untried.discard(id(item[0]))
            self.sending += 1
            return item

    async def settle(self, rollout: PendingRollout, attempt: int, retry: Retry | None, clock: Clock) -> None:
        """An attempt was recorded: its rollout is done, or ready again after its wait."""
        async with self.changed:
            self.sending -= 1
            self.open -= retry is None
            self.changed.notify_all()
        if retry is None:
            return
        if retry.wait_s <= 0:
            await self.ready(rollout, attempt + 1)
        else:
            task = asyncio.create_task(self._after(retry.wait_s, rollout, attempt + 1, clock))
            self.backing_off.add(task)
            self._waiting[rollout.task_index] += 1
            task.add_done_callback(self.backing_off.discard)

    async def _after(self, wait_s: float, rollout: PendingRollout, attempt: int, clock: Clock) -> None:
        await clock.sleep(wait_s)
        async with self.changed:
            self._waiting[rollout.task_index] -= 1
            if not self._waiting[rollout.task_index]:
                del self._waiting[rollout.task_index]
            self.retries.append((rollout, attempt))
            self.changed.notify_all()

    async def ready(self, rollout: PendingRollout, attempt: int) -> None:
        async with self.changed:
            self.retries.append((rollout, attempt))
            self.changed.notify_all()

    async def pause(self) -> None:
        async with self.changed:
            self.paused = True
            self.changed.notify_all()

    async def resume(self, up: bool) -> None:
        """The probe ended: dispatch goes on when the agent is `up`, else the run stops."""
        async with self.changed:
            self.paused = False
            self.stopped = not up
            self.streak = (None, 0)
            self.changed.notify_all()

    async def hold(self, probing: bool) -> None:
        """The breaker opened (`probing`: attempts only by permit) or closed (full concurrency)."""
        async with self.changed:
            self.probing = probing
            self.permits = 0
            self.changed.notify_all()

    async def permit(self, avoid: set[int]) -> None:
        """Let one probe through while the breaker is open, of a task not in `avoid`."""
        async with self.changed:
            if self.probing:
                self.permits = 1
                self.avoid = avoid
                self.changed.notify_all()

    async def stop(self) -> None:
        """No more attempts: the breaker's probes failed."""
        async with self.changed:
            self.stopped = True
            self.changed.notify_all()

    def cancel(self) -> None:
        for task in self.backing_off:
            task.cancel()
