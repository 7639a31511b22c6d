"""The package's layout rules, checked over the source: what a newcomer relies on when reading it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "gym_failures"
MODULES = sorted(SOURCE.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# A module split out of another for its import time only, which is that module's own code: it may
# read its home's private tables. Each entry says why.
COMPANIONS = {
    # failure_kinds' pydantic models, loaded on first use so that classifying with the defaults
    # defines no pydantic model (the gate's start-up, docs/benchmarks.md).
    "gym_failures._classification_config": "gym_failures.failure_kinds",
}


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(SOURCE)))
def test_no_private_name_is_imported_from_another_module(path: Path) -> None:
    """A private name (`_x`) stays in its module; what other modules need is public, even when its
    module is private (`gym_failures.redaction.redact`)."""
    own = _module_name(path)
    # A companion and its home may import each other's private names, and the home its companion.
    related = {own, COMPANIONS.get(own)} | {module for module, home in COMPANIONS.items() if home == own}
    crossing = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gym_failures")
        for alias in node.names
        if alias.name.startswith("_")
        and node.module not in related
        and f"{node.module}.{alias.name}" not in related
    ]
    assert crossing == []


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(SOURCE)))
def test_every_module_says_its_purpose_in_a_docstring(path: Path) -> None:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert docstring, f"{path.name} has no module docstring"


LONG_FUNCTION = 80


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(SOURCE)))
def test_a_function_over_80_lines_says_why(path: Path) -> None:
    """A function longer than 80 lines has a comment starting "Over 80 lines:" right above it (or
    above its decorators) saying why it is not split."""
    lines = path.read_text(encoding="utf-8").splitlines()
    unexplained = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        assert node.end_lineno is not None
        if node.end_lineno - node.lineno + 1 <= LONG_FUNCTION:
            continue
        first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)]) - 1
        above = first - 1
        while above >= 0 and lines[above].lstrip().startswith("#"):
            if lines[above].lstrip().startswith("# Over 80 lines:"):
                break
            above -= 1
        else:
            unexplained.append(node.name)
    assert unexplained == []
