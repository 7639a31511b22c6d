"""A failure-aware chaos proxy for any HTTP server of the mesh: toxiproxy's toxics, HTTP and MCP
faults, and the model endpoint's journal and verdict, on one hop of your choosing.

Run it with ``gym-failures serve proxy --upstream http://127.0.0.1:8002 --port 9002`` (see
`gym_failures.cli`) in front of a resources server, a sandbox, a judge, an agent or a model, and point
the caller at the proxy. Every path but `/_gym/...` is forwarded, unchanged but for the faults:

- **HTTP faults** (`HTTP_FAULTS`): a status with `Retry-After`, a dropped connection, an SSE stream cut
  after N events or ended without its terminal event, a slow request, a slow first byte, a stalled
  body, a malformed JSON body, an oversized header. Forced per request with the model endpoint's
  header (``X-Gym-Fault: status; code=503; retry_after=2``), queued (`ChaosProxy.force`, `POST
  /_gym/faults`) or drawn by a plan's rates per route (`ProxyPlan`, `--fault-plan FILE`).
- **Toxiproxy's toxics** (`TOXICS`), with its names, attributes and JSON shape: `latency` (with
  `jitter`), `bandwidth`, `slow_close`, `timeout` (0: hang until removed), `reset_peer`, `slicer`,
  `limit_data`; `upstream` or `downstream`; a `toxicity`; per route. Added and removed at run time
  over HTTP (`/_gym/toxics`, in Toxiproxy's REST shape), or listed in the plan.
- **MCP faults** (`MCP_FAULTS`) on `tools/call` requests of MCP's streamable HTTP transport: a tool
  error result, a protocol error, a dropped session, a slow tool; the tool named in the journal.

Every injected fault is marked as `serve model` marks its own: `X-Gym-Fault-Injected` and
`X-Gym-Fault-Event` on the reply; a status fault is a failure report of the upstream's boundary whose
reason starts "[proxy] injected" (`INJECTED_TYPE`), so the caller's chain names the hop. Every
attempt is journaled as the model endpoint journals its own, and `ChaosProxy.verdict` is the same
`judge`: calls, not bodies; a call's outcome is its last attempt; seen is not handled.

Modules:

    _plan       the faults, the plan that draws them per route, the draws
    _toxics     Toxiproxy's toxics: their shape, attributes, bounds and the set in force
    _mcp        MCP tool calls: reading one, and the replies of the MCP faults
    _pipes      the body's stages: the faults that break a reply, and each toxic
    _exchange   one request's exchange: headers, body, the pipe, breaking the connection
    _forward    the upstream's side: the aiohttp session, the request held or sent, the reply relayed
    _failures   the failures the proxy answers with itself, injected or its own
    _app        `ChaosProxy`: its state and ASGI app, the journal of every exchange
    _control    the control routes under `/_gym/`

The pytest plugin's `proxy` fixture (`gym_failures.proxy.pytest_plugin`) wraps any server a test
starts. docs/proxy.md says what each fault and toxic does on the wire.

Its names are loaded on first use (`__getattr__`): pytest imports this package for its plugin in
every run of a project that installs gym-failures, and a project without the server's extra (aiohttp,
Starlette, uvicorn) must still run its tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gym_failures._lazy import lazy_names

if TYPE_CHECKING:
    from gym_failures.proxy._app import ChaosProxy
    from gym_failures.proxy._failures import INJECTED_TYPE, injected_failure
    from gym_failures.proxy._mcp import MCP_FAULTS, McpCall, read_mcp_call
    from gym_failures.proxy._plan import HTTP_FAULTS, PROXY_FAULTS, PlannedFault, ProxyPlan, load_proxy_plan
    from gym_failures.proxy._toxics import TOXICS, Toxic, ToxicSet

__all__ = [
    "HTTP_FAULTS",
    "INJECTED_TYPE",
    "MCP_FAULTS",
    "PROXY_FAULTS",
    "TOXICS",
    "ChaosProxy",
    "McpCall",
    "PlannedFault",
    "ProxyPlan",
    "Toxic",
    "ToxicSet",
    "injected_failure",
    "load_proxy_plan",
    "read_mcp_call",
]

# Each name's module: loaded on first use, so that importing the package (as pytest does for its
# plugin, `gym_failures.proxy.pytest_plugin`) needs none of the server's dependencies.
_HOMES = {
    "ChaosProxy": "_app",
    "HTTP_FAULTS": "_plan",
    "INJECTED_TYPE": "_failures",
    "MCP_FAULTS": "_mcp",
    "McpCall": "_mcp",
    "PROXY_FAULTS": "_plan",
    "PlannedFault": "_plan",
    "ProxyPlan": "_plan",
    "TOXICS": "_toxics",
    "Toxic": "_toxics",
    "ToxicSet": "_toxics",
    "injected_failure": "_failures",
    "load_proxy_plan": "_plan",
    "read_mcp_call": "_mcp",
}


__getattr__, __dir__ = lazy_names(globals(), _HOMES)
