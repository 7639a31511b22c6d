"""The Ray workers: `RayWorkers`, the pool that joins Ray, starts the worker actors and ends them, and
`_AttemptWorker`, each actor's body, which holds one run at a time (`_worker_run.WorkerRun`).

Decisions:
- The pool joins the Ray this process already runs, else `ray.init(address)` (no address: Ray's
  own rule, `RAY_ADDRESS` or the cluster last started on this machine, else a new local Ray), and
  then calls `ray.shutdown` when the last pool or run using the Ray it started ends, cancelled or
  not: a local Ray it started is stopped, a cluster is only disconnected from. The workers it
  started are always ended. An address Ray cannot use or reach is a `RayJoinError`.
- Workers ask one CPU each, and are spread over the cluster's nodes (`SPREAD`). Ray restarts a lost
  worker (`max_restarts=-1`); Ray itself never retries a call (`max_task_retries=0`): the driver
  records and retries the attempts a lost worker held (`_collect`).
- The workers need `gym-failures[aiohttp]` installed where they run (the cluster's image); no
  runtime environment is shipped.
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
import os
import secrets
import socket
from collections.abc import Iterator
from typing import Any

import ray

from gym_failures.collection import CollectionConfig
from gym_failures.collection._attempt_row import AttemptRow
from gym_failures.collection._collector import dispatcher_for
from gym_failures.collection._dispatcher import AttemptDispatcher
from gym_failures.ray._worker_run import Work, WorkerRun
from gym_failures.redaction import redact

__all__ = ["RayJoinError", "RayWorkers"]


class RayJoinError(RuntimeError):
    """Ray could not be joined or started (`ray.init` refused the address, or could not reach it)."""


class _SharedRay:
    """The Ray this module started, shut down when the last pool using it closes: a pool that joined
    it must not lose it to another's `close`."""

    users = 0
    started_here = False


class _AttemptWorker:
    """A Ray actor's body: it runs the attempts of one run at a time, each run's state (`WorkerRun`)
    set up at the run's first exchange and closed at its end, or when another run's exchange comes."""

    def __init__(self) -> None:
        self._run: WorkerRun | None = None
        self._ended: collections.deque[str] = collections.deque(maxlen=64)
        """The keys of the last runs ended here: an exchange of one that comes late is not started."""
        self._incarnation = secrets.token_hex(8)
        """Made anew when Ray restarts the worker: what it held before is gone."""

    async def exchange(
        self, key: str, config: CollectionConfig, run_id: str, work: list[Work], encode: bool = False
    ) -> tuple[str, list[tuple[int, AttemptRow]]]:
        """Start `work` (attempts of run `key`, whose config and run id come with each exchange: the
        worker may be new to the run, or restarted), then wait for at least one row (and a moment
        for more, `WorkerRun.fill`) and return every row finished since the last exchange (with its
        ticket), in the order they finished, beside this incarnation's token; nothing to wait for
        returns at once. `encode`: success rows come back as the driver's line (`EncodedRow`)."""
        if key in self._ended:
            return self._incarnation, []
        run = self._run
        if run is None or run.key != key:
            # No await between the test and the set: a concurrent exchange of the same run finds it.
            stale, run = run, WorkerRun(key, config, self.dispatcher(config, run_id))
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
