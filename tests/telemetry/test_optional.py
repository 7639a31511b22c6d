"""The instrumentation is optional: the core never imports OpenTelemetry, and without it, switched off,
or beside an application's own meter provider, nothing breaks. Each case runs in its own process,
since OpenTelemetry's global providers and an import once made cannot be undone in this one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A failure through the real middleware and a rollout count, in process.
_EXERCISE = """
import asyncio, httpx
from starlette.applications import Starlette
from starlette.routing import Route
from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failures import AgentFailure
from gym_failures.telemetry import RolloutOutcome, record_rollout

async def fail(request):
    raise AgentFailure(failure_kind="agent_run_error", failure_reason="x")

async def main():
    app = Starlette(routes=[Route("/", fail)])
    app.add_middleware(FailureReportMiddleware, boundary="agent")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.get("/")).status_code == 500
    record_rollout(RolloutOutcome("scored", True), "agent")

asyncio.run(main())
"""

_SDK = """
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
"""


def _run(code: str, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | environment
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_the_core_and_its_integrations_never_import_opentelemetry() -> None:
    result = _run(
        """
        import sys
        import gym_failures, gym_failures.asgi, gym_failures.client, gym_failures.collection
        import gym_failures.telemetry, gym_failures.cli
        optional = ("opentelemetry", "prometheus_client")
        loaded = sorted(name for name in sys.modules if name.split(".")[0] in optional)
        assert loaded == [], loaded
        """
    )
    assert result.returncode == 0, result.stderr


def test_without_opentelemetry_every_record_is_a_no_op() -> None:
    # None in sys.modules makes `import opentelemetry` raise ImportError, as when it is not installed.
    code = "import sys\nsys.modules['opentelemetry'] = None\n" + _EXERCISE
    code += """
from gym_failures.telemetry import MetricsUnavailable, serve_metrics
try:
    serve_metrics(0)
except MetricsUnavailable as error:
    assert "gym-failures[prometheus]" in str(error)
else:
    raise AssertionError("served without opentelemetry")
"""
    result = _run(code)
    assert result.returncode == 0, result.stderr


def test_the_instrumentation_can_be_switched_off_the_opentelemetry_way() -> None:
    code = _SDK + _EXERCISE + "\nassert reader.get_metrics_data() is None or not any(\n"
    code += "    m.data.data_points for r in reader.get_metrics_data().resource_metrics\n"
    code += "    for s in r.scope_metrics for m in s.metrics)\n"
    result = _run(code, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="aiohttp, gym_failures")
    assert result.returncode == 0, result.stderr


def test_a_provider_set_after_import_is_used_without_a_setup_call() -> None:
    code = "import gym_failures.asgi\n" + _SDK + _EXERCISE + "\n"
    code += "names = {m.name for r in reader.get_metrics_data().resource_metrics for s in r.scope_metrics\n"
    code += "         for m in s.metrics}\n"
    code += "assert names == {'gym.server.failures', 'gym.server.failure_report.size',\n"
    code += "                 'gym.rollout.completed_total'}, names\n"
    result = _run(code)
    assert result.returncode == 0, result.stderr


def test_serve_metrics_refuses_beside_the_applications_own_provider() -> None:
    code = (
        _SDK
        + """
from gym_failures.telemetry import MetricsUnavailable, serve_metrics
try:
    serve_metrics(0)
except MetricsUnavailable as error:
    assert "PrometheusMetricReader" in str(error)
else:
    raise AssertionError("served a registry without the application's metrics")
"""
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr


def test_an_api_that_refuses_the_instruments_turns_recording_off_instead_of_raising() -> None:
    """As an `opentelemetry-api` older than the extras ask for does (1.27 - 1.29 have no
    `explicit_bucket_boundaries_advisory`): the failure reply is still sent, the rollout counted as
    far as the caller knows, and nothing raises, at the first record or any later one."""
    refusing = """
from opentelemetry.metrics import _internal as api_metrics

def refuse(self, *args, **kwargs):
    raise TypeError("create_histogram() got an unexpected keyword argument")

api_metrics._ProxyMeter.create_histogram = refuse
"""
    code = refusing + _EXERCISE + "asyncio.run(main())  # and a second time\n"
    code += "from gym_failures.telemetry import _record\nassert _record._instruments is None\n"
    result = _run(code)
    assert result.returncode == 0, result.stderr
