"""`gym-failures serve model` against llmock 0.2.2, side by side: requests per second and server CPU
per request, plain and streamed Chat Completions, each stack with asyncio + h11 and with uvloop +
httptools (the `serve` extra).

Every server runs as its own uvicorn process (`benchmarks._endpoint_server`), access log off for
both (llmock's own command line logs every request; ours never does), no fault, no latency. One
load client (this process: keep-alive HTTP/1.1 on raw asyncio sockets, `CONNECTIONS` at once) drives
each server for `SECONDS` per measurement, in rounds whose order rotates, so a disturbance of the
shared machine lands on every subject alike; a figure is the median over rounds, with its range, and
every ratio is taken within one round. Server CPU is the process's user + system time (`/proc`)
over the requests it served.

Needs the `benchmark` extra (llmock, uvloop, httptools); without llmock it says so and stops.
`python -m benchmarks model_endpoint`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONNECTIONS = 16
SECONDS = float(os.environ.get("BENCH_SECONDS", "2.0"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
WARMUP_S = 0.5
BASELINE_SRC = os.environ.get("BENCH_BASELINE_SRC")
"""A checkout's `src` of the endpoint before a change (`before`), measured beside it when set."""
SERVERS = ("ours", "llmock", *(("before",) if BASELINE_SRC else ()))
STACKS = ("asyncio+h11", "uvloop+httptools")
MODES = ("plain", "stream")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _request(mode: str) -> bytes:
    body = json.dumps(
        {"model": "gpt-4o", "stream": mode == "stream", "messages": [{"role": "user", "content": "hi there"}]}
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-bench\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    if head[9:12] != b"200":
        raise RuntimeError(f"the server answered {head[:40]!r}")
    lower = head.lower()
    marker = lower.find(b"content-length:")
    if marker >= 0:
        end = lower.index(b"\r\n", marker)
        await reader.readexactly(int(lower[marker + 15 : end]))
        return
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return


async def _drive(port: int, mode: str, seconds: float) -> int:
    request = _request(mode)
    done = 0
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < deadline:
                await _exchange(reader, writer, request)
                done += 1
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(CONNECTIONS)))
    return done


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _server(kind: str, stack: str) -> Iterator[tuple[int, int]]:
    port = _free_port()
    source = BASELINE_SRC if kind == "before" and BASELINE_SRC else str(ROOT / "src")
    env = {**os.environ, "PYTHONPATH": f"{source}{os.pathsep}{ROOT}"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks._endpoint_server",
            "llmock" if kind == "llmock" else "ours",
            stack,
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} ({stack}) did not start")
            time.sleep(0.05)
        yield port, process.pid
    finally:
        process.terminate()
        process.wait(30)


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def measure() -> tuple[dict[tuple[str, str, str], list[tuple[float, float]]], str, str]:
    """(server, stack, mode) -> [(requests/s, CPU us/request)] per round; the load before and after."""
    before = _uptime()
    subjects = [(server, stack, mode) for stack in STACKS for server in SERVERS for mode in MODES]
    samples: dict[tuple[str, str, str], list[tuple[float, float]]] = {s: [] for s in subjects}
    with contextlib.ExitStack() as servers:
        ports = {
            (server, stack): servers.enter_context(_server(server, stack))
            for stack in STACKS
            for server in SERVERS
        }
        for server, stack, mode in subjects:  # warm every server and path once
            asyncio.run(_drive(ports[server, stack][0], mode, WARMUP_S))
        for index in range(ROUNDS):
            shift = index % len(subjects)
            for server, stack, mode in subjects[shift:] + subjects[:shift]:
                port, pid = ports[server, stack]
                cpu = _cpu_s(pid)
                started = time.monotonic()
                done = asyncio.run(_drive(port, mode, SECONDS))
                elapsed = time.monotonic() - started
                cpu_us = (_cpu_s(pid) - cpu) / done * 1e6
                samples[server, stack, mode].append((done / elapsed, cpu_us))
    return samples, before, _uptime()


def _span(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> str:
    if importlib.util.find_spec("llmock") is None:
        return "bench_model_endpoint: llmock is not installed (pip install 'gym-failures[benchmark]')"
    samples, before, after = measure()
    lines = [
        f"load before: {before}",
        f"load after:  {after}",
        "",
        "| stack | mode | ours req/s | llmock req/s | ours / llmock req/s | ours CPU us/req "
        "| llmock CPU us/req | llmock / ours CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for stack in STACKS:
        for mode in MODES:
            ours, theirs = samples["ours", stack, mode], samples["llmock", stack, mode]
            rps_ratio = [o[0] / t[0] for o, t in zip(ours, theirs, strict=True)]
            cpu_ratio = [t[1] / o[1] for o, t in zip(ours, theirs, strict=True)]
            lines.append(
                f"| {stack} | {mode} | {_span([o[0] for o in ours])} | {_span([t[0] for t in theirs])} "
                f"| {_span(rps_ratio, 2)} | {_span([o[1] for o in ours])} | {_span([t[1] for t in theirs])} "
                f"| {_span(cpu_ratio, 2)} |"
            )
    fast = [
        o[0] / t[0]
        for mode in MODES
        for o, t in zip(
            samples["ours", "uvloop+httptools", mode], samples["llmock", "asyncio+h11", mode], strict=True
        )
    ]
    lines += ["", f"ours with the serve extra / llmock with asyncio+h11, req/s: {_span(fast, 2)}"]
    if BASELINE_SRC:
        lines += [
            "",
            "| stack | mode | ours / before req/s | ours / before CPU per request |",
            "| --- | --- | --- | --- |",
        ]
        for stack in STACKS:
            for mode in MODES:
                ours, baseline = samples["ours", stack, mode], samples["before", stack, mode]
                rps = [o[0] / b[0] for o, b in zip(ours, baseline, strict=True)]
                cpu = [o[1] / b[1] for o, b in zip(ours, baseline, strict=True)]
                lines.append(f"| {stack} | {mode} | {_span(rps, 2)} | {_span(cpu, 2)} |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
