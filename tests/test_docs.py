"""The documentation site covers the code: a reference page for every public module, each listed in
the reference's index and summarized in plain text from the source (so the pages read in a clone),
and a mapping of every name the upstream NeMo Gym pages document to ours. (`make docs` builds the
site with `mkdocs build --strict`, which fails on a broken link or anchor.)"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

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


def _index() -> dict[str, str]:
    """The reference index's table: each module it lists, and the page it links it to."""
    text = (DOCS / "api" / "index.md").read_text(encoding="utf-8")
    return dict(re.findall(r"^\| \[`(gym_failures[\w.]*)`\]\((\w+\.md)\) \|", text, flags=re.MULTILINE))


def test_the_reference_index_lists_every_public_module_and_only_real_ones() -> None:
    assert sorted(_index()) == sorted(_public_modules())


def test_the_reference_index_links_each_module_to_its_page() -> None:
    pages = {page.name: page.read_text(encoding="utf-8") for page in (DOCS / "api").glob("*.md")}
    misplaced = {
        module: page
        for module, page in _index().items()
        if not re.search(rf"^::: {re.escape(module)}$", pages.get(page, ""), flags=re.MULTILINE)
    }
    assert misplaced == {}


def _summaries() -> ModuleType:
    """`docs/api/_summaries.py`, the generator of the pages' summaries (a script: loaded by its path)."""
    spec = importlib.util.spec_from_file_location("_summaries", DOCS / "api" / "_summaries.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_pages_summaries_are_up_to_date_with_the_source() -> None:
    """Every `:::` directive of `docs/api/` has above it the summary the source gives today (the
    module docstring's first paragraph, its public names with their kinds and first sentences)."""
    summaries = _summaries()
    assert (ROOT / summaries.COMMAND.split()[-1]).is_file()
    stale = sorted(str(path.relative_to(ROOT)) for path in summaries.stale())
    assert stale == [], f"out of date with the source: run `{summaries.COMMAND}` from the repository's root"


def test_a_summary_is_markdown_that_reads_as_written() -> None:
    summaries = _summaries()
    assert summaries.first_sentence("Wait, e.g. a day. Then `x. Y` more.\n\nNext.") == "Wait, e.g. a day."
    assert summaries.first_sentence("A pipe (`a | b`)::\n\n    code") == "A pipe (`a | b`):"
    cell = summaries._markdown("a `x | y` or [b][c], <n> | `| head`", in_table=True)
    assert cell == "a `x` \\| `y` or \\[b\\][c], &lt;n> \\| <code>&#124; head</code>"


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


def _homes() -> set[str]:
    """Every module and package directly under `gym_failures`, as the package docstring names them."""
    return {
        path.stem if path.is_file() else path.name
        for path in SOURCE.iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py") or (path / "__init__.py").is_file()
    }


def _mapped_in_the_package_docstring() -> set[str]:
    import ast

    docstring = ast.get_docstring(ast.parse((SOURCE / "__init__.py").read_text(encoding="utf-8")))
    assert docstring is not None
    return set(re.findall(r"^    (\w+)(?:\.py|/) ", docstring, flags=re.MULTILINE))


def _in_the_readme_table() -> set[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| ")]
    return set(re.findall(r"`gym_failures\.(\w+)`", "\n".join(table)))


def test_the_package_docstring_maps_every_module_and_package() -> None:
    assert _mapped_in_the_package_docstring() == _homes()


def test_the_readmes_table_names_every_public_home_and_only_real_ones() -> None:
    """ "Where things live" in the README names the public homes the package docstring maps: each
    public top-level module or package once at least, and nothing that is not there."""
    public = {home for home in _homes() if not home.startswith("_")}
    assert _in_the_readme_table() == public
