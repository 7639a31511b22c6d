"""The middleware's success-path and failure-path cost, driven in process (ASGI calls, no sockets).

Variants run in alternating batches in one process, so a noisy neighbour slows them alike:
- bare: the Starlette app alone;
- floor: a pure-ASGI middleware that only sets a ContextVar per request and wraps `send` (the
  structural floor of any per-request middleware);
- gym: `FailureReportMiddleware`;
- base_http: Starlette's `BaseHTTPMiddleware` doing the same work (a log per request, the header).

The failure path compares a handler raising a Gym failure with a 10-event cause chain under the
middleware against a bare handler returning a 500 of the same size.

Telemetry (`measure_telemetry`): OpenTelemetry's global providers can be set once per process, so a
worker process installs an SDK meter provider (an in-memory reader) and an SDK tracer provider, and
runs alternating batches with gym-failures' recording on and in its no-op state (the state without
`opentelemetry`), the failure path with and without every request inside a span.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.util
import logging
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failure_transport import FailureHeader, RequestFailureLog
from gym_failures.failures import AgentFailure, ModelFailure, NgFailureEvent

# The recorder's no-op state is toggled between batches, which only its private global allows.
from gym_failures.telemetry import _record as telemetry_record

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_FLOOR_VAR: contextvars.ContextVar[object | None] = contextvars.ContextVar("floor", default=None)


class FloorMiddleware:
    """Sets a ContextVar per request and wraps `send`: the least any such middleware does."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _FLOOR_VAR.set(object())
        started = False

        async def wrapped(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            _FLOOR_VAR.reset(token)


class BaseHTTPFailureMiddleware(BaseHTTPMiddleware):
    """The same work as `FailureReportMiddleware` on the success path, the Starlette-decorator way."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        with RequestFailureLog.capture() as log:
            response = await call_next(request)
            response.headers.update(FailureHeader.encode(log.report))
            return response


async def _ok(request: Request) -> Response:
    return PlainTextResponse("ok")


def _chain(length: int) -> NgFailureEvent:
    failure: NgFailureEvent | None = None
    for index in range(length):
        cls = ModelFailure if index < length - 1 else AgentFailure
        kind = "model_server_error" if cls is ModelFailure else "agent_run_error"
        new = cls(failure_kind=kind, failure_reason=f"attempt {index} failed: upstream answered 503")
        new.__cause__ = failure
        failure = new
    assert failure is not None
    return failure


async def _raise_chain(request: Request) -> Response:
    raise _chain(10)


def _app(failing: bool = False) -> Starlette:
    return Starlette(routes=[Route("/", _raise_chain if failing else _ok)])


def _variants() -> dict[str, ASGIApp]:
    floor = _app()
    floor.add_middleware(FloorMiddleware)
    gym = _app()
    gym.add_middleware(FailureReportMiddleware, boundary="agent")
    base_http = _app()
    base_http.add_middleware(BaseHTTPFailureMiddleware)
    return {"bare": _app(), "floor": floor, "gym": gym, "base_http": base_http}


def _scope() -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/",
        "raw_path": b"/",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"bench"), (b"accept", b"*/*")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _batch(app: ASGIApp, requests: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Requests per second over one batch (by `clock`: wall time unless told)."""
    sent: list[int] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            sent.append(message["status"])

    start = clock()
    for _ in range(requests):
        await app(_scope(), _receive, send)
    elapsed = clock() - start
    assert len(sent) == requests
    return requests / elapsed


async def _startup(app: ASGIApp) -> None:
    # Build Starlette's middleware stack once, outside the timed batches.
    await _batch(app, 10)


async def measure(rounds: int = 15, requests: int = 2000) -> dict[str, float]:
    """Median requests per second of each variant, success and failure paths."""
    variants = _variants()
    failing = _app(failing=True)
    failing.add_middleware(FailureReportMiddleware, boundary="agent")
    failure_body = b"x" * 120

    async def bare_500(request: Request) -> Response:
        return PlainTextResponse(failure_body, status_code=500)

    bare_failing = Starlette(routes=[Route("/", bare_500)])
    all_apps: dict[str, ASGIApp] = {**variants, "failure_gym": failing, "failure_bare": bare_failing}
    for app in all_apps.values():
        await _startup(app)
    results: dict[str, list[float]] = {name: [] for name in all_apps}
    for _ in range(rounds):
        for name, app in all_apps.items():
            batch = requests if not name.startswith("failure") else requests // 4
            results[name].append(await _batch(app, batch))
    return {name: statistics.median(values) for name, values in results.items()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _serve(variant: str, loop: str = "asyncio", http: str = "h11") -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            f"benchmarks._uvicorn_apps:{variant}",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
            "--log-level",
            "warning",
            "--loop",
            loop,
            "--http",
            http,
        ],
        cwd=Path(__file__).resolve().parents[1],
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return process, f"http://127.0.0.1:{port}/"
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"uvicorn {variant} did not start")


def _wrk(url: str, seconds: int) -> float:
    output = subprocess.run(
        ["wrk", "-t1", "-c32", f"-d{seconds}s", url], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if match is None:
        raise RuntimeError(f"unexpected wrk output: {output}")
    return float(match.group(1))


def measure_uvicorn(
    rounds: int = 5, seconds: int = 3, loop: str = "asyncio", http: str = "h11"
) -> dict[str, float] | None:
    """Median requests per second of each variant under uvicorn (its `--loop` and `--http`), driven
    by wrk on loopback; `None` without wrk. Two cores serve both wrk and uvicorn, so this is a figure,
    not a gate."""
    if shutil.which("wrk") is None:
        return None
    variants = ("bare", "floor", "gym", "base_http")
    servers = {variant: _serve(variant, loop, http) for variant in variants}
    try:
        for _, url in servers.values():
            _wrk(url, 1)  # warm up
        samples: dict[str, list[float]] = {variant: [] for variant in variants}
        for index in range(rounds):
            order = variants[index % 4 :] + variants[: index % 4]
            for variant in order:
                samples[variant].append(_wrk(servers[variant][1], seconds))
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(timeout=10)
    return {variant: statistics.median(values) for variant, values in samples.items()}


class SpanPerRequest:
    """Runs each request inside an SDK span, as OpenTelemetry's ASGI instrumentation does."""

    def __init__(self, app: ASGIApp) -> None:
        from opentelemetry import trace

        self.app = app
        self.tracer = trace.get_tracer("benchmarks")

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        with self.tracer.start_as_current_span("request"):
            await self.app(scope, receive, send)


def _install_sdk() -> None:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    trace.set_tracer_provider(TracerProvider())


async def _interleaved(
    first: tuple[ASGIApp, Callable[[], None]],
    second: tuple[ASGIApp, Callable[[], None]],
    size: int,
    pairs: int,
) -> tuple[int, int, float]:
    """CPU nanoseconds of `pairs` batches of `size` requests of each of two subjects (an app and the
    call that sets its recording state), batch by batch, the first alternating: their totals and
    the median of each pair's ratio (first / second)."""
    totals = [0, 0]
    ratios: list[float] = []
    sent: list[int] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            sent.append(message["status"])

    subjects = (first, second)
    clock = time.process_time_ns
    for index in range(pairs):
        spent = [0, 0]
        for side in (0, 1) if index % 2 == 0 else (1, 0):
            app, set_state = subjects[side]
            set_state()
            start = clock()
            for _ in range(size):
                await app(_scope(), _receive, send)
            spent[side] = clock() - start
        totals[0] += spent[0]
        totals[1] += spent[1]
        ratios.append(spent[0] / spent[1])
    assert len(sent) == 2 * size * pairs
    return totals[0], totals[1], statistics.median(ratios)


async def _telemetry_worker() -> None:
    """Serve comparisons named on stdin (`<app> <on|off> <app> <on|off> <size> <pairs>`), answering
    each with the two subjects' CPU nanoseconds and the median pair ratio (`_interleaved`).

    `off` is the instrumentation's own no-op state (as without `opentelemetry`, or switched off):
    toggling it between batches of a few requests in one process compares the same code, heap and
    CPU placement, and a burst of a noisy neighbour lands on both subjects alike.
    """
    logging.getLogger("gym_failures").setLevel(logging.CRITICAL)
    _install_sdk()
    loaded = telemetry_record._load()
    assert loaded is not None
    variants = _variants()
    failing = _app(failing=True)
    failing.add_middleware(FailureReportMiddleware, boundary="agent")
    apps: dict[str, ASGIApp] = {
        "floor": variants["floor"],
        "gym": variants["gym"],
        "failure": failing,
        "failure_span": SpanPerRequest(failing),
    }
    for app in apps.values():
        await _startup(app)

    def state(recording: str) -> Callable[[], None]:
        def set_state() -> None:
            telemetry_record._instruments = loaded if recording == "on" else None

        return set_state

    for line in sys.stdin:
        name_a, state_a, name_b, state_b, size, pairs = line.split()
        first, second, median = await _interleaved(
            (apps[name_a], state(state_a)), (apps[name_b], state(state_b)), int(size), int(pairs)
        )
        print(first, second, median, flush=True)


def measure_telemetry(rounds: int = 9) -> dict[str, float]:
    """With the SDK installed: requests per CPU second of the success path (floor, gym) and of the
    failure path with and without a span, recording (`*_on`) and not (`*_off`), each as the median
    over `rounds`; and for each pair compared, the median over rounds of its ratio of CPU per
    request (`a/b`: the ratio of the two subjects' total CPU, so a cost paid now and then, as the
    report-size batch, counts), with its rounds' range and the median batch-pair ratio (`a/b pairs`).

    A round interleaves the two subjects in batches of a few requests (2 on the failure path, about
    1.2 ms of CPU a batch on a quiet machine; 50 on the success path), the first of each pair
    alternating: on the shared two cores a burst of another process's work then lands on both.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_middleware", "--telemetry-worker"],
        cwd=Path(__file__).resolve().parents[1],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None
    assert process.stdout is not None

    def compare(first: tuple[str, str], second: tuple[str, str], size: int, pairs: int) -> list[float]:
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(f"{first[0]} {first[1]} {second[0]} {second[1]} {size} {pairs}\n")
        process.stdin.flush()
        return [float(value) for value in process.stdout.readline().split()]

    # (first, second, batch size, batch pairs): 2,000 success requests or 500 failure requests a side.
    comparisons = [
        (("gym", "on"), ("floor", "on"), 50, 40),
        (("gym", "off"), ("floor", "on"), 50, 40),
        (("failure", "on"), ("failure", "off"), 2, 250),
        (("failure_span", "on"), ("failure_span", "off"), 2, 250),
    ]
    try:
        compare(("failure", "on"), ("failure_span", "on"), 5, 2)  # first-call costs, untimed
        samples: dict[str, list[float]] = {}
        for _ in range(rounds):
            for first, second, size, pairs in comparisons:
                spent_first, spent_second, pair_median = compare(first, second, size, pairs)
                requests = size * pairs
                for subject, spent in ((first, spent_first), (second, spent_second)):
                    samples.setdefault(f"{subject[0]}_{subject[1]}", []).append(requests / spent * 1e9)
                ratio = f"{first[0]}_{first[1]}/{second[0]}_{second[1]}"
                # Cost per request second / first: above 1, the first is the faster.
                samples.setdefault(ratio, []).append(spent_second / spent_first)
                samples.setdefault(f"{ratio} pairs", []).append(1 / pair_median)
    finally:
        process.stdin.close()
        process.wait(timeout=30)
    figures = {name: statistics.median(values) for name, values in samples.items()}
    for name, values in samples.items():
        if "/" in name and not name.endswith(" pairs"):  # a ratio: its rounds' range beside the median
            figures[f"{name} low"], figures[f"{name} high"] = min(values), max(values)
    return figures


def telemetry_table(figures: Mapping[str, float]) -> str:
    """The telemetry figures as a markdown table: requests per CPU second, and per round the ratio of
    CPU per request (its median over rounds, the rounds' range, and the median ratio of the batch
    pairs, which leaves out a cost paid now and then)."""
    success_on, success_off = figures["gym_on/floor_on"], figures["gym_off/floor_on"]
    floor = f"{figures['floor_on']:,.0f}"
    lines = [
        "| SDK meter and tracer provider installed | requests per CPU s | CPU ratio (round median) "
        "| target |",
        "| --- | ---: | ---: | --- |",
        f"| success path: floor | {floor} | 1.000 | |",
        f"| success path: gym | {figures['gym_on']:,.0f} | {success_on:.3f} of the floor | ≥ 0.95 |",
        f"| success path: gym, recording off | {figures['gym_off']:,.0f} | {success_off:.3f} of floor | |",
    ]
    for name, what in (
        ("failure", "failure path, no active span"),
        ("failure_span", "failure path, in a span"),
    ):
        ratio = f"{name}_on/{name}_off"
        keys = (ratio, f"{ratio} high", f"{ratio} low", f"{ratio} pairs")
        cost, low, high, pairs = (1 / figures[key] for key in keys)
        lines.append(f"| {what}: recording off | {figures[f'{name}_off']:,.0f} | 1.000 | |")
        lines.append(
            f"| {what}: recording | {figures[f'{name}_on']:,.0f} | {cost:.3f}x the cost "
            f"({low:.3f}x to {high:.3f}x; batch pairs {pairs:.3f}x) | ≤ 1.1x |"
        )
    return "\n".join(lines)


def uvicorn_tables() -> list[str]:
    """The under-uvicorn figures on asyncio with h11 and, when installed, on uvloop with httptools
    (what `uvicorn --loop auto --http auto` picks when they are)."""
    stacks = [("asyncio", "h11")]
    if importlib.util.find_spec("uvloop") and importlib.util.find_spec("httptools"):
        stacks.append(("uvloop", "httptools"))
    lines: list[str] = []
    for loop, http in stacks:
        served = measure_uvicorn(loop=loop, http=http)
        if served is None:
            return ["", "(wrk not found: the under-uvicorn figures were skipped)"]
        lines += [
            "",
            f"| variant (uvicorn {loop} + {http}, wrk -t1 -c32, loopback) | requests/s (median) | vs bare "
            "| vs floor |",
            "| --- | ---: | ---: | ---: |",
        ]
        for name in ("bare", "floor", "gym", "base_http"):
            value = served[name]
            lines.append(
                f"| {name} | {value:,.0f} | {value / served['bare']:.3f} | {value / served['floor']:.3f} |"
            )
    if len(stacks) == 1:
        lines += ["", "(uvloop or httptools not installed: the uvloop + httptools figures were skipped)"]
    return lines


def main() -> str:
    # The failure path logs one ERROR line per request; a benchmark measures the work, not a terminal.
    logging.getLogger("gym_failures").setLevel(logging.CRITICAL)
    figures = asyncio.run(measure())
    floor, bare = figures["floor"], figures["bare"]
    lines = [
        "| variant (in process, success path) | requests/s (median) | vs bare | vs floor |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name in ("bare", "floor", "gym", "base_http"):
        value = figures[name]
        lines.append(f"| {name} | {value:,.0f} | {value / bare:.3f} | {value / floor:.3f} |")
    lines += [
        "",
        "| failure path (in process) | requests/s (median) | ratio |",
        "| --- | ---: | ---: |",
        f"| bare handler returning a 500 | {figures['failure_bare']:,.0f} | 1.000 |",
        f"| Gym failure with a 10-event chain | {figures['failure_gym']:,.0f} | "
        f"{figures['failure_gym'] / figures['failure_bare']:.3f} |",
    ]
    lines += ["", telemetry_table(measure_telemetry())]
    lines += uvicorn_tables()
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    if sys.argv[1:] == ["--telemetry-worker"]:
        asyncio.run(_telemetry_worker())
    else:
        main()
