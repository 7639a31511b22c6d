"""What the proxy does to a body on its way through: the faults that break a reply and the toxics, each
a stage of a pipe of async iterators of bytes.

A stage takes the chunks of the stage before it and yields the chunks it passes on. It ends the body
cleanly by ending, and breaks the connection by raising `Break` (`reset=True`: a TCP reset, else a
close); the exchange (`gym_failures.proxy._exchange`) carries that out on the client's connection.
`Waits` are the stages' sleeps: each ends early when the client leaves.

SSE replies are read event by event (`sse_events`: an event ends at a blank line, `\\n\\n`, `\\r\\n\\r\\n`
or `\\r\\r`, as the SSE specification reads them) only when a fault counts events; any other body, and a
stream no fault counts, passes through in the chunks it arrived in.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from gym_failures.model_endpoint._faults import Fault
from gym_failures.proxy._toxics import Toxic

__all__ = [
    "MAX_BUFFERED",
    "Break",
    "Pipe",
    "Waits",
    "bandwidth",
    "fault_stage",
    "half_json",
    "latency",
    "latency_s",
    "limit_data",
    "slicer",
    "slow_close",
    "sse_events",
    "toxic_stage",
]

Pipe = AsyncIterator[bytes]
MAX_BUFFERED = 16 << 20
"""The most of a body a stage holds at once (`malformed_json` reads a whole JSON body, up to this)."""

_clock = time.monotonic
"""The waits' clock (the stages' `time.monotonic` is read through the module: a test may hold it)."""
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_MALFORMED_EVENT = b'data: {"gym_failures": "malformed_json", "cut here\n\n'


class Break(Exception):
    """Break the client's connection here: reset it (`reset`) or close it."""

    def __init__(self, reset: bool = False) -> None:
        super().__init__("reset" if reset else "close")
        self.reset = reset


class Waits:
    """The stages' sleeps, each over as soon as the client leaves (`gone`), and the tasks the stages
    start (`start`), cancelled when the exchange ends (`stop`)."""

    def __init__(self, gone: Callable[[], Awaitable[None]] | None = None) -> None:
        self._gone = gone
        self.left = False
        self._tasks: set[asyncio.Future[None]] = set()
        self._watch: asyncio.Future[None] | None = None

    def start(self, work: Awaitable[None]) -> asyncio.Future[None]:
        """Run `work` (a stage's reader) as a task of the exchange: `stop` cancels it if it still runs
        when the exchange ends, its pipe read or not; its error is the stage's to raise, never logged
        as an error no one retrieved."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the stage that awaits the task raises it

    def stop(self) -> None:
        """Cancel the stages' tasks still running: the exchange is over."""
        for task in list(self._tasks):
            task.cancel()

    async def sleep(self, seconds: float) -> bool:
        """Sleep `seconds`, never less; `True` if the client left meanwhile (the stage should stop).
        uvloop's timers count whole milliseconds from a clock it reads once per loop iteration, so
        one can end a wait up to a millisecond early: what is left of it is waited again."""
        deadline = _clock() + seconds
        while seconds > 0 and not self.left:
            await self._wait(seconds)
            seconds = deadline - _clock()
        return self.left

    def watch(self) -> asyncio.Future[None] | None:
        """The client's leaving, watched by one task of the exchange from the first call on (`None`
        without `gone`); done when the client has left."""
        if self._gone is None:
            return None
        if self._watch is None:
            self._watch = self.start(self._gone())
        return self._watch

    async def _wait(self, seconds: float) -> None:
        watch = self.watch()
        if watch is None:
            await asyncio.sleep(seconds)
            return
        done, _ = await asyncio.wait({watch}, timeout=seconds)
        if done:
            self.left = True


async def sse_events(source: Pipe) -> Pipe:
    """The stream's events, one per chunk, each with its blank line; what follows the last blank
    line, if anything, as a last chunk."""
    pending = b""
    async for chunk in source:
        pending += chunk
        start = 0
        for match in _EVENT_END.finditer(pending):
            yield pending[start : match.end()]
            start = match.end()
        pending = pending[start:]
        if len(pending) > MAX_BUFFERED:  # no event boundary in 16 MiB: not an event stream
            yield pending
            pending = b""
    if pending:
        yield pending


def fault_stage(source: Pipe, fault: Fault, *, events: bool, waits: Waits) -> Pipe:
    """The stage of `fault` on a reply's body (`events`: the body is an SSE stream)."""
    name = fault.name
    if name == "cut_stream" and events:
        return _cut(sse_events(source), fault.after)
    if name in ("drop_connection", "cut_stream"):
        return _drop(sse_events(source) if events else source, fault.after or 0, events)
    if name == "stall":
        return _stall(sse_events(source) if events else source, fault, events, waits)
    if name == "malformed_json" and events:
        return _malformed_events(sse_events(source), fault.after or 0)
    if name == "slow_first_byte":
        return _slow_first_byte(source, fault.delay_s, waits)
    return source


async def _cut(events: Pipe, after: int | None) -> Pipe:
    """End cleanly after `after` events, or without the last event."""
    held: bytes | None = None
    sent = 0
    async for event in events:
        if after is not None:
            if sent >= after:
                return
            sent += 1
            yield event
            continue
        if held is not None:
            yield held
        held = event


async def _drop(pieces: Pipe, after: int, events: bool) -> Pipe:
    """Close the connection after `after` events (or bytes); a body that ends first passes whole, and
    ends as it would have: the fault had nothing to cut."""
    passed = 0
    async for piece in pieces:
        if events:
            if passed >= after:
                raise Break()
            passed += 1
            yield piece
            continue
        room = after - passed
        if len(piece) > room or (room == 0 and piece):
            if room:
                yield piece[:room]
            raise Break()
        passed += len(piece)
        yield piece


async def _stall(pieces: Pipe, fault: Fault, events: bool, waits: Waits) -> Pipe:
    after = fault.after or 0
    passed = 0
    stalled = False
    async for piece in pieces:
        if not stalled:
            if events and passed >= after:
                stalled = True
                if await waits.sleep(fault.delay_s):
                    return
            elif not events and passed + len(piece) >= after:
                room = after - passed
                if room:
                    yield piece[:room]
                stalled = True
                if await waits.sleep(fault.delay_s):
                    return
                piece = piece[room:]
            passed += 1 if events else len(piece)
        if piece:
            yield piece
    if not stalled and await waits.sleep(fault.delay_s):  # a body shorter than `after`: at its end
        return


async def _malformed_events(events: Pipe, after: int) -> Pipe:
    passed = 0
    async for event in events:
        if passed == after:
            event = _MALFORMED_EVENT
        passed += 1
        yield event


def half_json(body: bytes) -> bytes:
    """`malformed_json` on a body that is not a stream: its first half, a JSON document cut in the
    middle (`{` for an empty body); the exchange sends it with its own length."""
    return body[: max(1, len(body) // 2)] if body else b"{"


async def _slow_first_byte(source: Pipe, delay: float, waits: Waits) -> Pipe:
    if await waits.sleep(delay):
        return
    async for chunk in source:
        yield chunk


def toxic_stage(source: Pipe, toxic: Toxic, waits: Waits) -> Pipe:
    """The stage of `toxic` on a body (`timeout` and `reset_peer` act on the whole exchange)."""
    kind = toxic.type
    if kind == "latency":
        return latency(source, toxic, waits)
    if kind == "bandwidth":
        return bandwidth(source, toxic.attribute("rate"), waits)
    if kind == "slicer":
        return slicer(source, toxic, waits)
    if kind == "limit_data":
        return limit_data(source, toxic.attribute("bytes"))
    if kind == "slow_close":
        return slow_close(source, toxic.attribute("delay") / 1000, waits)
    return source


def latency_s(toxic: Toxic) -> float:
    """One draw of the toxic's wait: latency +- jitter, in seconds (as Toxiproxy draws it)."""
    jitter = toxic.attribute("jitter")
    spread = random.randint(-jitter, jitter) if jitter else 0
    return max(0, toxic.attribute("latency") + spread) / 1000


def latency(source: Pipe, toxic: Toxic, waits: Waits) -> Pipe:
    """Every chunk leaves `latency +- jitter` after it arrived. The reader starts now, taking the
    chunks as they come, so a chunk that waited behind another waits the less (Toxiproxy's
    pipelining), and a reply whose head waited the latency (`gym_failures.proxy._forward`) does not
    make its body wait it twice."""
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(maxsize=256)

    async def read() -> None:
        try:
            async for chunk in source:
                await queue.put((time.monotonic(), chunk))
        except asyncio.CancelledError:
            raise  # no one reads on: waiting to put the end in a full queue would never end
        except BaseException:
            await queue.put(None)
            raise
        await queue.put(None)

    return _released(queue, waits.start(read()), toxic, waits)


async def _released(
    queue: asyncio.Queue[tuple[float, bytes] | None], reader: asyncio.Future[None], toxic: Toxic, waits: Waits
) -> Pipe:
    try:
        while (item := await queue.get()) is not None:
            arrived, chunk = item
            if await waits.sleep(arrived + latency_s(toxic) - time.monotonic()):
                return
            yield chunk
        await reader  # its exception, if the source broke
    finally:
        reader.cancel()


async def bandwidth(source: Pipe, rate_kb_s: int, waits: Waits) -> Pipe:
    """At most `rate_kb_s` KB/s, in pieces of a tenth of a second's worth, each sent once the time it
    takes at that rate has passed (as Toxiproxy's: a body of N KB takes N / rate seconds, its first
    piece included; sent first, a body under a tenth of a second's worth would pass at once)."""
    per_second = rate_kb_s * 1000
    piece = max(1, per_second // 10)
    async for chunk in source:
        for start in range(0, len(chunk), piece):
            part = chunk[start : start + piece]
            if await waits.sleep(len(part) / per_second):
                return
            yield part


async def slicer(source: Pipe, toxic: Toxic, waits: Waits) -> Pipe:
    average = toxic.attribute("average_size")
    variation = min(toxic.attribute("size_variation"), average - 1)
    delay = toxic.attribute("delay") / 1_000_000
    async for chunk in source:
        start = 0
        while start < len(chunk):
            size = average + (random.randint(-variation, variation) if variation else 0)
            yield chunk[start : start + size]
            start += size
            if start < len(chunk) and await waits.sleep(delay):
                return


async def limit_data(source: Pipe, limit: int) -> Pipe:
    """Close the connection once `limit` bytes have passed (at once when there is more to send)."""
    passed = 0
    async for chunk in source:
        room = limit - passed
        if len(chunk) > room:
            if room:
                yield chunk[:room]
            raise Break()
        passed += len(chunk)
        yield chunk


async def slow_close(source: Pipe, delay: float, waits: Waits) -> Pipe:
    async for chunk in source:
        yield chunk
    await waits.sleep(delay)
