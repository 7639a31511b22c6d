"""`gym-failures serve proxy`: run the failure-aware chaos proxy (`gym_failures.proxy`) in front of
`--upstream` until Ctrl-C or SIGTERM; `gym-failures verdict` judges its `--verdict-file` as it judges
the model endpoint's.

Decisions:
- `--boundary` names the hop the proxy fronts (`resources_server` without it): a status fault is a
  failure of that boundary, so the caller's chain shows it where the upstream stands.
- `--toxic JSON` (repeatable) adds a toxic at start, in Toxiproxy's shape, beside the plan's: a
  one-off latency needs no plan file.
- `--upstream` with user info (`http://user:password@host`) is refused, without echoing it: the proxy
  forwards each caller's own credentials, and a second set in the URL would either clash with them
  or be sent for callers that never had it.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

from gym_failures.cli._exits import CommandError, first_problem
from gym_failures.cli._extras import METRICS_MODULES, require_extra
from gym_failures.cli._inputs import require_file
from gym_failures.cli._options import add_metrics_option, port_number

__all__ = ["BOUNDARIES", "PROXY_FAULT_NAMES", "PROXY_MODULES", "SERVE_PROXY_EXIT_HELP", "add_serve_proxy"]

# Named here, not imported: building the parser must not load the proxy. A test keeps these equal to
# `gym_failures.proxy.PROXY_FAULTS` and `FailureBoundary`.
PROXY_FAULT_NAMES = (
    "none",
    "status",
    "drop_connection",
    "cut_stream",
    "slow",
    "slow_first_byte",
    "stall",
    "malformed_json",
    "oversized_header",
    "tool_error",
    "protocol_error",
    "drop_session",
    "slow_tool",
)
BOUNDARIES = ("agent", "collection", "environment", "harness", "model", "resources_server", "sandbox")
PROXY_MODULES = ("aiohttp", "starlette", "uvicorn")
"""What `serve proxy` needs: the `proxy` extra's modules (`require_extra`)."""

SERVE_PROXY_EXIT_HELP = """exit status:
  0    stopped on its own (a signal ends it otherwise: 130, 143)
  2    nothing served: a bad option, a plan or toxic that is not valid, a busy
       port, an extra that is not installed (one line on stderr says which)
  130  interrupted (Ctrl-C): the proxy stopped, and --verdict-file was written
  143  ended by SIGTERM: the proxy stopped, and --verdict-file was written (a
       shell shows 128 + 15; Python's subprocess, -15)"""


def add_serve_proxy(servers: Any) -> None:
    proxy = servers.add_parser(
        "proxy",
        help="a chaos proxy in front of any HTTP server: Toxiproxy's toxics, HTTP and MCP faults",
        description=textwrap.fill(
            "serve proxy: a failure-aware chaos proxy in front of --upstream (a resources server, a "
            "sandbox, a judge, an agent, a model). Every path but /_gym/... is forwarded. Force a "
            "fault on one request with `X-Gym-Fault: <name>` (parameters: `; times=N; retry_after=S; "
            "delay=S; code=N; after=N; size=N; id=X`); the faults: "
            + ", ".join(PROXY_FAULT_NAMES)
            + ". Toxiproxy's toxics (latency, bandwidth, slow_close, timeout, reset_peer, slicer, "
            "limit_data) are added at run time with POST /_gym/toxics in Toxiproxy's JSON shape, "
            "or with --toxic. Control routes: /_gym/journal, /_gym/verdict, /_gym/faults, "
            "/_gym/toxics, /_gym/proxy, /_gym/reset, /_gym/health. docs/proxy.md says what each "
            "fault and toxic does. Needs the proxy extra.",
            88,
        ),
        epilog=SERVE_PROXY_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    proxy.set_defaults(run=_run_serve_proxy, extra="proxy", command_name="serve", counts_skipped_lines=False)
    proxy.add_argument(
        "--upstream", required=True, type=_upstream, metavar="URL", help="the server behind the proxy"
    )
    proxy.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1)")
    proxy.add_argument("--port", type=port_number, default=8010, help="the port to listen on (8010)")
    proxy.add_argument(
        "--boundary",
        choices=BOUNDARIES,
        default="resources_server",
        help="the boundary of the upstream, named by its failures (resources_server)",
    )
    proxy.add_argument(
        "--fault-plan",
        type=Path,
        default=None,
        metavar="FILE",
        help='a JSON plan, e.g. {"faults": [{"fault": "status", "rate": 0.1}], "seed": 7}',
    )
    proxy.add_argument(
        "--toxic",
        action="append",
        default=[],
        metavar="JSON",
        help='a toxic to start with (repeatable), e.g. {"type": "latency", "attributes": {"latency": 100}}',
    )
    proxy.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require this key (Bearer or x-api-key) on the /_gym control routes ($GYM_FAILURES_API_KEY)",
    )
    proxy.add_argument(
        "--verdict-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the recovery verdict and the journal to FILE (JSON) when the proxy stops",
    )
    add_metrics_option(proxy)


def _upstream(text: str) -> str:
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 (read to check it: a port out of range or not a number raises)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not a URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError("not an http:// or https:// URL with a host")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError("an upstream has no query or fragment: the request's own are sent")
    if parts.username is not None or parts.password is not None:
        # Never echoed: the line would print the credentials it refuses.
        raise argparse.ArgumentTypeError(
            "an upstream URL with user info: the callers' own credentials are forwarded, send them there"
        )
    return text


def _run_serve_proxy(arguments: argparse.Namespace) -> int:
    import os

    require_extra("serve proxy", "proxy", PROXY_MODULES)
    if arguments.metrics_port is not None:
        require_extra("--metrics-port", "prometheus", METRICS_MODULES)
    from gym_failures.cli._serving import log_to_stderr, serve_until_stopped, write_verdict_file
    from gym_failures.proxy import ChaosProxy
    from gym_failures.redaction import MIN_KNOWN_SECRET, register_secret

    plan = _plan(arguments.fault_plan, arguments.toxic)
    if arguments.verdict_file is not None and not arguments.verdict_file.parent.is_dir():
        raise CommandError(f"--verdict-file {arguments.verdict_file}: no such directory")
    api_key = arguments.api_key or os.environ.get("GYM_FAILURES_API_KEY") or None
    if api_key and len(api_key) >= MIN_KNOWN_SECRET:
        register_secret(api_key)
    log_to_stderr()
    proxy = ChaosProxy(upstream=arguments.upstream, plan=plan, boundary=arguments.boundary, api_key=api_key)
    return serve_until_stopped(
        proxy.app(),
        arguments,
        what=f"the proxy in front of {proxy.forwarder.shown}",
        metrics_name="gym-failures-proxy",
        write_verdict=lambda path: write_verdict_file(proxy, path),
        on_shutdown=proxy.forwarder.close,
        own_headers=False,
    )


def _plan(path: Path | None, toxics: list[str]) -> Any:
    from pydantic import ValidationError

    from gym_failures.proxy import Toxic, load_proxy_plan
    from gym_failures.proxy._toxics import MAX_TOXICS

    if path is not None:
        require_file(path, f"--fault-plan {path}")
    try:
        plan = load_proxy_plan(path)
    except ValidationError as error:
        raise CommandError(f"--fault-plan {path}: not a valid plan: {first_problem(error)}") from None
    except (ValueError, OSError) as error:
        raise CommandError(f"--fault-plan {path}: not a valid plan ({error})") from None
    added = []
    for text in toxics:
        try:
            added.append(Toxic.model_validate(json.loads(text)))
        except ValidationError as error:
            raise CommandError(f"--toxic {text[:80]}: not a toxic: {first_problem(error)}") from None
        except ValueError:
            raise CommandError(f"--toxic {text[:80]}: not JSON") from None
    if len(plan.toxics) + len(added) > MAX_TOXICS:
        raise CommandError(
            f"more than {MAX_TOXICS} toxics (the plan's and --toxic's): the proxy holds at most that"
        )
    names = [t.name for t in [*plan.toxics, *added]]
    if len(set(names)) != len(names):
        raise CommandError('two toxics share a name: name them ("name": ...)')
    return plan.model_copy(update={"toxics": [*plan.toxics, *added]})
