"""A NeMo Gym exporter that keeps what NeMo Gym 0.7.0 exports, so the world can report it.

NeMo Gym reports a run's coverage (`coverage/expected`, `coverage/scored`, `coverage/missing`) and its
rollouts' outcomes as they happen (`progress/<agent>/failed`, `omitted`, `masked_pct`) only to its
exporters (nemo_gym/rollout_collection.py:2925, nemo_gym/rollout_collection.py:133). This one is
registered in NeMo Gym's own `EXPORTER_REGISTRY` and opened by its `setup_exporters`, as W&B and
MLflow are (nemo_gym/exporters/__init__.py:39), and keeps every export in memory.
"""

from __future__ import annotations

from typing import Any, ClassVar

from nemo_gym.config_types import ExporterConfig
from nemo_gym.exporters import EXPORTER_REGISTRY
from nemo_gym.exporters.base import BaseExporter
from omegaconf import DictConfig

NAME = "gf_world_memory"


class MemoryExporterConfig(ExporterConfig):
    @property
    def is_available(self) -> bool:
        return True


class MemoryExporter(BaseExporter):
    name: ClassVar[str] = NAME
    metrics: ClassVar[list[tuple[dict[str, Any], int | None]]] = []
    rollouts: ClassVar[list[int]] = []

    def setup(self) -> None:
        pass

    def teardown(self) -> None:
        pass

    def _log_config(self, config_dict: DictConfig) -> None:
        pass

    def _log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        MemoryExporter.metrics.append((dict(metrics), step))

    def _log_rollouts(self, rollouts: list[dict[str, Any]]) -> None:
        MemoryExporter.rollouts.append(len(rollouts))

    @classmethod
    def take(cls) -> dict[str, Any]:
        """What was exported since the last take: the last value of every metric, and the calls."""
        last: dict[str, Any] = {}
        for metrics, _ in cls.metrics:
            last.update(metrics)
        taken = {"metrics": last, "exports": len(cls.metrics), "rollout_uploads": list(cls.rollouts)}
        cls.metrics.clear()
        cls.rollouts.clear()
        return taken


def register() -> None:
    EXPORTER_REGISTRY[NAME] = (MemoryExporterConfig, f"{__name__}:MemoryExporter")
