"""The report-size histogram's batches (`_Sizes`): every size reaches the SDK's histogram exactly once,
at the batch bound or at a collection, from any thread, and outside any trace (no exemplar).

Each test has an SDK meter provider of its own (not the session's global one), so what its reader
collects is what that test's `_Sizes` recorded.
"""

from __future__ import annotations

import threading

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from gym_failures.telemetry import _record
from gym_failures.telemetry._record import _SIZE_BATCH, _no_trace, _Sizes
from tests.telemetry.conftest import Telemetry


def _sizes() -> tuple[_Sizes, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    histogram = MeterProvider(metric_readers=[reader]).get_meter("test").create_histogram("size")
    return _Sizes(histogram, _no_trace()), reader


def _point(reader: InMemoryMetricReader) -> HistogramDataPoint | None:
    data = reader.get_metrics_data()
    if data is None:
        return None
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    ]
    if not points:
        return None
    (point,) = points
    assert isinstance(point, HistogramDataPoint)
    return point


def test_sizes_wait_below_the_batch_bound_and_are_recorded_at_it() -> None:
    sizes, reader = _sizes()
    for size in range(1, _SIZE_BATCH):
        sizes.add(size)
    assert _point(reader) is None  # one short of the bound: nothing recorded yet
    sizes.add(_SIZE_BATCH)
    point = _point(reader)
    assert point is not None
    assert point.count == _SIZE_BATCH
    assert point.sum == sum(range(1, _SIZE_BATCH + 1))


def test_a_flush_records_what_waits_and_nothing_twice() -> None:
    sizes, reader = _sizes()
    for size in (100, 200, 300):
        sizes.add(size)
    assert list(sizes.flush()) == []  # as an observable callback it observes nothing
    assert list(sizes.flush()) == []
    point = _point(reader)
    assert point is not None
    assert (point.count, point.sum, point.min, point.max) == (3, 600, 100, 300)


def test_sizes_added_from_many_threads_are_each_recorded_once() -> None:
    sizes, reader = _sizes()
    per_thread, threads = 5 * _SIZE_BATCH + 7, 4
    start = threading.Barrier(threads + 1)

    def add() -> None:
        start.wait()
        for _ in range(per_thread):
            sizes.add(1)

    def flush() -> None:
        start.wait()
        for _ in range(50):
            sizes.flush()

    workers = [threading.Thread(target=add) for _ in range(threads)] + [threading.Thread(target=flush)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    sizes.flush()
    point = _point(reader)
    assert point is not None
    assert point.count == point.sum == per_thread * threads


def test_a_size_recorded_in_a_span_carries_no_exemplar() -> None:
    """The default exemplar filter samples a measurement made in a sampled span (the control
    histogram shows it does here); a batch runs in whichever request fills it, so the sizes are
    recorded outside any trace (`_no_trace`, which `_load` gives them)."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    sizes, control = _Sizes(meter.create_histogram("size"), _no_trace()), meter.create_histogram("control")
    with TracerProvider().get_tracer("test").start_as_current_span("request"):
        sizes.add(512)
        sizes.flush()
        control.record(512)
    data = reader.get_metrics_data()
    assert data is not None
    exemplars = {
        metric.name: [exemplar for point in metric.data.data_points for exemplar in point.exemplars]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert len(exemplars["control"]) == 1
    assert exemplars["size"] == []


def test_the_global_instruments_flush_the_sizes_before_a_collection_reads_them(telemetry: Telemetry) -> None:
    """Through the session's global provider: a reader's collection runs the counters' callbacks,
    the first of which records the waiting sizes, before it reads the histogram."""
    loaded = _record._load()
    assert loaded is not None
    for _ in range(3):
        loaded.report_size.add(700)
    (point,) = telemetry.points()[_record.REPORT_SIZE]
    assert (point.value, point.total) == (3, 2100)
