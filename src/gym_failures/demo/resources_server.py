"""The demo's resources server: episode sessions, verification with a judge model, and a sandbox.

Run by the launcher as `python -m gym_failures.demo.resources_server --config ... --fd ... --parent-pid ...`.

- `POST /seed_session` `{"task", "rollout_id", "attempt"}` -> `{"session_id"}`: opens a session for
  one episode attempt, holding the task's expected answer.
- `POST /sandbox/run` `{"session_id", "command"}` -> `{"execution_id", "exit_code", "stdout",
  "stderr"}`: runs the command with `/bin/sh -c` as a real subprocess in its own process group and
  an empty working directory (under `<run_dir>/sandbox/`), with `RLIMIT_AS` (memory) and a
  wall-time limit after which the whole group is killed. A command that runs out of memory fails as
  `provider_oom_killed`, one that runs out of time as `provider_command_timeout` (boundary
  `sandbox`, stage `agent`); any other exit code is the command's own result, returned to the policy.
  Only commands on the demo's allowlist (`gym_failures.demo._serve.ALLOWED_COMMAND`, the agent's
  too) are run, whoever asks: any other is refused, unrun, as `provider_request_failed` (boundary
  `sandbox`, stage `agent`). That is the sandbox provider refusing a request, not
  `agent_command_not_allowed`: the agent screens the policy's commands first and fails with that
  kind (the policy's own fault), so a command that reaches the sandbox and is refused got past the
  harness, or came from outside it, and is not the policy's to answer for.
- `POST /verify` `{"session_id", "response"}` -> `{"verdict", "extracted_answer", "reward"}`:
  extracts the policy's final answer (`Final answer: <number>`) from the Responses object's output
  text and asks the judge model (the model server, role `judge`) whether it matches the expected
  answer. An answer that cannot be extracted is `incorrect` without a judge call. The judge's reply
  must hold `VERDICT: CORRECT` or `VERDICT: INCORRECT`, else `judge_unparseable`; a failed judge call
  is `judge_failed`, caused by the model failure; a verifier that raises is `verifier_error`.

Every request must carry the run's token and a JSON body (`gym_failures.demo._serve.DemoGuard`).

The sandbox limits memory and time; it is not an isolation boundary. Commands run as the user who
started the demo, with a minimal environment (no inherited variables, so no credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.client import map_transport_errors, raise_boundary_failure, retry_model_call
from gym_failures.demo._plan import FaultRecorder, draw
from gym_failures.demo._responses import extract_final_answer, new_id, output_text
from gym_failures.demo._serve import (
    ATTEMPT_HEADER,
    CALL_HEADER,
    ROLE_HEADER,
    ROLLOUT_HEADER,
    SCRIPTED_JUDGE_MODEL,
    TOKEN_HEADER,
    TRY_HEADER,
    DemoConfig,
    DemoGuard,
    command_allowed,
    health,
    main,
)
from gym_failures.failure_kinds import (
    ENVIRONMENT_PREPARE_FAILED,
    ENVIRONMENT_PROTOCOL_VIOLATION,
    INFRASTRUCTURE_ERROR,
    JUDGE_FAILED,
    JUDGE_UNPARSEABLE,
    KILL_SHAPED,
    PROVIDER_COMMAND_TIMEOUT,
    PROVIDER_OOM_KILLED,
    PROVIDER_REQUEST_FAILED,
    SESSION_LOST,
    VERIFIER_ERROR,
    FailureStage,
)
from gym_failures.failure_records import SandboxFailureDetails
from gym_failures.failures import ModelFailure, NgFailureEvent, ResourcesServerFailure, SandboxFailure

__all__ = ["CommandRun", "create_app", "run_command"]

PROVIDER = "local-rlimit"
_MAX_OUTPUT = 64 * 1024
_MAX_SESSIONS = 10_000
_VERDICT = re.compile(r"VERDICT:\s*(CORRECT|INCORRECT)", re.IGNORECASE)
# What a process that ran out of address space says: CPython, glibc and coreutils, and C++.
_OOM_EVIDENCE = (b"MemoryError", b"Cannot allocate memory", b"memory exhausted", b"std::bad_alloc")


# --- The sandbox ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandRun:
    """What one command run did. `returncode` is the shell's: negative for a signal, `None` when it
    was still running at the wall-time limit and was killed."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool


def _limits(memory_bytes: int, cpu_s: int) -> Callable[[], None]:
    def apply() -> None:
        # Runs in the child between fork and exec. Only setrlimit calls: no locks, no allocation
        # that a thread of the parent could have left locked at fork time.
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


async def _bounded(stream: asyncio.StreamReader | None) -> bytes:
    """The first `_MAX_OUTPUT` bytes of `stream`; the rest is read and dropped, so a chatty command
    neither blocks on a full pipe nor grows the server's memory."""
    if stream is None:
        return b""
    kept = bytearray()
    while chunk := await stream.read(65536):
        if len(kept) < _MAX_OUTPUT:
            kept += chunk[: _MAX_OUTPUT - len(kept)]
    return bytes(kept)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def run_command(
    command: str, *, memory_bytes: int, wall_s: float, workdir_parent: Path | None = None
) -> CommandRun:
    """Run `command` with `/bin/sh -c` under `RLIMIT_AS=memory_bytes` and a `wall_s` wall-time limit.

    The command runs in a new session (its own process group) in an empty temporary directory (under
    `workdir_parent`, if given). At the limit, or if the caller is cancelled, the whole group is
    killed, grandchildren included.
    """
    # Python tools resolve to this interpreter rather than whatever `python3` the PATH would find
    # first (a pyenv shim is a bash script that costs more than the command).
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    with tempfile.TemporaryDirectory(prefix="gym-demo-sandbox-", dir=workdir_parent) as workdir:
        env = {"PATH": path, "HOME": workdir, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        process = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=env,
            start_new_session=True,
            preexec_fn=_limits(memory_bytes, max(1, int(wall_s * 2))),
        )
        timer = asyncio.timeout(wall_s)
        try:
            async with timer:
                stdout, stderr, _ = await asyncio.gather(
                    _bounded(process.stdout), _bounded(process.stderr), process.wait()
                )
        except TimeoutError:
            if not timer.expired():
                raise
            stdout = stderr = b""
        finally:
            # Always, even after a normal exit: a background grandchild may still hold the group.
            _kill_group(process.pid)
            if process.returncode is None:
                await process.wait()
        timed_out = timer.expired()
        return CommandRun(
            returncode=None if timed_out else process.returncode,
            stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr.decode("utf-8", "replace"),
            timed_out=timed_out,
        )


# --- Sessions ------------------------------------------------------------------------------------


@dataclass
class _Session:
    session_id: str
    rollout_id: str
    attempt: int
    task_id: str
    expected_answer: str
    runs: int = 0


async def _json_body(request: Request, stage: FailureStage) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ResourcesServerFailure(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=f"{request.url.path} needs a JSON object body",
            stage=stage,
        )
    return body


class _ResourcesServer:
    def __init__(self, config: DemoConfig, recorder: FaultRecorder, token: str) -> None:
        self.config = config
        self.token = token
        self.plan = config.plan
        self.recorder = recorder
        self.sessions: dict[str, _Session] = {}
        self.http: aiohttp.ClientSession | None = None
        # Each command's working directory lives under the run's own directory while it runs, so
        # whatever a command leaves behind is traceable to its run.
        self.workdirs = config.run_dir / "sandbox"

    def _session(self, body: dict[str, Any], stage: FailureStage, *, sandbox: bool = False) -> _Session:
        session = self.sessions.get(str(body.get("session_id")))
        if session is None:
            failure_type = SandboxFailure if sandbox else ResourcesServerFailure
            raise failure_type(
                failure_kind=SESSION_LOST,
                failure_reason="no open session has this id (never seeded, or already verified)",
                stage=stage,
            )
        return session

    async def seed_session(self, request: Request) -> Response:
        body = await _json_body(request, "seed")
        task = body.get("task")
        expected = task.get("expected_answer") if isinstance(task, dict) else None
        if not isinstance(task, dict) or not isinstance(expected, str | int | float):
            raise ResourcesServerFailure(
                failure_kind=ENVIRONMENT_PREPARE_FAILED,
                failure_reason="the task has no expected_answer to verify against",
                stage="seed",
            )
        session = _Session(
            session_id=new_id("sess"),
            rollout_id=str(body.get("rollout_id", "")),
            attempt=body["attempt"] if isinstance(body.get("attempt"), int) else 0,
            task_id=str(task.get("id", "")),
            expected_answer=str(expected),
        )
        if len(self.sessions) >= _MAX_SESSIONS:
            # Episodes that failed before verification never close their session: drop the oldest.
            del self.sessions[next(iter(self.sessions))]
        self.sessions[session.session_id] = session
        return JSONResponse({"session_id": session.session_id})

    async def sandbox_run(self, request: Request) -> Response:
        body = await _json_body(request, "agent")
        session = self._session(body, "agent", sandbox=True)
        command = body.get("command")
        if not isinstance(command, str) or not command.strip():
            raise SandboxFailure(
                failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
                failure_reason="/sandbox/run needs a non-empty `command` string",
                stage="agent",
            )
        if not command_allowed(command):
            # Checked here too, not only by the agent: the sandbox runs what it is sent, so it is
            # the sandbox that must refuse. Never run, so nothing is drawn or recorded for it.
            raise SandboxFailure(
                failure_kind=PROVIDER_REQUEST_FAILED,
                failure_reason=(
                    'the sandbox runs only python3 -c "print(<arithmetic>)" commands; '
                    f"refused {command[:120]!r}"
                ),
                stage="agent",
                details=SandboxFailureDetails(
                    provider=PROVIDER,
                    provider_status_reason="command not on the sandbox's allowlist; not run",
                    sandbox_id=session.session_id,
                ),
            )
        limits = self.plan.limits
        memory = limits.sandbox_memory_mib << 20
        index = session.runs
        session.runs += 1
        fault = None
        if session.rollout_id:
            u = draw(self.config.seed, "sandbox", session.rollout_id, session.attempt, index)
            fault = self.plan.sandbox.pick(u)
        if fault == "oom":
            # A real allocation past the real limit, before the policy's command.
            command = f'python3 -c "bytearray({2 * memory})" && {command}'
        elif fault == "timeout":
            command = f"sleep {max(10, int(limits.sandbox_wall_s * 10))} && {command}"
        execution_id = new_id("exec")
        run = await run_command(
            command, memory_bytes=memory, wall_s=limits.sandbox_wall_s, workdir_parent=self.workdirs
        )
        failure = _run_failure(run, execution_id, session, limits.sandbox_memory_mib, limits.sandbox_wall_s)
        if fault is not None:
            event_id = None if failure is None else failure.event_id
            self.recorder.record(f"sandbox.{fault}", session.rollout_id, session.attempt, event_id=event_id)
        if failure is not None:
            raise failure
        return JSONResponse(
            {
                "execution_id": execution_id,
                "exit_code": run.returncode,
                "stdout": run.stdout,
                "stderr": run.stderr,
            }
        )

    async def verify(self, request: Request) -> Response:
        body = await _json_body(request, "verification")
        session = self._session(body, "verification")
        response = body.get("response")
        text = output_text(response) if isinstance(response, dict) else ""
        injected = bool(session.rollout_id) and (
            draw(self.config.seed, "verifier", session.rollout_id, session.attempt)
            < self.plan.resources_server.verifier_exception
        )
        try:
            extracted = _extract(text, session, broken=injected)
        except Exception as error:
            failure = ResourcesServerFailure(
                failure_kind=VERIFIER_ERROR,
                failure_reason=f"the verifier raised {type(error).__name__} while extracting the answer",
                stage="verification",
                exception_type=type(error).__name__,
            )
            if injected:
                self.recorder.record(
                    "resources_server.verifier_exception",
                    session.rollout_id,
                    session.attempt,
                    event_id=failure.event_id,
                )
            raise failure from error
        if extracted is None:
            verdict = "incorrect"  # nothing to judge: the gate tells empty from malformed answers
        else:
            verdict = await self._judge(session, extracted)
        self.sessions.pop(session.session_id, None)
        return JSONResponse(
            {
                "verdict": verdict,
                "extracted_answer": extracted,
                "reward": 1.0 if verdict == "correct" else 0.0,
            }
        )

    async def _judge(self, session: _Session, extracted: str) -> str:
        assert self.http is not None
        http = self.http
        url = f"{self.config.model_url}/v1/responses"
        payload = {
            "model": SCRIPTED_JUDGE_MODEL,
            "input": (
                f"Reference answer: {session.expected_answer}\nCandidate answer: {extracted}\n"
                "Reply with exactly one line: VERDICT: CORRECT or VERDICT: INCORRECT."
            ),
            "max_output_tokens": 32,
        }

        async def call(attempt_id: str) -> dict[str, Any]:
            headers = {
                TOKEN_HEADER: self.token,
                ROLE_HEADER: "judge",
                ROLLOUT_HEADER: session.rollout_id,
                ATTEMPT_HEADER: str(session.attempt),
                CALL_HEADER: "judge",
                TRY_HEADER: attempt_id.rpartition(".")[2],
            }
            with map_transport_errors(
                "model",
                method="POST",
                url=url,
                stage="verification",
                operation="judge",
                attempt_id=attempt_id,
            ):
                async with http.post(url, json=payload, headers=headers) as reply:
                    await raise_boundary_failure(
                        reply,
                        boundary="model",
                        stage="verification",
                        operation="judge",
                        attempt_id=attempt_id,
                    )
                    data = await reply.read()
            try:
                parsed = json.loads(data)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise ModelFailure(
                    failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
                    failure_reason="the judge model answered 2xx without a Responses object",
                    stage="verification",
                    attempt_id=attempt_id,
                )
            return parsed

        try:
            reply = await retry_model_call(
                call, max_attempts=2, budget_s=20.0, replay_safe=True, backoff_s=0.1
            )
        except NgFailureEvent as error:
            raise ResourcesServerFailure(
                failure_kind=JUDGE_FAILED,
                failure_reason="the judge model call failed",
                stage="verification",
            ) from error
        text = output_text(reply)
        match = _VERDICT.search(text)
        if match is None:
            raise ResourcesServerFailure(
                failure_kind=JUDGE_UNPARSEABLE,
                failure_reason=f"the judge's reply holds no VERDICT line: {text[:120]!r}",
                stage="verification",
            )
        return match.group(1).lower()


def _extract(text: str, session: _Session, *, broken: bool) -> str | None:
    if broken:
        # The injected verifier bug: a lookup that a real verifier could get wrong.
        references: dict[str, str] = {}
        return references[session.task_id]
    return extract_final_answer(text)


def _run_failure(
    run: CommandRun, execution_id: str, session: _Session, memory_mib: int, wall_s: float
) -> SandboxFailure | None:
    """The sandbox failure `run` shows, or `None` when the command ran to its own exit code."""

    def details(reason: str) -> SandboxFailureDetails:
        return SandboxFailureDetails(
            execution_id=execution_id,
            exit_code=run.returncode,
            provider=PROVIDER,
            provider_status_reason=reason,
            sandbox_id=session.session_id,
        )

    if run.timed_out:
        return SandboxFailure(
            failure_kind=PROVIDER_COMMAND_TIMEOUT,
            failure_reason=(
                f"the command ran past its {wall_s:g} s wall-time limit; its process group was killed"
            ),
            stage="agent",
            details=details(f"wall time {wall_s:g} s exceeded; SIGKILL to the process group"),
        )
    if run.returncode and any(marker.decode() in run.stderr for marker in _OOM_EVIDENCE):
        return SandboxFailure(
            failure_kind=PROVIDER_OOM_KILLED,
            failure_reason=f"the command ran out of memory under RLIMIT_AS={memory_mib} MiB",
            stage="agent",
            details=details(f"allocation failed under RLIMIT_AS={memory_mib} MiB"),
        )
    if run.returncode is not None and run.returncode < 0:
        signal_name = (
            signal.Signals(-run.returncode).name if -run.returncode in signal.valid_signals() else "?"
        )
        return SandboxFailure(
            failure_kind=KILL_SHAPED,
            failure_reason=f"the command was killed by signal {-run.returncode} ({signal_name})",
            stage="agent",
            details=details(f"terminated by {signal_name}"),
        )
    return None


def create_app(config: DemoConfig, token: str) -> ASGIApp:
    """The resources server's ASGI app; every request must carry the run's `token` (`DemoGuard`),
    which it also sends on its own calls to the model server."""
    recorder = FaultRecorder(config.run_dir, "resources")
    server = _ResourcesServer(config, recorder, token)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        server.workdirs.mkdir(exist_ok=True)
        # Loopback only: proxy variables are ignored (trust_env=False, aiohttp's default, spelt out).
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), trust_env=False) as http:
            server.http = http
            try:
                yield
            finally:
                server.http = None
                recorder.close()
                with contextlib.suppress(OSError):
                    server.workdirs.rmdir()  # empty unless a command is still being cleaned up

    return Starlette(
        routes=[
            Route("/seed_session", server.seed_session, methods=["POST"]),
            Route("/sandbox/run", server.sandbox_run, methods=["POST"]),
            Route("/verify", server.verify, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        middleware=[
            Middleware(DemoGuard, token=token),
            Middleware(
                FailureReportMiddleware,
                boundary="resources_server",
                default_failure_kind=INFRASTRUCTURE_ERROR,
            ),
        ],
        lifespan=lifespan,
    )


if __name__ == "__main__":
    main("resources", create_app)
