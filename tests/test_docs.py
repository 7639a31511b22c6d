"""The documentation site covers the code: a reference page for every public module, and a mapping
of every name the upstream NeMo Gym pages document to ours. (`make docs` builds the site with
`mkdocs build --strict`, which fails on a broken link or anchor.)"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "gym_failures"
DOCS = ROOT / "docs"


def _public_modules() -> list[str]:
    names = []
    for path in sorted(SOURCE.rglob("*.py")):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts):
            names.append(".".join(parts))
    return names


def _documented() -> set[str]:
    text = "\n".join(page.read_text(encoding="utf-8") for page in (DOCS / "api").glob("*.md"))
    return set(re.findall(r"^::: ([\w.]+)$", text, flags=re.MULTILINE))


@pytest.mark.parametrize("module", _public_modules())
def test_every_public_module_has_a_reference_page(module: str) -> None:
    assert module in _documented()


def test_every_reference_page_is_in_the_sites_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in (DOCS / "api").glob("*.md"):
        assert f"api/{page.name}" in config


def _upstream_names() -> set[str]:
    text = "\n".join(page.read_text(encoding="utf-8") for page in (DOCS / "spec").glob("*.md"))
    return set(re.findall(r"nemo_gym(?:\.[A-Za-z_]\w*)+", text))


def _mapping() -> dict[str, str]:
    text = (DOCS / "nemo_gym_names.md").read_text(encoding="utf-8")
    return dict(re.findall(r"^\| `(nemo_gym[\w.]*)` \| `(gym_failures[\w.]*)` \|", text, flags=re.MULTILINE))


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def test_the_mapping_lists_every_upstream_name() -> None:
    assert _upstream_names() - set(_mapping()) == set()


def test_every_mapped_name_exists_here() -> None:
    mapping = _mapping()
    assert len(mapping) >= 100
    assert [ours for ours in mapping.values() if not _resolves(ours)] == []
