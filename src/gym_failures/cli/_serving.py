"""Running a server of the command line until it is stopped: the socket bound first (a busy port is
one line), uvicorn on it, the verdict file written however it stops, `/metrics` beside it, and the
log lines on stderr. `serve model` and `serve proxy` run on it; `serve agent` binds and logs with it.

Decisions:
- `--verdict-file FILE` is written when the server stops, by Ctrl-C or SIGTERM: the verdict and the
  journal it read, so `gym-failures verdict FILE --client ROWS` can judge it again with the client's
  record.
- `--metrics-port` listens on `--host`, as the server does: a server bound to loopback must not
  expose its metrics to the network.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_failures.cli._exits import EXIT_OK, CommandError
from gym_failures.cli._text import stderr_line

if TYPE_CHECKING:
    import socket

__all__ = [
    "listen_socket",
    "log_to_stderr",
    "no_record_of_cancelled_requests",
    "serve_until_stopped",
    "write_verdict_file",
]


def serve_until_stopped(
    app: Any,
    arguments: argparse.Namespace,
    *,
    what: str,
    metrics_name: str,
    write_verdict: Callable[[Path], None],
    on_shutdown: Callable[[], Any] | None = None,
    own_headers: bool = True,
) -> int:
    """Serve `app` on `--host`/`--port` until Ctrl-C or SIGTERM, writing `--verdict-file` (with
    `write_verdict`) however it stops, and `/metrics` on `--metrics-port`; `on_shutdown` is awaited at
    the end of uvicorn's shutdown (the proxy closes its client there); without `own_headers`, uvicorn adds
    no `server` and `date` headers (the proxy passes its upstream's). `serve model` and `serve proxy`."""
    import uvicorn

    written: list[bool] = []

    def verdict_now() -> None:
        if arguments.verdict_file is not None and not written:
            written.append(True)
            write_verdict(arguments.verdict_file)

    class Server(uvicorn.Server):
        # Written at the end of uvicorn's shutdown: after it, uvicorn raises the signal that stopped
        # it again, and a SIGTERM's default action ends the process with no cleanup of ours.
        async def shutdown(self, sockets: Any = None) -> None:
            await super().shutdown(sockets=sockets)
            if on_shutdown is not None:
                await on_shutdown()
            verdict_now()

    if arguments.verdict_file is not None:
        _write_on_sigterm(verdict_now)
    # Bound only now: a caller that sees the port accept connections may stop the server at once, and
    # the verdict is written however early that comes.
    listening = listen_socket(arguments.host, arguments.port)
    with contextlib.ExitStack() as running:
        running.callback(listening.close)
        running.callback(verdict_now)
        if arguments.metrics_port is not None:
            # Only here: the metrics endpoint's module renders with rich, which `serve proxy`'s extra has not.
            from gym_failures.cli._live import metrics_endpoint

            running.enter_context(metrics_endpoint(arguments.metrics_port, metrics_name, host=arguments.host))
        # uvicorn serves the socket bound above, and logs no start line for a socket it is given.
        host, port = listening.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        stderr_line(f"gym-failures serve: {what} on http://{shown}:{port} (Ctrl-C stops it)")
        # Nothing to start or stop in a lifespan: a second Ctrl-C during shutdown has no lifespan task
        # to cancel (and no traceback of it to print).
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=own_headers,
            date_header=own_headers,
        )
        server = Server(config)
        running.enter_context(no_record_of_cancelled_requests())
        server.run(sockets=[listening])
    return EXIT_OK


@contextlib.contextmanager
def no_record_of_cancelled_requests() -> Iterator[None]:
    """A second Ctrl-C ends the requests still being served by cancelling them, and uvicorn logs each
    as an "Exception in ASGI application" with its traceback: a request cancelled at a forced exit is
    no error of the application's, so that record is not written while the server runs."""
    import logging

    cancelled = _CancelledRequests()
    logging.getLogger("uvicorn.error").addFilter(cancelled)
    try:
        yield
    finally:
        logging.getLogger("uvicorn.error").removeFilter(cancelled)


class _CancelledRequests:
    """A logging filter: drops uvicorn's record of a request that ended cancelled (a forced exit's),
    keeps every other record."""

    def filter(self, record: Any) -> bool:
        import asyncio

        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, asyncio.CancelledError)


def _write_on_sigterm(write_verdict: Callable[[], None]) -> None:
    """A SIGTERM before uvicorn takes the signal over (the socket is bound, and accepts connections,
    before uvicorn serves it), or the one uvicorn raises again after its shutdown, writes the verdict
    and then ends the process as it would have."""
    import signal

    def terminated(signum: int, frame: Any) -> None:
        write_verdict()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, terminated)


def write_verdict_file(endpoint: Any, path: Path) -> None:
    """Write `endpoint`'s verdict and the journal it read to `path` (a model endpoint's or a proxy's)."""
    import json

    from gym_failures.model_endpoint import verdict_document

    attempts = endpoint.journal.attempts()
    document = verdict_document(endpoint.verdict(), attempts, endpoint.journal.dropped)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    temporary.replace(path)
    stderr_line(f"gym-failures serve: the verdict in {path}")


def listen_socket(host: str, port: int) -> socket.socket:
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


def log_to_stderr() -> None:
    """One handler for the run's log lines (the command line's own warning handler would print every
    line twice)."""
    import logging

    library = logging.getLogger("gym_failures")
    for handler in list(library.handlers):
        library.removeHandler(handler)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    library.setLevel(logging.INFO)
