"""What the demo's three servers share: their configuration, the identity headers, and how each runs.

The launcher binds each server's listening socket itself and passes it to the server process
(`--fd`), so a port is never chosen, released and then taken by someone else before the server
binds it, and every URL is known before any server starts. A server also watches its launcher
(`--parent-pid`) and shuts down if it goes away, so even a launcher killed with SIGKILL leaves no
server behind for longer than half a second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import uvicorn
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from gym_failures.demo._plan import FaultPlan

LOGGER = logging.getLogger("gym_failures.demo")

SCRIPTED_POLICY_MODEL = "demo-scripted-policy"
SCRIPTED_JUDGE_MODEL = "demo-scripted-judge"

# The operation's identity travels in headers, not in the Responses body: an external endpoint
# ignores unknown headers, while unknown body fields can be refused.
ROLE_HEADER = "X-Demo-Role"
ROLLOUT_HEADER = "X-Demo-Rollout-Id"
ATTEMPT_HEADER = "X-Demo-Attempt"
CALL_HEADER = "X-Demo-Call"
TRY_HEADER = "X-Demo-Try"

_PARENT_POLL_S = 0.5

MAX_TURNS = 4
"""The agent's policy calls per episode attempt."""
POLICY_TRIES = 3
"""The agent's tries per policy call (`retry_model_call`'s `max_attempts`)."""


def policy_budget_s(policy_timeout_s: float) -> float:
    """The time one policy call may take with its retries: every try to its deadline, plus backoff."""
    return POLICY_TRIES * policy_timeout_s + 10.0


class DemoConfig(BaseModel):
    """One demo run's configuration, written by the launcher to `<run_dir>/demo_config.json` and read
    by every server. It holds no credential: the agent reads an external endpoint's key from its
    environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_dir: Path
    seed: int
    plan: FaultPlan
    model_url: str
    """The local scripted model server (the policy by default, and always the judge)."""
    resources_url: str
    agent_url: str
    policy_base_url: str | None = None
    """An OpenAI-compatible base URL (`.../v1`) that serves the policy instead of the scripted one.
    It is written to this file as given: keep the key in the environment, never in the URL."""
    policy_model: str = SCRIPTED_POLICY_MODEL
    stream: Literal["auto", "always", "never"] = "auto"
    """Whether the agent streams policy calls; `auto` streams about half of the rollouts."""


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def main(name: str, create_app: Callable[[DemoConfig], ASGIApp], argv: Sequence[str] | None = None) -> None:
    """Run server `name` on the socket the launcher passed, until SIGTERM, SIGINT or the launcher's exit."""
    parser = argparse.ArgumentParser(prog=f"gym_failures.demo.{name}")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--fd", type=int, required=True, help="a listening TCP socket to serve on")
    parser.add_argument("--parent-pid", type=int, required=True, help="shut down when this process ends")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s")
    config = DemoConfig.model_validate_json(args.config.read_text("utf-8"))
    sock = socket.socket(fileno=args.fd)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            log_config=None,  # the root logger above formats every line of the server's log
            access_log=False,  # thousands of lines per run; failures are logged by the middleware
            lifespan="on",
            # Below the launcher's 5 s grace before SIGKILL: uvicorn cancels what is still running
            # itself, so a sandbox command's `finally` kills its process group.
            timeout_graceful_shutdown=3,
        )
    )
    asyncio.run(_serve(server, sock, args.parent_pid))


async def _serve(server: uvicorn.Server, sock: socket.socket, parent_pid: int) -> None:
    watchdog = asyncio.create_task(_watch_parent(server, parent_pid))
    try:
        await server.serve(sockets=[sock])
    finally:
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog


async def _watch_parent(server: uvicorn.Server, parent_pid: int) -> None:
    # An orphan is re-parented (to init or a subreaper), so a changed parent id means the launcher is gone.
    while not server.should_exit:
        if os.getppid() != parent_pid:
            LOGGER.warning("launcher %d is gone; shutting down", parent_pid)
            server.should_exit = True
            return
        await asyncio.sleep(_PARENT_POLL_S)
