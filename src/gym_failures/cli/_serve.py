"""`gym-failures serve model`: run the fault-injecting model endpoint (`gym_failures.model_endpoint`)
until Ctrl-C or SIGTERM; `gym-failures verdict` (`gym_failures.cli._verdict`) judges what it saw.
`gym-failures serve agent`: run the standalone agent server (`gym_failures.agent_server`) against a
model URL.

Decisions:
- `serve` takes the server as a subcommand (`serve model`), so `serve model --help` is the model
  endpoint's own page: its options, its faults and its exit status.
- `--verdict-file FILE` is written when the server stops, by Ctrl-C or SIGTERM: the verdict and the
  journal it read, so `gym-failures verdict FILE --client ROWS` can judge it again with the client's
  record.
- `--metrics-port` listens on `--host`, as the endpoint does: a server bound to loopback must not
  expose its metrics to the network.
"""

from __future__ import annotations

import argparse
import contextlib
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_failures.cli._exits import EXIT_OK, CommandError, first_problem
from gym_failures.cli._extras import METRICS_MODULES, require_extra
from gym_failures.cli._inputs import require_file
from gym_failures.cli._options import Subcommands, add_command, add_metrics_option, port_number
from gym_failures.cli._serve_proxy import add_serve_proxy
from gym_failures.cli._serving import (
    listen_socket,
    log_to_stderr,
    no_record_of_cancelled_requests,
    serve_until_stopped,
    write_verdict_file,
)
from gym_failures.cli._text import stderr_line

if TYPE_CHECKING:
    pass

__all__ = [
    "AGENT_MODULES",
    "FAULT_NAMES",
    "SERVE_AGENT_EXIT_HELP",
    "SERVE_EXIT_HELP",
    "SERVE_MODEL_EXIT_HELP",
    "add_serve",
    "seconds_option",
]

# Named here, not imported: building the parser must not load the endpoint (starlette, pydantic) on
# every start of the command line. A test keeps this list equal to `model_endpoint.FAULTS`.
FAULT_NAMES = (
    "none",
    "quota_429",
    "server_503",
    "server_500",
    "status",
    "context_window",
    "drop_connection",
    "cut_stream",
    "stream_failed",
    "malformed_chunk",
    "stall",
    "slow_first_token",
    "slow",
    "paced",
    "truncated",
    "empty",
    "bad_tool_arguments",
    "unknown_tool",
)

SERVE_EXIT_HELP = """exit status (each server's page, `serve model --help` and so on, has its own):
  0    stopped on its own (a signal ends it otherwise: 130, 143)
  2    nothing served: a bad option, a plan that is not valid, a busy port, an
       extra that is not installed (one line on stderr says which)
  130  interrupted (Ctrl-C)
  143  ended by SIGTERM, once the server has stopped (a shell shows 128 + 15;
       Python's subprocess, -15)"""

SERVE_MODEL_EXIT_HELP = """exit status:
  0    stopped on its own (a signal ends it otherwise: 130, 143)
  2    nothing served: a bad option, a plan that is not valid, a busy port, an
       extra that is not installed (one line on stderr says which)
  130  interrupted (Ctrl-C): the server stopped, and --verdict-file was written
  143  ended by SIGTERM: the server stopped, and --verdict-file was written (a
       shell shows 128 + 15; Python's subprocess, -15)"""

SERVE_AGENT_EXIT_HELP = """exit status:
  0    stopped on its own (a signal ends it otherwise: 130, 143)
  2    nothing served: a bad option, a busy port, an extra that is not
       installed (one line on stderr says which)
  130  interrupted (Ctrl-C)
  143  ended by SIGTERM, once the server has stopped (a shell shows 128 + 15;
       Python's subprocess, -15)"""

AGENT_MODULES = ("starlette", "uvicorn", "openai")
"""What `serve agent` needs: the `agent` extra's modules (`require_extra`)."""


def add_serve(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "serve",
        _run_serve,
        help="run a server from this library, for testing clients against real failure shapes",
        description="Run a server from this library: `serve model`, the fault-injecting model endpoint "
        "(see `gym-failures serve model --help`); `serve agent`, a standalone agent server against "
        "an OpenAI-compatible model URL (see `gym-failures serve agent --help`); `serve proxy`, a "
        "chaos proxy in front of any HTTP server (see `gym-failures serve proxy --help`).",
        extra="demo",
    )
    parser.epilog = SERVE_EXIT_HELP
    servers = parser.add_subparsers(
        title="servers",
        metavar="{model,agent,proxy}",
        dest="server",
        parser_class=type(parser),
        required=True,
    )
    _add_serve_model(servers)
    _add_serve_agent(servers)
    add_serve_proxy(servers)


def _add_serve_model(servers: Any) -> None:
    model = servers.add_parser(
        "model",
        help="an OpenAI- and Anthropic-compatible model endpoint that injects faults",
        description=textwrap.fill(
            "serve model: an OpenAI- and Anthropic-compatible model endpoint with fault injection: "
            "POST /v1/responses, /v1/chat/completions and /v1/messages (plain and streamed), GET "
            "/v1/models and GET /health; the control routes /_gym/journal, /_gym/verdict, "
            "/_gym/faults and /_gym/reset. Force a fault on one request with the header "
            "`X-Gym-Fault: <name>` (parameters: `; times=N; retry_after=S; retry_after_ms=MS; "
            "delay=S; code=N; after=N; interval=S; id=X`); the faults: "
            + ", ".join(FAULT_NAMES)
            + " (docs/model_endpoint.md says what each does). Every reply with an injected fault "
            "names it in X-Gym-Fault-Injected and X-Gym-Fault-Event. Needs the demo extra (the "
            "serve extra adds uvloop and httptools).",
            88,
        ),
        epilog=SERVE_MODEL_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model.set_defaults(run=_run_serve, extra="demo", command_name="serve", counts_skipped_lines=False)
    model.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1)")
    model.add_argument("--port", type=port_number, default=8000, help="the port to listen on (8000)")
    model.add_argument(
        "--fault-plan",
        type=Path,
        default=None,
        metavar="FILE",
        help='a JSON plan of fault rates, e.g. {"rates": {"quota_429": 0.05}, "seed": 7}',
    )
    model.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require this key (Bearer or x-api-key) on every /v1 and /_gym request ($GYM_FAILURES_API_KEY)",
    )
    model.add_argument(
        "--rpm", type=_per_minute, default=None, metavar="N", help="a requests-per-minute quota (429s)"
    )
    model.add_argument(
        "--tpm", type=_per_minute, default=None, metavar="N", help="an input-tokens-per-minute quota (429s)"
    )
    model.add_argument(
        "--latency", type=seconds_option, default=None, metavar="S", help="delay every reply by S seconds"
    )
    model.add_argument(
        "--chunk-interval",
        type=seconds_option,
        default=None,
        metavar="S",
        help="pace every stream: S seconds between its events",
    )
    model.add_argument(
        "--verdict-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the recovery verdict and the journal to FILE (JSON) when the server stops",
    )
    add_metrics_option(model)


def _add_serve_agent(servers: Any) -> None:
    agent = servers.add_parser(
        "agent",
        help="a standalone agent server (NeMo Gym's /run and ours) against an OpenAI-compatible model",
        description=textwrap.fill(
            "serve agent: a standalone agent server, NeMo Gym's simple_agent without a resources "
            "server. POST /run takes gym-failures' protocol ({task, rollout_id, attempt}: a "
            "BaseEpisodeResponse back) or NeMo Gym's (a row with responses_create_params: the "
            "flat verify-response row back); each task is one call to --model-url with the openai "
            "SDK, whose retries (--max-retries) are observed into the reply's failure report. A task "
            "is {responses_create_params | prompt, expected | answer}: the reward is 1.0 when the "
            "answer contains the expected text (case-insensitive), else 0.0, and null without one "
            "(docs/agents.md). Needs the agent extra.",
            88,
        ),
        epilog=SERVE_AGENT_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    agent.set_defaults(
        run=_run_serve_agent, extra="agent", command_name="serve agent", counts_skipped_lines=False
    )
    agent.add_argument(
        "--model-url", required=True, metavar="URL", help="the model's OpenAI-compatible base URL (.../v1)"
    )
    agent.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1)")
    agent.add_argument("--port", type=port_number, default=8001, help="the port to listen on (8001)")
    agent.add_argument(
        "--api", choices=("responses", "chat"), default="responses", help="the model's API (responses)"
    )
    agent.add_argument("--model", default=None, metavar="NAME", help="the model name (else each task's own)")
    agent.add_argument("--api-key", default=None, metavar="KEY", help="the model's API key ($OPENAI_API_KEY)")
    agent.add_argument(
        "--max-retries",
        type=_retries,
        default=2,
        metavar="N",
        help="the SDK's retries of a failed call: a 429, a 5xx, a lost connection (2)",
    )


def _retries(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"{value} is out of range (0-10)")
    return value


def _model_url(text: str) -> str:
    """`--model-url` checked: an http(s) URL with a host; a bad one is exit status 2."""
    from urllib.parse import urlsplit

    from gym_failures.redaction import url_without_secrets

    try:
        parts = urlsplit(text)
        host = parts.hostname
    except ValueError:
        host = None
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise CommandError(f"--model-url {url_without_secrets(text)}: not an http(s) URL with a host")
    return text.rstrip("/")


def _run_serve_agent(arguments: argparse.Namespace) -> int:
    import logging
    import os

    require_extra("serve agent", "agent", AGENT_MODULES)
    model_url = _model_url(arguments.model_url)
    import uvicorn

    from gym_failures.agent_server import AgentServerConfig, create_app
    from gym_failures.redaction import url_without_secrets

    config = AgentServerConfig(
        model_url=model_url,
        api=arguments.api,
        model=arguments.model,
        api_key=arguments.api_key or os.environ.get("OPENAI_API_KEY") or None,
        max_retries=arguments.max_retries,
    )
    # Bound first: a busy port is one line before anything else is set up.
    listening = listen_socket(arguments.host, arguments.port)
    with contextlib.ExitStack() as running:
        running.callback(listening.close)
        log_to_stderr()
        for chatty in ("httpx", "httpx2", "openai"):
            # A line a model call (httpx's `HTTP Request: POST ...`) is noise: failures are in the replies.
            logging.getLogger(chatty).setLevel(logging.WARNING)
        app = create_app(config)
        host, port = listening.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        stderr_line(
            f"gym-failures serve: the agent on http://{shown}:{port}, calling {arguments.api} at "
            f"{url_without_secrets(model_url)} (Ctrl-C stops it)"
        )
        # No lifespan, as `serve model`: the SDK's client needs no closing at the process's end, and
        # a second Ctrl-C during shutdown has no lifespan task to cancel.
        server_config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        running.enter_context(no_record_of_cancelled_requests())
        uvicorn.Server(server_config).run(sockets=[listening])
    return EXIT_OK


def _per_minute(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 100_000_000:
        raise argparse.ArgumentTypeError(f"{value} is out of range (1-100000000)")
    return value


def seconds_option(text: str) -> float:
    """An option's number of seconds, 0-3600."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} is out of range (0-3600 s)")
    return value


def _run_serve(arguments: argparse.Namespace) -> int:
    import os

    if arguments.metrics_port is not None:
        require_extra("--metrics-port", "prometheus", METRICS_MODULES)
    from pydantic import ValidationError

    from gym_failures.model_endpoint import ModelEndpoint, Quota, load_plan
    from gym_failures.redaction import MIN_KNOWN_SECRET, register_secret

    if arguments.fault_plan is not None:
        require_file(arguments.fault_plan, f"--fault-plan {arguments.fault_plan}")
    try:
        plan = load_plan(arguments.fault_plan)
    except ValidationError as error:
        raise CommandError(
            f"--fault-plan {arguments.fault_plan}: not a valid plan: {first_problem(error)}"
        ) from None
    except (ValueError, OSError) as error:
        raise CommandError(f"--fault-plan {arguments.fault_plan}: not a valid plan ({error})") from None
    changes = {"latency_s": arguments.latency, "interval_s": arguments.chunk_interval}
    plan = plan.model_copy(update={k: v for k, v in changes.items() if v is not None})
    if arguments.verdict_file is not None and not arguments.verdict_file.parent.is_dir():
        raise CommandError(f"--verdict-file {arguments.verdict_file}: no such directory")
    api_key = arguments.api_key or os.environ.get("GYM_FAILURES_API_KEY") or None
    if api_key and len(api_key) >= MIN_KNOWN_SECRET:
        register_secret(api_key)  # a failure text quoting it is scrubbed, whoever made it
    log_to_stderr()
    quota = None
    if arguments.rpm is not None or arguments.tpm is not None:
        quota = Quota(rpm=arguments.rpm, tpm=arguments.tpm)
    endpoint = ModelEndpoint(plan=plan, api_key=api_key, quota=quota)
    return serve_until_stopped(
        endpoint.app(),
        arguments,
        what="the model endpoint",
        metrics_name="gym-failures-model",
        write_verdict=lambda path: write_verdict_file(endpoint, path),
    )
