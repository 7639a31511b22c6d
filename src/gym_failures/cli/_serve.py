"""`gym-failures serve model`: run the fault-injecting model endpoint (`gym_failures.model_endpoint`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_failures.cli._app import (
    EXIT_OK,
    METRICS_MODULES,
    CommandError,
    Subcommands,
    add_command,
    add_metrics_option,
    port_number,
    require_extra,
    require_file,
)
from gym_failures.cli._text import stderr_line

if TYPE_CHECKING:
    import socket

__all__ = ["FAULT_NAMES", "add_serve"]

# Named here, not imported: building the parser must not load the endpoint (starlette, pydantic) on
# every start of the command line. A test keeps this list equal to `model_endpoint.FAULTS`.
FAULT_NAMES = (
    "quota_429",
    "server_503",
    "server_500",
    "drop_connection",
    "cut_stream",
    "stream_failed",
    "slow",
    "truncated",
    "empty",
)


def add_serve(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "serve",
        _run_serve,
        help="run a server from this library, for testing clients against real failure shapes",
        description="serve model: an OpenAI- and Anthropic-compatible model endpoint with fault "
        "injection: POST /v1/responses, /v1/chat/completions and /v1/messages (plain and streamed), "
        "GET /v1/models and GET /health. Force a fault on one request with the header "
        "`X-Gym-Fault: <name>` (parameters: `; times=N; retry_after=S; delay=S; id=X`); the faults: "
        + ", ".join(FAULT_NAMES)
        + " (docs/model_endpoint.md says what each does). Needs the demo extra.",
        extra="demo",
    )
    parser.add_argument("server", choices=("model",), help="the server to run: model")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8000, help="the port to listen on (8000)")
    parser.add_argument(
        "--fault-plan",
        type=Path,
        default=None,
        metavar="FILE",
        help='a JSON plan of fault rates, e.g. {"rates": {"quota_429": 0.05}, "seed": 7}',
    )
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require this key (Bearer or x-api-key) on every /v1 request ($GYM_FAILURES_API_KEY)",
    )
    add_metrics_option(parser)


def _run_serve(arguments: argparse.Namespace) -> int:
    import contextlib
    import logging
    import os

    if arguments.metrics_port is not None:
        require_extra("--metrics-port", "prometheus", METRICS_MODULES)
    import uvicorn
    from pydantic import ValidationError

    from gym_failures.cli._live import metrics_endpoint
    from gym_failures.model_endpoint import ModelEndpoint, load_plan
    from gym_failures.redaction import MIN_KNOWN_SECRET, register_secret

    if arguments.fault_plan is not None:
        require_file(arguments.fault_plan, f"--fault-plan {arguments.fault_plan}")
    try:
        plan = load_plan(arguments.fault_plan)
    except ValidationError as error:
        raise CommandError(
            f"--fault-plan {arguments.fault_plan}: not a valid plan: {_first_problem(error)}"
        ) from None
    except (ValueError, OSError) as error:
        raise CommandError(f"--fault-plan {arguments.fault_plan}: not a valid plan ({error})") from None
    api_key = arguments.api_key or os.environ.get("GYM_FAILURES_API_KEY") or None
    if api_key and len(api_key) >= MIN_KNOWN_SECRET:
        register_secret(api_key)  # a failure text quoting it is scrubbed, whoever made it
    listening = _listen(arguments.host, arguments.port)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = ModelEndpoint(plan=plan, api_key=api_key).app()
    with contextlib.ExitStack() as running:
        running.callback(listening.close)
        if arguments.metrics_port is not None:
            running.enter_context(metrics_endpoint(arguments.metrics_port, "gym-failures-model"))
        # uvicorn serves the socket bound above, and logs no start line for a socket it is given.
        host, port = listening.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        stderr_line(f"gym-failures serve: the model endpoint on http://{shown}:{port} (Ctrl-C stops it)")
        # The endpoint keeps nothing to start or stop: no lifespan, so a second Ctrl-C during
        # shutdown has no lifespan task to cancel (and no traceback of it to print).
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        server = uvicorn.Server(config)
        server.run(sockets=[listening])
    return EXIT_OK


def _first_problem(error: Any) -> str:
    """A pydantic `ValidationError`'s first problem as `where: what` (no input, no link), with how
    many more there are."""
    problems = error.errors(include_url=False, include_input=False)
    first = problems[0]
    parts = [str(part) for part in first["loc"]]
    where = ".".join(parts)
    if len(parts) >= 2 and parts[-1] == "[key]":  # pydantic's `rates.bogus.[key]`: a mapping's key
        where = ", ".join([*filter(None, [".".join(parts[:-2])]), f"key {parts[-2]!r}"])
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{where + ': ' if where else ''}{first['msg']}{more}"


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` for uvicorn to serve, as uvicorn binds one; a busy port or an
    address this machine does not have is one line (exit status 2), before the server starts, rather
    than uvicorn's log lines and its exit status 3."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as error:
        listening.close()
        if error.errno == errno.EADDRINUSE:
            raise CommandError(f"port {port} is in use") from None
        raise CommandError(
            f"--host {host} --port {port}: cannot listen there ({error.strerror or error})"
        ) from None
    listening.listen(2048)  # uvicorn's backlog: a request sent before uvicorn starts waits, not refused
    return listening
