"""One OpenTelemetry SDK meter and tracer provider for the test process, with in-memory readers.

OpenTelemetry's global providers can be set once per process, so they are set once per session and
every test reads what happened since it started (`Telemetry.reset`): the metric reader collects with
delta temporality, so each collection holds only what was recorded since the one before (an
observable counter's unchanged series come as zeros, and are left out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, ObservableCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@dataclass(frozen=True)
class Point:
    """One data point: its attributes and its value (a counter's sum, a histogram's count and sum)."""

    attributes: dict[str, Any]
    value: float
    total: float = 0.0


@dataclass
class Telemetry:
    reader: InMemoryMetricReader
    exporter: InMemorySpanExporter
    tracer: trace.Tracer

    def reset(self) -> None:
        self.reader.get_metrics_data()
        self.exporter.clear()

    def points(self) -> dict[str, list[Point]]:
        """Every data point recorded since the last call (or `reset`), by instrument name."""
        found: dict[str, list[Point]] = {}
        data = self.reader.get_metrics_data()
        if data is None:
            return found
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for point in metric.data.data_points:
                        attributes = dict(point.attributes or {})
                        if isinstance(point, HistogramDataPoint):
                            value = Point(attributes, point.count, point.sum)
                        elif isinstance(point, NumberDataPoint):
                            if point.value == 0:  # an observable counter's series that did not move
                                continue
                            value = Point(attributes, point.value)
                        else:
                            raise TypeError(f"no such instrument here: {metric.name}")
                        found.setdefault(metric.name, []).append(value)
        return found

    def spans(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.exporter.get_finished_spans())


@pytest.fixture(scope="session")
def _providers() -> Telemetry:
    delta = AggregationTemporality.DELTA
    reader = InMemoryMetricReader(
        preferred_temporality={Counter: delta, ObservableCounter: delta, Histogram: delta}
    )
    meter_provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tracer_provider)
    # Set once per process: any earlier provider would make every figure here wrong.
    assert metrics.get_meter_provider() is meter_provider
    assert trace.get_tracer_provider() is tracer_provider
    return Telemetry(reader, exporter, trace.get_tracer("tests"))


@pytest.fixture
def telemetry(_providers: Telemetry) -> Telemetry:
    """The session's providers, holding only what this test records."""
    _providers.reset()
    return _providers
