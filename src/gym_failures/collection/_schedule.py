"""Which rollout attempts are ready to send (`Schedule`), and a failed rollout's wait (`Retry`).

Retries come before rollouts not yet tried; a rollout backing off is in neither until its wait ends
on the collector's clock, so it holds no worker. Dispatch can be paused (the agent is being probed,
`gym_failures.collection._collector`), and stopped (the agent stayed down): then `take` gives no more
attempts. The schedule counts the rollouts still open and those never tried in this run (their
budgets whole when the run stops).
"""

from __future__ import annotations

import asyncio
import collections
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
        self.changed = asyncio.Condition()
        self.streak: tuple[str | None, int] = (None, 0)

    def _takeable(self) -> bool:
        return self.stopped or self.open == 0 or (not self.paused and bool(self.retries or self.fresh))

    async def take(self) -> tuple[PendingRollout, int] | None:
        """The next attempt to send, or None when the run has no more (done, or stopped)."""
        async with self.changed:
            await self.changed.wait_for(self._takeable)
            if self.stopped or self.open == 0:
                return None
            rollout, attempt = self.retries.popleft() if self.retries else self.fresh.popleft()
            self.untried.discard(id(rollout))
            return rollout, attempt

    async def settle(self, rollout: PendingRollout, attempt: int, retry: Retry | None, clock: Clock) -> None:
        """An attempt was recorded: its rollout is done, or ready again after its wait."""
        if retry is None:
            async with self.changed:
                self.open -= 1
                self.changed.notify_all()
        elif retry.wait_s <= 0:
            await self.ready(rollout, attempt + 1)
        else:
            task = asyncio.create_task(self._after(retry.wait_s, rollout, attempt + 1, clock))
            self.backing_off.add(task)
            task.add_done_callback(self.backing_off.discard)

    async def _after(self, wait_s: float, rollout: PendingRollout, attempt: int, clock: Clock) -> None:
        await clock.sleep(wait_s)
        await self.ready(rollout, attempt)

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

    def cancel(self) -> None:
        for task in self.backing_off:
            task.cancel()
