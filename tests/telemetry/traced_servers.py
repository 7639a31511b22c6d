"""The multi-hop model and agent servers (`tests.multihop.servers`) with OpenTelemetry's SDK installed,
each as its own uvicorn process, telling a test what they recorded.

    python -m tests.telemetry.traced_servers model --port 8001
    python -m tests.telemetry.traced_servers agent --port 8002 --model-url http://127.0.0.1:8001

Each process sets a global meter provider with an in-memory reader (delta temporality) and a tracer
provider with an in-memory span exporter, and serves every request inside a server span, as
OpenTelemetry's ASGI instrumentation does (that package is not a dependency; the span is all it adds
here). `GET /_test/telemetry` answers, as JSON, the data points recorded and the spans finished since
the last such call.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import uvicorn
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, ObservableCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.multihop.servers import agent_app, model_app

_DELTA = AggregationTemporality.DELTA


class Traced:
    """Runs each HTTP request of `app` inside a server span, and answers `/_test/telemetry`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.reader = InMemoryMetricReader(
            preferred_temporality={Counter: _DELTA, ObservableCounter: _DELTA, Histogram: _DELTA}
        )
        metrics.set_meter_provider(MeterProvider(metric_readers=[self.reader]))
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        trace.set_tracer_provider(provider)
        self.tracer = trace.get_tracer("tests.telemetry.traced_servers")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] == "/healthz"
            or scope["path"].startswith("/_test/origin")
        ):
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/_test/telemetry":
            body = json.dumps(self._recorded()).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        with self.tracer.start_as_current_span(
            f"{scope['method']} {scope['path']}", kind=trace.SpanKind.SERVER
        ):
            await self.app(scope, receive, send)

    def _recorded(self) -> dict[str, Any]:
        points: dict[str, list[dict[str, Any]]] = {}
        data = self.reader.get_metrics_data()
        for resource_metrics in data.resource_metrics if data is not None else ():
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for point in metric.data.data_points:
                        item: dict[str, Any] = {"attributes": dict(point.attributes or {})}
                        if isinstance(point, HistogramDataPoint):
                            item |= {"count": point.count, "sum": point.sum}
                        elif isinstance(point, NumberDataPoint):
                            if point.value == 0:  # an observable counter's series that did not move
                                continue
                            item["value"] = point.value
                        points.setdefault(metric.name, []).append(item)
        spans = [
            {
                "name": span.name,
                "status": span.status.status_code.name,
                "attributes": dict(span.attributes or {}),
                "events": [
                    {"name": event.name, "attributes": dict(event.attributes or {})} for event in span.events
                ],
            }
            for span in self.exporter.get_finished_spans()
        ]
        self.exporter.clear()
        return {"metrics": points, "spans": spans}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.telemetry.traced_servers")
    parser.add_argument("server", choices=("model", "agent"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-url")
    args = parser.parse_args(argv)
    app = model_app() if args.server == "model" else agent_app(args.model_url)
    uvicorn.run(Traced(app), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
