"""`gym-failures serve proxy` against a direct connection and against agentbreak 0.4.6, in one run:
the latency a proxy adds, requests per second under load with no fault and with the same fault (503
on 10 % of requests), and the throughput of a long stream.

Every server is its own process on a free loopback port: the upstream (`benchmarks._proxy_peers`, a
model that answers at once, plain or with a stream of chat.completion.chunk events), agentbreak
(`agentbreak serve` in proxy mode, from its own venv: `AGENTBREAK_PYTHON`) and ours (`python -m
gym_failures.cli serve proxy --upstream URL --port P [--fault-plan FILE]`, or `BENCH_PROXY_COMMAND`),
each proxy twice: as a pass-through and with the fault. `direct` is the load client talking to the
upstream itself. One load client (this process: keep-alive HTTP/1.1 on raw asyncio sockets, on uvloop
when installed) measures:

- latency: `LATENCY_REQUESTS` requests one after the other on one connection, plain and streamed
  (`SHORT_EVENTS` events, to the last byte); each round's median and p90, and what a proxy adds to
  the direct median of the same round;
- requests per second: `CONNECTIONS` connections for `SECONDS`, plain and streamed (`SHORT_EVENTS`),
  pass-through and with 503 on 10 %; the share of 503s each proxy answered over all rounds, and the
  server's CPU per request (`/proc`: the proxy's process tree alone; for `direct`, the upstream's);
- a long stream: `LONG_EVENTS` events (about 175 bytes each, every one its own write upstream), one
  after the other on one connection for `SECONDS`, in bytes and events per second of the whole
  replies received, and the server's CPU per MB.

Each measurement kind runs its subjects back to back, in an order that rotates from round to round,
`ROUNDS` rounds; a figure is the median over rounds with its range, every ratio is taken within a
round, and the load average (1 min) over the measurements is printed beside each table. The three
processes of a proxied exchange (client, proxy, upstream) share the machine's cores, where a direct
one has two: on 2 cores a ratio to direct is also a measure of the contention.

The same faults: agentbreak's scenario `http_error` 503 with `schedule: random, probability: 0.1` on
`llm_chat` (Python's unseeded `random`), ours a plan `{"seed": 7, "faults": [{"fault": "status",
"rate": 0.1, "params": {"code": 503}}]}`. Both answer a drawn request themselves, without calling the
upstream (agentbreak with an OpenAI error body, ours with its failure report and a Retry-After).
agentbreak 0.4.6 as published ships no fault catalog and so injects nothing: `benchmarks._proxy_peers`
adds the two kinds it needs (see there). What bounds agentbreak is not its faults: it opens an
`httpx.AsyncClient` per request, whose TLS context (the certifi bundle, loaded even for http://) takes
about 30 ms of CPU.

Ours is measured when `gym-failures serve proxy --help` works, and reported as not available yet
otherwise; agentbreak when its venv is there (`python3 -m venv .venv-bench-agentbreak &&
.venv-bench-agentbreak/bin/pip install agentbreak==0.4.6`). Every server's output goes to a log in a
scratch directory, whose last lines are printed if it does not start. Linux (`/proc`). `python -m
benchmarks proxy`; `BENCH_SECONDS`, `BENCH_ROUNDS` and `BENCH_LATENCY_REQUESTS` shorten it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from benchmarks._proxy_peers import COMPLETION, stream_size

ROOT = Path(__file__).resolve().parents[1]
CONNECTIONS = 32
SECONDS = float(os.environ.get("BENCH_SECONDS", "2.0"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
LATENCY_REQUESTS = int(os.environ.get("BENCH_LATENCY_REQUESTS", "100"))
WARMUP_S = 0.5
SHORT_EVENTS = 20
"""A short streamed reply, as a chat turn: latency and requests per second."""
LONG_EVENTS = 2000
"""A long stream (348 KB): throughput."""
FAULT_RATE = 0.1
FAULT_CODE = 503
START_S = 60.0
"""How long a server may take to listen (a hang guard: agentbreak imports FastAPI and typer)."""
_SERVE_PROXY = [sys.executable, "-m", "gym_failures.cli", "serve", "proxy"]
PROXY_COMMAND = shlex.split(os.environ.get("BENCH_PROXY_COMMAND", "")) or _SERVE_PROXY
"""Ours: `serve proxy` of this checkout, or the command `BENCH_PROXY_COMMAND` names (another build's
`gym-failures serve proxy`, measured in its place), given `--upstream`, `--port` and `--fault-plan`."""
AGENTBREAK_PYTHON = Path(
    os.environ.get("AGENTBREAK_PYTHON", str(ROOT / ".venv-bench-agentbreak" / "bin" / "python"))
)
PROXIES = ("agentbreak", "ours")
PASS = ("direct", *PROXIES)
"""The subjects without a fault, in the tables' order."""
GOAL_STREAM = 0.8
"""Issue goal: a stream passes through ours at this share of the direct throughput or more."""
GOAL_RPS = 2.0
"""Issue goal: ours serves this many times agentbreak's requests per second on the same faults."""

T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _request(stream: bool, events: int = SHORT_EVENTS) -> bytes:
    body = json.dumps(
        {
            "model": "gpt-4o",
            "stream": stream,
            "max_tokens": events,
            "messages": [{"role": "user", "content": "hi there"}],
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-bench\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Closed(Exception):
    """The server closed the connection (before or inside a reply)."""


class _Connection:
    """One keep-alive HTTP/1.1 connection; replies are parsed from one buffer with an offset, so a
    stream of many small chunks costs the client a `find` per chunk, not an `await`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._buffer = b""
        self._offset = 0

    @classmethod
    async def open(cls, port: int) -> _Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def close(self) -> None:
        self._writer.close()

    async def _fill(self) -> None:
        data = await self._reader.read(1 << 18)
        if not data:
            raise _Closed
        self._buffer = self._buffer[self._offset :] + data
        self._offset = 0

    async def _until(self, separator: bytes) -> bytes:
        while (end := self._buffer.find(separator, self._offset)) < 0:
            await self._fill()
        found = self._buffer[self._offset : end]
        self._offset = end + len(separator)
        return found

    async def _skip(self, size: int) -> None:
        while len(self._buffer) - self._offset < size:
            size -= len(self._buffer) - self._offset
            self._buffer, self._offset = b"", 0
            await self._fill()
        self._offset += size

    async def exchange(self, request: bytes) -> tuple[int, int, bool]:
        """Send `request`, read its reply: the status, the body's bytes, whether the server closes."""
        self._writer.write(request)
        head = (await self._until(b"\r\n\r\n")).lower()
        status = int(head[9:12])
        length = _header(head, b"content-length")
        if length is not None:
            body = int(length)
            await self._skip(body)
        elif b"chunked" in (_header(head, b"transfer-encoding") or b""):
            body = 0
            while size := int((await self._until(b"\r\n")).partition(b";")[0], 16):
                await self._skip(size + 2)
                body += size
            await self._until(b"\r\n")  # no trailers are sent
        else:
            raise RuntimeError(f"a reply with neither a length nor chunks: {head[:200]!r}")
        return status, body, _header(head, b"connection") == b"close"


def _header(head: bytes, name: bytes) -> bytes | None:
    start = head.find(b"\r\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 3
    end = head.find(b"\r\n", start)
    return head[start : end if end >= 0 else len(head)].strip()


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run the load client's coroutine on uvloop when it is installed, else on asyncio's loop."""
    if importlib.util.find_spec("uvloop") is None:
        return asyncio.run(coroutine)
    factory: Callable[[], asyncio.AbstractEventLoop] = importlib.import_module("uvloop").new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coroutine)


async def _sequential(port: int, request: bytes, count: int) -> list[float]:
    """Seconds of each of `count` requests one after the other on one connection (after 5 untimed)."""
    connection = await _Connection.open(port)
    try:
        for _ in range(5):
            await connection.exchange(request)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            status, _, closing = await connection.exchange(request)
            times.append(time.perf_counter() - started)
            if status != 200 or closing:
                raise RuntimeError(f"the server answered {status}{' and closed' if closing else ''}")
        return times
    finally:
        connection.close()


@dataclass
class _Load:
    statuses: Counter[int] = field(default_factory=Counter)
    body_bytes: int = 0
    reconnects: int = 0
    elapsed: float = 0.0

    @property
    def replies(self) -> int:
        return sum(self.statuses.values())


async def _drive(port: int, request: bytes, seconds: float, connections: int) -> _Load:
    """`connections` clients sending `request` one after the other until `seconds` have passed: the
    replies (a connection the server closes is opened again), timed to the end of the last."""
    load = _Load()
    started = time.perf_counter()
    deadline = time.monotonic() + seconds
    last = started

    async def client() -> None:
        nonlocal last
        connection = await _Connection.open(port)
        try:
            while time.monotonic() < deadline:
                try:
                    status, body, closing = await connection.exchange(request)
                except (_Closed, ConnectionError):
                    closing, status = True, 0
                    load.reconnects += 1
                else:
                    load.statuses[status] += 1
                    load.body_bytes += body
                    last = time.perf_counter()
                if closing:
                    connection.close()
                    connection = await _Connection.open(port)
        finally:
            connection.close()

    await asyncio.gather(*(client() for _ in range(connections)))
    load.elapsed = last - started
    return load


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` and of every process under it (`/proc`), so that a
    server that runs its work in child processes is billed for them."""
    parents: dict[int, int] = {}
    spent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = Path(entry.path, "stat").read_text().rpartition(")")[2].split()
            parents[int(entry.name)] = int(fields[1])
            spent[int(entry.name)] = int(fields[11]) + int(fields[12])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, of in parents.items() if of == parent and child not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(spent.get(member, 0) for member in tree) / os.sysconf("SC_CLK_TCK")


@dataclass
class _Subject:
    name: str
    port: int
    pid: int


@dataclass
class _Samples:
    """Per round, keyed by (measurement, reply, subject): the round's figures (see `measure`)."""

    rounds: dict[tuple[str, str, str], list[dict[str, float]]] = field(default_factory=dict)
    load: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: tuple[str, str, str], figures: dict[str, float]) -> None:
        self.rounds.setdefault(key, []).append(figures)
        self.load.setdefault(key[0], []).append(os.getloadavg()[0])

    def values(self, key: tuple[str, str, str], figure: str) -> list[float]:
        return [sample[figure] for sample in self.rounds.get(key, [])]


@contextlib.contextmanager
def _process(
    name: str, argv: Sequence[str], port: int, cwd: Path, logs: Path, env: dict[str, str] | None = None
) -> Iterator[_Subject]:
    """Run `argv` in `cwd` (its output to `logs/NAME.log`) until it listens on `port`."""
    log_path = logs / f"{name}.log"
    log = log_path.open("wb")
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(f"{name} did not start: {' / '.join(tail) or 'no output'}")
            time.sleep(0.05)
        yield _Subject(name, port, process.pid)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        log.close()


def _ours_available() -> str | None:
    """None when `gym-failures serve proxy --help` works, else why ours is not measured."""
    done = subprocess.run(
        [*PROXY_COMMAND, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode == 0:
        return None
    return f"not available yet (`gym-failures serve proxy --help` exits {done.returncode})"


def _agentbreak_available() -> tuple[str | None, str]:
    """(None, its version) when agentbreak's venv is there, else (why not, "")."""
    if not AGENTBREAK_PYTHON.exists():
        return f"not installed ({AGENTBREAK_PYTHON} is missing)", ""
    probe = "import agentbreak; print(agentbreak.__version__)"
    done = subprocess.run(
        [str(AGENTBREAK_PYTHON), "-c", probe], capture_output=True, text=True, check=False, timeout=120
    )
    if done.returncode != 0:
        return f"not importable with {AGENTBREAK_PYTHON}", ""
    return None, done.stdout.strip()


def _stack(pid: int) -> str:
    """The event loop and HTTP parser a running server loaded (its memory maps)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    loop = "uvloop" if "/uvloop/" in maps else "asyncio"
    parser = "httptools" if "/httptools/" in maps else "h11"
    return f"{loop} + {parser}"


def _agentbreak_files(directory: Path, upstream: int, port: int, faulty: bool) -> tuple[Path, Path]:
    config = directory / f"agentbreak-{port}.yaml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "llm": {"enabled": True, "mode": "proxy", "upstream_url": f"http://127.0.0.1:{upstream}"},
                "mcp": {"enabled": False},
                "serve": {"host": "127.0.0.1", "port": port},
            }
        )
    )
    scenario = {
        "name": "bench-503",
        "summary": f"HTTP {FAULT_CODE} on {FAULT_RATE:.0%} of chat completions",
        "target": "llm_chat",
        "fault": {"kind": "http_error", "status_code": FAULT_CODE},
        "schedule": {"mode": "random", "probability": FAULT_RATE},
    }
    scenarios = directory / f"agentbreak-{port}-scenarios.yaml"
    scenarios.write_text(json.dumps({"version": 1, "scenarios": [scenario] if faulty else []}))
    return config, scenarios


def _servers(stack: contextlib.ExitStack, scratch: Path, skipped: dict[str, str]) -> dict[str, _Subject]:
    """Start the upstream and every proxy that is there, each as a pass-through and with the fault:
    {subject name: subject}. A proxy that does not start is left out, its reason in `skipped`.

    agentbreak runs in `scratch` (it writes its report card under `.agentbreak/` there on exit), with
    only this checkout on its path (its own venv holds the rest); ours with this process's
    environment, so that `BENCH_PROXY_COMMAND` may name another build."""
    port = _free_port()
    upstream_argv = [sys.executable, "-m", "benchmarks._proxy_peers", "upstream", str(port)]
    upstream = stack.enter_context(_process("direct", upstream_argv, port, ROOT, scratch))
    subjects = {"direct": upstream}
    plan = scratch / "fault-plan.json"
    planned = {"fault": "status", "rate": FAULT_RATE, "params": {"code": FAULT_CODE}}
    plan.write_text(json.dumps({"seed": 7, "faults": [planned]}))
    for faulty in (False, True):
        for proxy in PROXIES:
            if proxy in skipped:
                continue
            name, port = f"{proxy}{'+503' if faulty else ''}", _free_port()
            env: dict[str, str] | None = None
            if proxy == "agentbreak":
                config, scenarios = _agentbreak_files(scratch, upstream.port, port, faulty)
                argv = [str(AGENTBREAK_PYTHON), "-m", "benchmarks._proxy_peers", "agentbreak"]
                argv += [str(config), str(scenarios)]
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
            else:
                argv = [
                    *PROXY_COMMAND,
                    "--upstream",
                    f"http://127.0.0.1:{upstream.port}",
                    "--port",
                    str(port),
                ]
                argv += ["--fault-plan", str(plan)] if faulty else []
            try:
                subjects[name] = stack.enter_context(_process(name, argv, port, scratch, scratch, env))
            except RuntimeError as error:
                skipped[proxy] = str(error)
    return {name: subject for name, subject in subjects.items() if name.partition("+")[0] not in skipped}


def _check(subjects: dict[str, _Subject], skipped: dict[str, str]) -> None:
    """Every subject answers a plain and a long streamed request with the upstream's bytes; a proxy
    that does not is left out (its reason in `skipped`)."""
    expected = {"plain": len(COMPLETION), "stream": stream_size(LONG_EVENTS)}
    requests = {"plain": _request(False), "stream": _request(True, LONG_EVENTS)}

    async def check(subject: _Subject) -> str | None:
        connection = await _Connection.open(subject.port)
        try:
            for reply, request in requests.items():
                for _ in range(20 if subject.name.endswith("+503") else 1):
                    status, body, _ = await connection.exchange(request)
                    if status == 200 and body != expected[reply]:
                        return f"a {reply} reply of {body} bytes, not the upstream's {expected[reply]}"
                    if status != 200 and (status != FAULT_CODE or not subject.name.endswith("+503")):
                        return f"a {reply} request answered {status}"
            return None
        finally:
            connection.close()

    for name, subject in list(subjects.items()):
        problem = _run(check(subject))
        if problem is None:
            continue
        if name == "direct":
            raise RuntimeError(f"the upstream: {problem}")
        skipped[name.partition("+")[0]] = f"left out: {problem}"
        for other in [other for other in subjects if other.partition("+")[0] == name.partition("+")[0]]:
            del subjects[other]


def _rotated(names: Sequence[str], index: int) -> list[str]:
    shift = index % len(names)
    return [*names[shift:], *names[:shift]]


def _latency(samples: _Samples, subjects: dict[str, _Subject], index: int, count: int) -> None:
    for reply, request in (("plain", _request(False)), ("stream", _request(True))):
        for name in _rotated([name for name in PASS if name in subjects], index):
            times = sorted(_run(_sequential(subjects[name].port, request, count)))
            p90 = times[min(len(times) - 1, int(len(times) * 0.9))]
            samples.add(("latency", reply, name), {"median": statistics.median(times), "p90": p90})


def _rps(samples: _Samples, subjects: dict[str, _Subject], index: int, seconds: float) -> None:
    for reply, request in (("plain", _request(False)), ("stream", _request(True))):
        for name in _rotated(list(subjects), index):
            subject = subjects[name]
            cpu = _cpu_s(subject.pid)
            load = _run(_drive(subject.port, request, seconds, CONNECTIONS))
            spent = _cpu_s(subject.pid) - cpu
            unexpected = set(load.statuses).difference({200, FAULT_CODE} if "+" in name else {200})
            if unexpected or not load.replies or load.reconnects:
                raise RuntimeError(
                    f"{name} ({reply}) answered {dict(load.statuses)}, closed {load.reconnects} connections"
                )
            samples.add(
                ("rps", reply, name),
                {
                    "rps": load.replies / load.elapsed,
                    "cpu_us": spent / load.replies * 1e6,
                    "faulted": load.statuses[FAULT_CODE],
                    "replies": load.replies,
                    "reconnects": load.reconnects,
                },
            )


def _stream(samples: _Samples, subjects: dict[str, _Subject], index: int, seconds: float) -> None:
    request = _request(True, LONG_EVENTS)
    size = stream_size(LONG_EVENTS)
    for name in _rotated([name for name in PASS if name in subjects], index):
        subject = subjects[name]
        cpu = _cpu_s(subject.pid)
        load = _run(_drive(subject.port, request, seconds, 1))
        spent = _cpu_s(subject.pid) - cpu
        if set(load.statuses) != {200} or load.body_bytes != load.replies * size:
            raise RuntimeError(f"{name} streamed {load.body_bytes} bytes in {dict(load.statuses)} replies")
        samples.add(
            ("stream", "long", name),
            {
                "mb_s": load.body_bytes / load.elapsed / 1e6,
                "events_s": load.replies * (LONG_EVENTS + 1) / load.elapsed,
                "cpu_s_mb": spent / (load.body_bytes / 1e6),
            },
        )


def measure() -> tuple[_Samples, dict[str, str], list[str]]:
    """The samples of every measurement, the subjects left out (and why), and the run's setting."""
    skipped: dict[str, str] = {}
    missing, agentbreak = _agentbreak_available()
    if missing:
        skipped["agentbreak"] = missing
    if (why := _ours_available()) is not None:
        skipped["ours"] = why
    client = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    setting = [f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}"]
    samples = _Samples()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as scratch, contextlib.ExitStack() as stack:
        subjects = _servers(stack, Path(scratch), skipped)
        _check(subjects, skipped)
        stacks = [f"the load client on {client}", f"the upstream on {_stack(subjects['direct'].pid)}"]
        if "agentbreak" in subjects:
            stacks.append(f"agentbreak {agentbreak} on {_stack(subjects['agentbreak'].pid)}")
        if "ours" in subjects:
            stacks.append(f"ours on {_stack(subjects['ours'].pid)}")
        setting.append(", ".join(stacks) + " (as loaded: each process's memory maps)")
        warm = _Samples()  # every server and path once, untimed
        _latency(warm, subjects, 0, 20)
        _rps(warm, subjects, 0, WARMUP_S)
        _stream(warm, subjects, 0, WARMUP_S)
        setting.append(f"load average before the rounds: {_uptime_load()}")
        for index in range(ROUNDS):
            _latency(samples, subjects, index, LATENCY_REQUESTS)
            _rps(samples, subjects, index, SECONDS)
            _stream(samples, subjects, index, SECONDS)
        setting.append(f"load average after: {_uptime_load()}")
    return samples, skipped, setting


def _uptime_load() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def _span(values: list[float], digits: int = 0, scale: float = 1.0) -> str:
    if not values:
        return "-"
    low, mid, high = (value * scale for value in (min(values), statistics.median(values), max(values)))
    return f"{mid:,.{digits}f} ({low:,.{digits}f} - {high:,.{digits}f})"


def _ratios(
    samples: _Samples, key_a: tuple[str, str, str], key_b: tuple[str, str, str], figure: str
) -> list[float]:
    first, second = samples.values(key_a, figure), samples.values(key_b, figure)
    return [a / b for a, b in zip(first, second, strict=True)] if first and second else []


def _share(samples: _Samples, key: tuple[str, str, str]) -> str:
    """The share of the replies that were the fault's, over every round (a proxy that draws 10 % of a
    few dozen requests a round draws a noisy share in each)."""
    faulted, replies = sum(samples.values(key, "faulted")), sum(samples.values(key, "replies"))
    return f"{faulted / replies:.1%} of {replies:,.0f}"


def _load_note(samples: _Samples, kind: str) -> str:
    values = samples.load.get(kind, [])
    return f"load average (1 min) {min(values):.1f} - {max(values):.1f}" if values else ""


def report(samples: _Samples, skipped: dict[str, str], setting: list[str]) -> str:
    present = [name for name in PASS if ("latency", "plain", name) in samples.rounds]
    lines = [f"- {line}" for line in setting]
    lines += [f"- {name}: {why}" for name, why in skipped.items()]
    lines += [
        "",
        f"Latency, {LATENCY_REQUESTS} requests one after the other on one connection, per round "
        f"(ms; median over {ROUNDS} rounds, range; {_load_note(samples, 'latency')}):",
        "",
        "| reply | subject | median | p90 | added to direct's median |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for reply in ("plain", "stream"):
        direct = samples.values(("latency", reply, "direct"), "median")
        for name in present:
            medians = samples.values(("latency", reply, name), "median")
            added = [m - d for m, d in zip(medians, direct, strict=True)] if name != "direct" else []
            label = "plain" if reply == "plain" else f"stream, {SHORT_EVENTS} events"
            p90 = samples.values(("latency", reply, name), "p90")
            lines.append(
                f"| {label} | {name} | {_span(medians, 2, 1e3)} | {_span(p90, 2, 1e3)} "
                f"| {_span(added, 2, 1e3)} |"
            )
    subjects = [
        name for name in (*PASS, "agentbreak+503", "ours+503") if ("rps", "plain", name) in samples.rounds
    ]
    lines += [
        "",
        f"Requests per second, {CONNECTIONS} connections, {SECONDS:g} s a measurement (median, range; "
        f"server CPU: the proxy's, for direct the upstream's; {_load_note(samples, 'rps')}):",
        "",
        "| reply | subject | requests/s | vs direct | server CPU us/request | 503s answered |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for reply in ("plain", "stream"):
        for name in subjects:
            key = ("rps", reply, name)
            versus = _ratios(samples, key, ("rps", reply, "direct"), "rps") if name != "direct" else []
            share = _share(samples, key) if "+" in name else ""
            label = "plain" if reply == "plain" else f"stream, {SHORT_EVENTS} events"
            lines.append(
                f"| {label} | {name} | {_span(samples.values(key, 'rps'))} | {_span(versus, 3)} "
                f"| {_span(samples.values(key, 'cpu_us'))} | {share} |"
            )
    lines += [
        "",
        f"A long stream ({LONG_EVENTS} events, {stream_size(LONG_EVENTS) / 1e3:.0f} KB), one connection, "
        f"{SECONDS:g} s a measurement (median, range; {_load_note(samples, 'stream')}):",
        "",
        "| subject | MB/s | events/s | vs direct | server CPU s/MB |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in present:
        key = ("stream", "long", name)
        versus = _ratios(samples, key, ("stream", "long", "direct"), "mb_s") if name != "direct" else []
        lines.append(
            f"| {name} | {_span(samples.values(key, 'mb_s'), 1)} | {_span(samples.values(key, 'events_s'))} "
            f"| {_span(versus, 2)} | {_span(samples.values(key, 'cpu_s_mb'), 3)} |"
        )
    lines += ["", *_goals(samples)]
    return "\n".join(lines)


def _goals(samples: _Samples) -> list[str]:
    """The issue's two goals, and ours against agentbreak on every measurement."""
    if ("stream", "long", "ours") not in samples.rounds:
        return ["Goals: not measured (ours is not available)."]

    def verdict(ratios: list[float], goal: float) -> str:
        return f"{_span(ratios, 2)}: {'met' if statistics.median(ratios) >= goal else 'missed'}"

    stream = _ratios(samples, ("stream", "long", "ours"), ("stream", "long", "direct"), "mb_s")
    lines = [
        f"- goal: a long stream through ours / direct, bytes/s >= {GOAL_STREAM}: "
        f"{verdict(stream, GOAL_STREAM)}"
    ]
    if ("rps", "plain", "agentbreak") not in samples.rounds:
        return [*lines, "- goal: ours against agentbreak: not measured (agentbreak is not available)"]
    for reply in ("plain", "stream"):
        faulted = _ratios(samples, ("rps", reply, "ours+503"), ("rps", reply, "agentbreak+503"), "rps")
        clean = _ratios(samples, ("rps", reply, "ours"), ("rps", reply, "agentbreak"), "rps")
        lines.append(
            f"- goal: ours / agentbreak requests/s, {reply}, 503 on {FAULT_RATE:.0%} >= {GOAL_RPS:g}: "
            f"{verdict(faulted, GOAL_RPS)} (no fault: {_span(clean, 2)})"
        )
    for reply in ("plain", "stream"):
        latency = _ratios(samples, ("latency", reply, "agentbreak"), ("latency", reply, "ours"), "median")
        lines.append(f"- agentbreak / ours median latency, {reply}: {_span(latency, 2)}")
    through = _ratios(samples, ("stream", "long", "ours"), ("stream", "long", "agentbreak"), "mb_s")
    lines.append(f"- ours / agentbreak, a long stream's bytes/s: {_span(through, 2)}")
    return lines


def main() -> str:
    samples, skipped, setting = measure()
    text = report(samples, skipped, setting)
    print(text)
    return text


if __name__ == "__main__":
    main()
