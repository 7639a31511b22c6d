"""What a demo-sized collection records: `gym.rollout.completed_total` per saved attempt, the remote
failures on the caller's span, and the progress hook's counts, against a real agent server process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from gym_failures.collection import CollectionConfig, collect, read_rows
from gym_failures.failure_kinds import classify_failure
from gym_failures.telemetry import ROLLOUTS_COMPLETED, SPAN_REMOTE_EVENT, CollectionProgress
from tests.telemetry.conftest import Telemetry

# How each task fails at the agent (`tests.collection.agent_app`), 200 rollouts in all.
MODES = {"ok": 120, "retry_then_ok": 30, "terminal": 20, "always_fail": 10, "raise": 10, "garbage": 10}
MAX_ATTEMPTS = 3
ROOT = Path(__file__).resolve().parents[2]


def _labels(kind: str, stage: str | None, status: int | None, failure_type: str) -> tuple[str, str, str]:
    return (classify_failure(kind, stage, status).value, kind, failure_type)  # type: ignore[arg-type]


# The failure attributes each mode's failed attempts carry: the agent's episode failure (an
# `AgentFailure` in the report), the model failure it raised (status 503, rebuilt by the collector),
# or the collector's own protocol violation.
EXPECTED_FAILURES = {
    "retry_then_ok": _labels("agent_run_error", "agent", None, "AgentFailure"),
    "terminal": _labels("agent_run_error", "agent", None, "AgentFailure"),
    "always_fail": _labels("agent_run_error", "agent", None, "AgentFailure"),
    "raise": _labels("model_server_error", None, 503, "ModelFailure"),
    "garbage": _labels("environment_protocol_violation", None, None, "CollectionFailure"),
}
ATTEMPTS_FAILED = {"retry_then_ok": 1, "terminal": 1, "always_fail": 3, "raise": 3, "garbage": 3}


async def test_a_demo_sized_collection_counts_every_saved_attempt(
    telemetry: Telemetry, tmp_path: Path, agent_url: str
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    with tasks.open("w") as handle:
        for mode, count in MODES.items():
            for _ in range(count):
                handle.write(json.dumps({"mode": mode}) + "\n")
    config = CollectionConfig(
        input_path=tasks,
        output_path=tmp_path / "rollouts.jsonl",
        agent_url=agent_url,
        max_attempts=MAX_ATTEMPTS,
        concurrency=16,
        agent_name="test_agent",
    )
    seen: list[tuple[int, int]] = []
    last: list[CollectionProgress] = []

    def on_progress(progress: CollectionProgress) -> None:
        seen.append((progress.done, progress.attempts))
        last[:] = [progress]

    with telemetry.tracer.start_as_current_span("collect"):
        summary = await collect(config, on_progress)

    points = telemetry.points()[ROLLOUTS_COMPLETED]
    assert {point.attributes["nemo.gym.rollout.dispatch.name"] for point in points} == {"test_agent"}
    by_outcome: Counter[str] = Counter()
    failures: Counter[tuple[str, str, str]] = Counter()
    for point in points:
        attributes = point.attributes
        by_outcome[str(attributes["nemo.gym.rollout.outcome"])] += int(point.value)
        if attributes["nemo.gym.rollout.outcome"] == "failed":
            key = (
                str(attributes["nemo.gym.failure_class"]),
                str(attributes["nemo.gym.failure_kind"]),
                str(attributes["nemo.gym.failure_type"]),
            )
            failures[key] += int(point.value)
        else:
            assert set(attributes) == {
                "nemo.gym.rollout.outcome",
                "nemo.gym.rollout.dispatch.name",
                "nemo.gym.rollout.rerun",
            }

    success_rows = list(read_rows(config.output_path))
    failure_rows = list(read_rows(config.failures_path))
    assert by_outcome == {"scored": len(success_rows), "failed": len(failure_rows)}
    assert by_outcome["scored"] == MODES["ok"] + MODES["retry_then_ok"]
    expected: Counter[tuple[str, str, str]] = Counter()
    for mode, labels in EXPECTED_FAILURES.items():
        expected[labels] += MODES[mode] * ATTEMPTS_FAILED[mode]
    assert failures == expected

    # The progress hook: called after every saved row, ending at every rollout done.
    progress = last[0]
    assert (progress.done, progress.expected, progress.attempts) == (200, 200, summary.attempts)
    assert progress.succeeded == summary.succeeded
    assert sum(progress.failed.values()) == summary.failed_final
    assert progress.retried == len(failure_rows) - summary.failed_final
    # Once at the start, then once per row; and when the breaker opens or closes (issue 30: this
    # run's failures come in runs of one kind), which changes no count.
    assert len(set(seen)) == summary.attempts + 1
    assert seen == sorted(seen)

    # The collector rebuilt each model failure the agent replied with: its span names their ids.
    (span,) = [span for span in telemetry.spans() if span.name == "collect"]
    remote = {
        str((event.attributes or {})["nemo.gym.failure.event_id"])
        for event in span.events
        if event.name == SPAN_REMOTE_EVENT
    }
    raised = {
        str(row["_ng_failure_id"])
        for row in failure_rows
        if row["failure"]["failure_kind"] == "model_server_error"
    }
    assert len(raised) == MODES["raise"] * MAX_ATTEMPTS
    assert remote == raised


_FULL_DISK = """
import asyncio, json, resource, sys
from pathlib import Path
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from gym_failures.collection import CollectionConfig, collect

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
tasks, output, agent_url = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
config = CollectionConfig(input_path=tasks, output_path=output, agent_url=agent_url, concurrency=1)
# No file of this process may pass 4000 bytes: the materialized inputs (40 short rows) fit, the rows
# file fills up after a few rows, as a full disk would (Python ignores SIGXFSZ: the write fails, EFBIG).
resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))
try:
    asyncio.run(collect(config))
except OSError as error:
    print("ended:", type(error).__name__, file=sys.stderr)
counts = {}
for r in reader.get_metrics_data().resource_metrics:
    for s in r.scope_metrics:
        for m in s.metrics:
            if m.name != "gym.rollout.completed_total":
                continue
            for p in m.data.data_points:
                counts[dict(p.attributes)["nemo.gym.rollout.outcome"]] = p.value
print(json.dumps(counts))
"""


def test_an_attempt_whose_row_cannot_be_saved_is_omitted(tmp_path: Path, agent_url: str) -> None:
    """In its own process: the file size limit it sets, and its meter provider, are process-wide."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"mode": "ok"}\n' * 40)
    output = tmp_path / "rollouts.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tasks), str(output), agent_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "ended: OSError" in result.stderr
    saved = len(list(read_rows(output)))
    assert 0 < saved < 40
    assert json.loads(result.stdout) == {"scored": saved, "omitted": 1}
