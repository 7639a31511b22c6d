"""`/metrics` for Prometheus, through OpenTelemetry's Prometheus exporter (the `prometheus` extra).

`serve_metrics(port)` installs an SDK meter provider whose reader is the exporter's
`PrometheusMetricReader` as the global provider, and serves `prometheus_client`'s registry on
`host:port` from a daemon thread until `close()`. Only one global meter provider can be set per
process: when the application set its own, `serve_metrics` refuses (`MetricsUnavailable`) rather
than serve a registry that holds none of its metrics; such an application adds a
`PrometheusMetricReader` to its own provider. Called again in the same process, it reuses the
provider it installed and starts another server.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

__all__ = ["MetricsServer", "MetricsUnavailable", "serve_metrics"]

_installed: Any = None
"""The meter provider `serve_metrics` installed, if it did."""
_lock = threading.Lock()


class MetricsUnavailable(RuntimeError):
    """`/metrics` cannot be served: the `prometheus` extra is missing, or the application set its
    own meter provider."""


class MetricsServer:
    """A running `/metrics` endpoint; `close()` (or leaving a `with` block) stops it."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        port: int = self._server.server_port
        return port

    @property
    def url(self) -> str:
        host = str(self._server.server_address[0])
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _install_provider(service_name: str | None) -> None:
    global _installed
    from opentelemetry import metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    with _lock:
        current = metrics.get_meter_provider()
        if _installed is not None and current is _installed:
            return
        if isinstance(current, MeterProvider):
            raise MetricsUnavailable(
                "the application set its own OpenTelemetry meter provider; add "
                "opentelemetry.exporter.prometheus.PrometheusMetricReader() to its readers instead"
            )
        attributes = {} if service_name is None else {SERVICE_NAME: service_name}
        provider = MeterProvider(
            metric_readers=[PrometheusMetricReader()], resource=Resource.create(attributes)
        )
        metrics.set_meter_provider(provider)
        if metrics.get_meter_provider() is not provider:  # another thread or library set one first
            raise MetricsUnavailable("another OpenTelemetry meter provider was set first")
        _installed = provider


def serve_metrics(port: int, host: str = "0.0.0.0", *, service_name: str | None = None) -> MetricsServer:
    """Serve this process's OpenTelemetry metrics at `http://host:port/metrics` (port 0: any free
    port, see `.port`) until the returned server is closed. `service_name` sets the resource's
    `service.name` (else `OTEL_SERVICE_NAME`, as the SDK reads it)."""
    try:
        import prometheus_client
    except ImportError as error:
        raise MetricsUnavailable(f"/metrics needs gym-failures[prometheus] ({error})") from None
    try:
        _install_provider(service_name)
    except ImportError as error:
        raise MetricsUnavailable(f"/metrics needs gym-failures[prometheus] ({error})") from None
    server, thread = prometheus_client.start_http_server(port, addr=host)
    return MetricsServer(server, thread)
