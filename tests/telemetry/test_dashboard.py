"""The shipped Grafana dashboard queries only the series gym-failures exports, by their Prometheus names."""

from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "gym-failures.json"
# The Prometheus names of the instruments (see docs/telemetry.md) and of their labels.
SERIES = {
    "gym_rollout_completed_total",
    "gym_server_failures_total",
    "gym_server_failure_report_size_bytes_bucket",
    "gym_server_failure_report_size_bytes_count",
}
LABELS = {
    "le",
    "nemo_gym_rollout_outcome",
    "nemo_gym_rollout_dispatch_name",
    "nemo_gym_failure_class",
    "nemo_gym_failure_kind",
    "nemo_gym_boundary",
    "nemo_gym_stage",
}


def test_every_panel_queries_known_series_and_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(expressions) >= 6
    for expression in expressions:
        assert set(re.findall(r"\bgym_[a-z_]+", expression)) <= SERIES, expression
        assert set(re.findall(r"\b(?:nemo_gym_[a-z_]+|le)\b", expression)) <= LABELS, expression
    names = {name for expression in expressions for name in re.findall(r"\bgym_[a-z_]+", expression)}
    assert {"gym_rollout_completed_total", "gym_server_failures_total"} <= names
