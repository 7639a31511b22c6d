"""What the demo's servers share: their configuration, the identity headers, the run's token,
the sandbox's allowlist, and how each runs.

The launcher binds each server's listening socket itself and passes it to the server process
(`--fd`), so a port is never chosen, released and then taken by someone else before the server
binds it, and every URL is known before any server starts. A server also watches its launcher
(`--parent-pid`) and shuts down if it goes away, so even a launcher killed with SIGKILL leaves no
server behind for longer than half a second.

Loopback is not a trust boundary: any local user, and any web page through the browser, can reach a
loopback port. So every endpoint of every demo server (`/health` included) requires the run's
token (`DemoGuard`): a random value the launcher makes per run and hands to each server in its
environment (`$GYM_DEMO_TOKEN`, never a file or an argument, which other users can read). The
servers send it as `X-Demo-Token`; the collector, which has no header option, sends it as the
password of HTTP Basic auth (the launcher gives it `http://demo:<token>@127.0.0.1:<port>`, which
aiohttp turns into that header and never echoes). A body must also be `application/json`, which a
web page cannot send to another origin without the browser asking first.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import logging
import os
import re
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import uvicorn
from pydantic import BaseModel, ConfigDict, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_failures._loop import run as run_loop
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

TOKEN_ENV = "GYM_DEMO_TOKEN"
"""The variable that hands each server the run's token (see the module docstring)."""
TOKEN_HEADER = "X-Demo-Token"
"""The header that carries the run's token on every call between the demo's processes."""
_MIN_TOKEN = 16

API_KEY_ENV = ("GYM_DEMO_MODEL_API_KEY", "OPENAI_API_KEY")
"""Where the agent finds an external endpoint's API key, first match wins. Never in a file or a flag,
and only in the agent's environment: the launcher strips these from the other servers'."""

ALLOWED_COMMAND = re.compile(r'python3 -c "print\([0-9+\-*/%(). ]{1,200}\)"')
"""The only commands the demo runs: `python3 -c "print(<arithmetic>)"`. Inside the double quotes
none of the shell's special characters (`$`, a backquote, `\\`, `"`) is allowed, so the shell can do
nothing but start python3 with that text."""

_PARENT_POLL_S = 0.5

MAX_TURNS = 4
"""The agent's policy calls per episode attempt."""
POLICY_TRIES = 3
"""The agent's tries per policy call (`retry_model_call`'s `max_attempts`)."""
RESOURCES_TRIES = 3
"""The agent's tries per `seed_session` or `verify` call: a 429 or 503 (the server says it did not
process the request) is retried after its Retry-After, within `RESOURCES_BUDGET_S`."""
RESOURCES_BUDGET_S = 5.0
"""The seconds a `seed_session` or `verify` call may spend waiting to retry: a Retry-After past what
is left of it ends the call at once (the demo's proxy plans an `outage` of 60 s)."""


def policy_budget_s(policy_timeout_s: float) -> float:
    """The time one policy call may take with its retries: every try to its deadline, plus backoff."""
    return POLICY_TRIES * policy_timeout_s + 10.0


def command_allowed(command: str) -> bool:
    """Whether `command`, exactly as it would be run, is on the allowlist (`ALLOWED_COMMAND`). The
    agent checks the policy's commands with it, and the sandbox checks every command again."""
    return ALLOWED_COMMAND.fullmatch(command) is not None


def check_policy_base_url(url: str) -> str:
    """`url` if it is an http(s) base URL without user info, query string or fragment, else a
    `ValueError` whose message never repeats those parts. The URL is written to the run's files, so
    a secret in it would land on disk: the key belongs in the environment (`API_KEY_ENV`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("the model base URL must be an http:// or https:// URL with a host")
    if "@" in parts.netloc:
        raise ValueError(
            "the model base URL must not hold user info (user:password@); "
            f"put the API key in ${API_KEY_ENV[0]} or ${API_KEY_ENV[1]}"
        )
    if "?" in url or "#" in url:
        raise ValueError(
            "the model base URL must not hold a query string or fragment; "
            f"put the API key in ${API_KEY_ENV[0]} or ${API_KEY_ENV[1]}"
        )
    return url


class DemoConfig(BaseModel):
    """One demo run's configuration, written by the launcher to `<run_dir>/demo_config.json` and read
    by every server. It holds no credential: the agent reads an external endpoint's key from its
    environment."""

    # An invalid policy_base_url may hold a secret: never repeat it in a validation error.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    run_dir: Path
    seed: int
    plan: FaultPlan
    model_url: str
    """The local scripted model server (the policy by default, and always the judge)."""
    resources_url: str
    agent_url: str
    proxy_url: str | None = None
    """The chaos proxy in front of the resources server (`gym_failures.demo.proxy_server`): the agent
    calls the resources server through it when set, directly without it."""
    policy_base_url: str | None = None
    """An OpenAI-compatible base URL (`.../v1`) that serves the policy instead of the scripted one.
    One with user info, a query string or a fragment is refused (`check_policy_base_url`): this file
    is on disk, and the key belongs in the agent's environment."""
    policy_model: str = SCRIPTED_POLICY_MODEL
    stream: Literal["auto", "always", "never"] = "auto"
    """Whether the agent streams policy calls; `auto` streams about half of the rollouts."""

    @field_validator("policy_base_url")
    @classmethod
    def _no_secret_in_the_url(cls, url: str | None) -> str | None:
        return None if url is None else check_policy_base_url(url)


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


class DemoGuard:
    """Refuse every HTTP request without the run's token (403), and every request with a body that
    is not `application/json` (415), before the app sees it.

    The token is accepted as `X-Demo-Token: <token>` or as the password of `Authorization: Basic`
    (any user name), the form the collector sends (see the module docstring). It is compared in
    constant time. A refusal says nothing about the server beyond the refusal itself.
    """

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        if len(token) < _MIN_TOKEN:
            raise ValueError(f"the demo's token must be at least {_MIN_TOKEN} characters")
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http" or not self._authorized(scope["headers"]):
            if scope["type"] == "http":
                await _refuse(send, 403, "this demo server needs its run's token")
            return  # a websocket is never accepted: closing before accepting refuses it
        if scope["method"] not in ("GET", "HEAD") and not _is_json(scope["headers"]):
            await _refuse(send, 415, "a request body must be application/json")
            return
        await self.app(scope, receive, send)

    def _authorized(self, headers: Sequence[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            if name == b"x-demo-token" and hmac.compare_digest(value.strip(), self._token):
                return True
            if name == b"authorization":
                scheme, _, credentials = value.strip().partition(b" ")
                if scheme.lower() != b"basic":
                    continue
                try:
                    decoded = base64.b64decode(credentials.strip(), validate=True)
                except (binascii.Error, ValueError):
                    continue
                _, colon, password = decoded.partition(b":")
                if colon and hmac.compare_digest(password, self._token):
                    return True
        return False


def _is_json(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"content-type":
            return value.partition(b";")[0].strip().lower() == b"application/json"
    return False


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main(
    name: str, create_app: Callable[[DemoConfig, str], ASGIApp], argv: Sequence[str] | None = None
) -> None:
    """Run server `name` on the socket the launcher passed, until SIGTERM, SIGINT or the launcher's exit.

    The run's token comes from `$GYM_DEMO_TOKEN`, which is removed from this process's environment
    once read, so no subprocess inherits it."""
    parser = argparse.ArgumentParser(prog=f"gym_failures.demo.{name}")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--fd", type=int, required=True, help="a listening TCP socket to serve on")
    parser.add_argument("--parent-pid", type=int, required=True, help="shut down when this process ends")
    args = parser.parse_args(argv)
    token = os.environ.pop(TOKEN_ENV, "")
    if len(token) < _MIN_TOKEN:
        parser.error(f"${TOKEN_ENV} must hold the run's token (at least {_MIN_TOKEN} characters)")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s")
    config = DemoConfig.model_validate_json(args.config.read_text("utf-8"))
    sock = socket.socket(fileno=args.fd)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config, token),
            log_config=None,  # the root logger above formats every line of the server's log
            access_log=False,  # thousands of lines per run; failures are logged by the middleware
            lifespan="on",
            # Below the launcher's 5 s grace before SIGKILL: uvicorn cancels what is still running
            # itself, so a sandbox command's `finally` kills its process group.
            timeout_graceful_shutdown=3,
        )
    )
    run_loop(_serve(server, sock, args.parent_pid))


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
