"""Start the demo's servers, collect rollouts against them, and stop them whatever happens.

`run_demo` writes everything under `out_dir/<UTC timestamp>/`:

- `tasks.jsonl`: the arithmetic tasks (each collected `num_repeats` times, 1 by default);
- `rollouts.jsonl`, `rollouts_failures.jsonl`, `rollouts.manifest.json`: the collector's rows and manifest
  (`gym_failures.collection`);
- `injected_faults.jsonl`: every fault a server injected (the chaos proxy's included), the ground
  truth to compare the rows with;
- `model.log`, `resources.log`, `proxy.log` (without `--no-proxy`), `agent.log`: each server's log;
- `demo_config.json` (what the servers ran with), `servers.json` (their pids and URLs, written as
  soon as they start) and `demo.json` (the run's summary).

Process hygiene: each server is its own process group (`start_new_session`), listening on a socket
the launcher bound to a free loopback port and passed down. They are stopped on a normal return, an
exception, Ctrl-C, SIGTERM or SIGHUP (SIGTERM to the group, SIGKILL after a grace period), by an
`atexit` hook if the interpreter exits some other way, and, if the launcher is killed outright, by
their own watch of the launcher's pid. SIGTERM and SIGHUP make `run_demo` raise
`SystemExit(128 + signal)` once the servers are stopped, as a process killed by the signal would
report.

Secrets: the launcher makes a random token per run and hands it to each server in its environment
(`$GYM_DEMO_TOKEN`); every demo endpoint requires it (`gym_failures.demo._serve.DemoGuard`), and it
is written to no file. The API key of an external policy (`$GYM_DEMO_MODEL_API_KEY`,
`$OPENAI_API_KEY`) is passed to the agent only, and only when there is an external policy; the other
servers' environments are stripped of it. An external base URL with user info or a query string is
refused before anything is written. The launcher's own calls to the servers ignore proxy variables:
they are loopback calls.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import gym_failures
from gym_failures._loop import run as run_loop
from gym_failures.collection import CollectionConfig, CollectionSummary, collect
from gym_failures.demo._options import DemoOptions
from gym_failures.demo._serve import (
    API_KEY_ENV,
    MAX_TURNS,
    SCRIPTED_POLICY_MODEL,
    TOKEN_ENV,
    TOKEN_HEADER,
    DemoConfig,
    policy_budget_s,
)
from gym_failures.redaction import url_without_secrets
from gym_failures.telemetry import CollectionProgress

__all__ = ["SERVERS", "run_demo"]

SERVERS: dict[str, str] = {
    "model": "gym_failures.demo.model_server",
    "resources": "gym_failures.demo.resources_server",
    "proxy": "gym_failures.demo.proxy_server",
    "agent": "gym_failures.demo.agent_server",
}
"""Each server's name (its log is `<name>.log`) and the module that runs it; `proxy`, the chaos proxy
in front of the resources server, only with `DemoOptions.proxy`."""

_READY_TIMEOUT_S = 30.0
_STOP_GRACE_S = 5.0
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_COLLECTOR_USER = "demo"
"""The user name of the collector's Basic credentials, whose password is the run's token."""

# Every server is on loopback: a proxy from the environment (http_proxy and the like) would receive
# the launcher's calls, and a dead one would keep the demo from ever starting.
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def run_demo(
    out_dir: Path = Path("runs"),
    rollouts: int = 200,
    concurrency: int = 16,
    fault_plan: Path | None = None,
    seed: int = 0,
    *,
    num_repeats: int = 1,
    policy_base_url: str | None = None,
    policy_model: str | None = None,
    stream: Literal["auto", "always", "never"] = "auto",
    policy_timeout_s: float | None = None,
    max_attempts: int = 3,
    proxy: bool = True,
    on_progress: Callable[[CollectionProgress], None] | None = None,
) -> Path:
    """Run the demo gym: `rollouts` arithmetic tasks (`num_repeats` rollouts each, a prompt group) at
    `concurrency`, faults injected by `fault_plan`
    (default: the packaged `default_fault_plan.json`), everything deterministic given `seed`.

    `policy_base_url` and `policy_model` send the policy's calls to an OpenAI-compatible endpoint
    (`<base>/responses`) instead of the scripted policy; its API key is read from the agent's
    environment (`GYM_DEMO_MODEL_API_KEY`, else `OPENAI_API_KEY`). `policy_timeout_s` replaces the
    plan's `limits.policy_timeout_s` (a real model needs far more than the scripted one's 2 s; with
    an external policy it defaults to 60). `proxy=False` lets the agent call the resources server
    directly, without the chaos proxy (and its faults) in between. Every argument but `on_progress`
    is a `DemoOptions` field of the same name and default, validated there before anything is
    written: a refused one raises `DemoOptionsError`. `on_progress(progress)` is called with the
    collection's running counts as rows are saved. Returns the run directory.
    """
    options = DemoOptions(
        out_dir=out_dir,
        rollouts=rollouts,
        num_repeats=num_repeats,
        concurrency=concurrency,
        fault_plan=fault_plan,
        seed=seed,
        policy_base_url=policy_base_url,
        policy_model=policy_model,
        stream=stream,
        policy_timeout_s=policy_timeout_s,
        max_attempts=max_attempts,
        proxy=proxy,
    )
    run_dir = _new_run_dir(options.out_dir)
    tasks_path = run_dir / "tasks.jsonl"
    _write_tasks(tasks_path, options.rollouts, options.seed)
    started = time.monotonic()
    try:
        summary, ready_s = _collect(options, run_dir, tasks_path, on_progress)
    finally:
        # Merged on every way out, so an interrupted run still says what was injected into its rows.
        injected = _merge_injections(run_dir)
    elapsed_s = time.monotonic() - started
    _write_json(
        run_dir / "demo.json",
        {
            "seed": options.seed,
            "rollouts": options.rollouts,
            "concurrency": options.concurrency,
            "proxy": options.proxy,
            "policy": (
                {"scripted": SCRIPTED_POLICY_MODEL}
                if options.policy_base_url is None
                else {"base_url": url_without_secrets(options.policy_base_url), "model": options.policy_model}
            ),
            "fault_plan": options.plan.model_dump(mode="json"),
            "injected_faults": injected,
            "collection": {
                "expected": summary.expected,
                "succeeded": summary.succeeded,
                "failed_final": summary.failed_final,
                "attempts": summary.attempts,
            },
            "servers_ready_s": round(ready_s, 3),
            "elapsed_s": round(elapsed_s, 3),
        },
    )
    return run_dir


def _collect(
    options: DemoOptions,
    run_dir: Path,
    tasks_path: Path,
    on_progress: Callable[[CollectionProgress], None] | None,
) -> tuple[CollectionSummary, float]:
    """Start the servers, collect the tasks in `tasks_path` against them, and stop them; the summary
    and the seconds the servers took to be ready."""
    started = time.monotonic()
    token = _new_token()
    plan = options.plan
    with _ServerGroup(run_dir, token, external_policy=options.external_policy) as servers:
        with contextlib.ExitStack() as bound:
            # The launcher's copies of the sockets close on every way out of this block (a
            # config that does not validate included); each server keeps its own.
            names = [name for name in SERVERS if options.proxy or name != "proxy"]
            sockets = {name: bound.enter_context(_listening_socket()) for name in names}
            urls = {name: f"http://127.0.0.1:{sock.getsockname()[1]}" for name, sock in sockets.items()}
            config = DemoConfig(
                run_dir=run_dir.resolve(),
                seed=options.seed,
                plan=plan,
                model_url=urls["model"],
                resources_url=urls["resources"],
                agent_url=urls["agent"],
                proxy_url=urls.get("proxy"),
                policy_base_url=options.policy_base_url,
                policy_model=options.policy_model or SCRIPTED_POLICY_MODEL,
                stream=options.stream,
            )
            config_path = run_dir / "demo_config.json"
            config_path.write_text(config.model_dump_json(indent=2) + "\n")
            servers.start(config_path, sockets, urls)
        servers.wait_ready()
        ready_s = time.monotonic() - started
        collection = CollectionConfig(
            input_path=tasks_path,
            output_path=run_dir / "rollouts.jsonl",
            # The collector has no header option: aiohttp sends this URL's user info as Basic
            # credentials, which the agent accepts (`DemoGuard`), and never shows it in a URL.
            agent_url=urls["agent"].replace("://", f"://{_COLLECTOR_USER}:{token}@", 1),
            num_repeats=options.num_repeats,
            # The live line counts the groups as the demo's gate does: at least half valid.
            min_valid_per_group=(options.num_repeats + 1) // 2,
            concurrency=options.concurrency,
            max_attempts=options.max_attempts,
            # Only for an agent that hangs: every episode's own calls are bounded well within it.
            timeout_s=60.0 + MAX_TURNS * policy_budget_s(plan.limits.policy_timeout_s),
        )
        return servers.run_async(collect(collection, on_progress)), ready_s


def _new_token() -> str:
    """The run's token: 256 random bits, URL-safe so it can stand in a URL's user info."""
    return secrets.token_urlsafe(32)


# --- Files ---------------------------------------------------------------------------------------


def _new_run_dir(out_dir: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    for suffix in ("", *(f"-{n}" for n in range(2, 1000))):
        candidate = out_dir / f"{stamp}{suffix}"
        try:
            candidate.mkdir()
        except FileExistsError:
            continue  # two runs in one second: never mix their files
        return candidate
    raise FileExistsError(f"no free run directory for {stamp} under {out_dir}")


def _write_tasks(path: Path, count: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for index in range(count):
            op = rng.choice("+-*")
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            value = a + b if op == "+" else a - b if op == "-" else a * b
            row = {
                "id": f"arith-{index:04d}",
                "prompt": f"What is {a} {op} {b}?",
                "expected_answer": str(value),
            }
            handle.write(json.dumps(row) + "\n")


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def _merge_injections(run_dir: Path) -> dict[str, int]:
    """Merge the servers' `<server>.injected.jsonl` into `injected_faults.jsonl`, in time order; the
    count of each fault. A torn last line (a server killed mid-write) is skipped."""
    rows: list[dict[str, Any]] = []
    for path in sorted(run_dir.glob("*.injected.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict):
                    rows.append(row)
        path.unlink()
    rows.sort(key=lambda row: (row.get("time", 0), row.get("rollout_id", "")))
    with (run_dir / "injected_faults.jsonl").open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row.get("fault"))] = counts.get(str(row.get("fault")), 0) + 1
    return dict(sorted(counts.items()))


# --- Processes -----------------------------------------------------------------------------------


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


class _ServerGroup:
    """The demo's server processes, stopped on every way out of the `with` block."""

    def __init__(self, run_dir: Path, token: str, *, external_policy: bool = False) -> None:
        self.run_dir = run_dir
        self.token = token
        self.external_policy = external_policy
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}
        self._guarded: list[signal.Signals] | None = None

    def __enter__(self) -> _ServerGroup:
        atexit.register(self.stop)
        self._guard_signals()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
            # Only once every server is reaped: if stopping was interrupted, the hook still runs.
            atexit.unregister(self.stop)
        finally:
            self._restore_signals()

    # Signals ------------------------------------------------------------------------------------

    def _guard_signals(self) -> None:
        if not _in_main_thread():
            return  # only the main thread may set handlers; atexit and the servers' watch remain
        if self._guarded is None:
            # Only signals left at their default action: one the caller ignores (nohup ignores
            # SIGHUP) or handles itself stays the caller's.
            self._guarded = [s for s in _HANDLED_SIGNALS if signal.getsignal(s) is signal.SIG_DFL]
        for signum in self._guarded:
            signal.signal(signum, _raise_exit)

    def _restore_signals(self) -> None:
        for signum in self._guarded or ():
            signal.signal(signum, signal.SIG_DFL)

    def run_async(self, coroutine: Coroutine[Any, Any, CollectionSummary]) -> CollectionSummary:
        """`asyncio.run(coroutine)` (on uvloop when it is installed, `gym_failures._loop`), with
        SIGTERM and SIGHUP cancelling it as Ctrl-C does, so the collector closes its files and
        sessions before the servers stop."""
        received: list[int] = []

        async def guarded() -> CollectionSummary:
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
            assert task is not None
            installed = list(self._guarded or ())
            for signum in installed:
                loop.add_signal_handler(signum, _cancel, task, received, signum)
            try:
                return await coroutine
            finally:
                for signum in installed:
                    loop.remove_signal_handler(signum)

        try:
            return run_loop(guarded())
        except asyncio.CancelledError:
            if received:
                raise SystemExit(128 + received[0]) from None
            raise
        finally:
            # The loop's handlers are gone; put the launcher's own back until the servers stop.
            self._guard_signals()

    # Servers ------------------------------------------------------------------------------------

    def environment(self, name: str) -> dict[str, str]:
        """Server `name`'s environment: the launcher's, with the run's token, and without an API key
        unless it is the agent of a run with an external policy (the only process that uses one)."""
        env = dict(os.environ)
        if not (name == "agent" and self.external_policy):
            for variable in API_KEY_ENV:
                env.pop(variable, None)
        env[TOKEN_ENV] = self.token
        # The servers import this very copy of the package, whatever put it on this sys.path.
        package_root = str(Path(gym_failures.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self, config_path: Path, sockets: dict[str, socket.socket], urls: dict[str, str]) -> None:
        self.urls = dict(urls)
        try:
            for name, sock in sockets.items():
                module = SERVERS[name]
                with (self.run_dir / f"{name}.log").open("ab") as log:
                    self.processes[name] = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            module,
                            "--config",
                            str(config_path.resolve()),
                            "--fd",
                            str(sock.fileno()),
                            "--parent-pid",
                            str(os.getpid()),
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        pass_fds=(sock.fileno(),),
                        start_new_session=True,
                        env=self.environment(name),
                        cwd=self.run_dir,
                    )
        finally:
            # The servers hold their own copies; the launcher's would keep the ports open after them.
            for sock in sockets.values():
                sock.close()
            _write_json(
                self.run_dir / "servers.json",
                {
                    name: {"pid": process.pid, "url": self.urls[name], "log": f"{name}.log"}
                    for name, process in self.processes.items()
                },
            )

    def wait_ready(self, timeout_s: float = _READY_TIMEOUT_S) -> None:
        """Poll each server's `/health` until all answer; raise if one exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        pending = dict(self.processes)
        while pending:
            for name, process in list(pending.items()):
                code = process.poll()
                if code is not None:
                    raise RuntimeError(
                        f"the {name} server exited with status {code} before it was ready:\n"
                        + self._tail(name)
                    )
                if _healthy(self.urls[name], self.token):
                    del pending[name]
            if pending and time.monotonic() > deadline:
                names = ", ".join(sorted(pending))
                raise TimeoutError(f"not ready after {timeout_s:g} s: {names}")
            if pending:
                time.sleep(0.05)

    def _tail(self, name: str, lines: int = 20) -> str:
        path = self.run_dir / f"{name}.log"
        try:
            return "\n".join(path.read_text("utf-8", "replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM to every server's process group, SIGKILL to those still running after the grace
        period; every process is reaped. Safe to call again."""
        running = [p for p in self.processes.values() if p.poll() is None]
        for process in running:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    # The group id is the leader's pid (start_new_session); the leader is not reaped yet, so the id
    # cannot have been reused by an unrelated group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _healthy(url: str, token: str) -> bool:
    """Whether the server at `url` answers its `/health` with 200, asked directly (never through a
    proxy from the environment) and with the run's token."""
    request = urllib.request.Request(f"{url}/health", headers={TOKEN_HEADER: token})
    try:
        with _LOOPBACK.open(request, timeout=1.0) as reply:
            return bool(reply.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    # Unwind like Ctrl-C, so every `finally` (and the server group's `__exit__`) runs; the exit
    # status is the shell's convention for death by that signal.
    raise SystemExit(128 + signum)


def _cancel(task: asyncio.Task[Any], received: list[int], signum: int) -> None:
    received.append(signum)
    task.cancel()
