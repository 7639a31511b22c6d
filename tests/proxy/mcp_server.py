"""A real MCP server for the proxy's MCP tests: the official SDK's `MCPServer` (FastMCP in mcp 1.x) with
five tools, `add(a, b)`, `echo(text)`, `fail(text)` (which raises: the SDK answers a tool error
result), `bump()` (adds one to the process's count and returns it) and `bumps()` (the count: how often
`bump` ran, so a test tells whether a call reached the server), over the streamable HTTP transport at
`/mcp`, on uvicorn.

Run with `python -m tests.proxy.mcp_server PORT [--json]` (or `--port PORT`); `--json` makes the server
answer each request with one `application/json` body instead of an SSE stream (the SDK's
`json_response=True`).
"""

from __future__ import annotations

import argparse

import uvicorn
from mcp.server.mcpserver import MCPServer

MCP_PATH = "/mcp"


def build_server() -> MCPServer:
    """The server and its tools."""
    server = MCPServer("gym-failures-test", log_level="CRITICAL")  # no tracebacks: rich renders them slowly

    @server.tool()
    def add(a: int, b: int) -> int:
        """The sum of `a` and `b`."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """`text`, unchanged."""
        return text

    @server.tool()
    def fail(text: str) -> str:
        """Raise with `text`: the SDK turns it into a tool error result."""
        raise ValueError(text)

    bumped = [0]

    @server.tool()
    def bump() -> int:
        """Add one to the count of `bump`'s runs; the new count."""
        bumped[0] += 1
        return bumped[0]

    @server.tool()
    def bumps() -> int:
        """How often `bump` ran in this server."""
        return bumped[0]

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.proxy.mcp_server")
    parser.add_argument(
        "port_arg", nargs="?", type=int, help="the port (as tests.processes.serve_module passes it)"
    )
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="answer application/json instead of SSE")
    args = parser.parse_args(argv)
    port = args.port if args.port is not None else args.port_arg
    if port is None:
        parser.error("a port is needed")
    app = build_server().streamable_http_app(streamable_http_path=MCP_PATH, json_response=args.json)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
