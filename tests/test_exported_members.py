"""Every module with an `__all__` exports exactly its public surface, sorted (as httpx's test does)."""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType

import pytest

MODULES = [
    "gym_failures",
    "gym_failures.asgi",
    "gym_failures.cli",
    "gym_failures.client",
    "gym_failures.collection",
    "gym_failures.failure_kinds",
    "gym_failures.failure_transport",
    "gym_failures.failures",
    "gym_failures.gate",
    "gym_failures.nemo_gym",
    "gym_failures.nemo_gym_server",
    "gym_failures.ray",
    "gym_failures.model_endpoint",
    "gym_failures.redaction",
    "gym_failures.reply",
    "gym_failures.reporting.explain",
    "gym_failures.reporting.html",
    "gym_failures.reporting.summary",
    "gym_failures.rollout_failure",
    "gym_failures.rows",
    "gym_failures.wire_contract",
    "gym_failures.telemetry",
]


def _defined_here(module: ModuleType) -> set[str]:
    """Public classes and functions whose home is `module` itself."""
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if (inspect.isclass(value) or inspect.isfunction(value)) and value.__module__ == module.__name__:
            names.add(name)
    return names


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    missing = [member for member in module.__all__ if not hasattr(module, member)]
    assert missing == []


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_unique(name: str) -> None:
    exported = list(importlib.import_module(name).__all__)
    assert exported == sorted(set(exported), key=lambda member: (not member.isupper(), member))


@pytest.mark.parametrize("name", MODULES)
def test_every_public_definition_is_exported(name: str) -> None:
    module = importlib.import_module(name)
    assert _defined_here(module) - set(module.__all__) == set()
