"""The package's layout rules, checked over the source: what a newcomer relies on when reading it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "gym_failures"
MODULES = sorted(SOURCE.rglob("*.py"))
PACKAGE = SOURCE.name


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {_module_name(path): path for path in MODULES}
PACKAGES = {_module_name(path) for path in MODULES if path.name == "__init__.py"}


def _tree(module: str) -> ast.Module:
    return ast.parse(NAMES[module].read_text(encoding="utf-8"))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of `tree` that can run, in functions too: the body of `if TYPE_CHECKING:` is left
    out (it never runs; an import there is for the type checker only), its `else:` is not."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _base_of(module: str, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, relative imports resolved against `module`."""
    if node.level == 0:
        return node.module or ""
    package = module if module in PACKAGES else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _known(name: str) -> str | None:
    """`name`, or the nearest enclosing module of the package, when it is one of ours."""
    while name and name not in NAMES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str) -> set[str]:
    """The package's modules `module` imports when it runs: at the top or inside a function, by
    `import`, `from ... import` (a submodule by its own name) or `importlib.import_module`.

    A call of `import_module` whose argument is not a literal is read as importing every module of
    the package that a string in `module` names, whole or after the call's literal prefix (the
    package's `import_module(f"gym_failures.{...}")` over its table of homes): an over-estimate,
    never a miss. Importing `a.b.c` also runs `a.b`'s `__init__`: it counts, except for a package
    `module` is itself inside (its own package's `__init__` is already running)."""
    tree = _tree(module)
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
    targets: set[str] = set()
    for node in _run_time_nodes(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base_of(module, node)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in NAMES else base)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            argument = node.args[0]
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                targets.add(argument.value)
            else:
                prefix = ""
                if isinstance(argument, ast.JoinedStr) and argument.values:
                    first = argument.values[0]
                    if isinstance(first, ast.Constant) and isinstance(first.value, str):
                        prefix = first.value
                targets.update(
                    name
                    for text in strings
                    if isinstance(text, str)
                    for name in (text, prefix + text)
                    if name in NAMES
                )
    imported: set[str] = set()
    for target in targets:
        known = _known(target)
        if known is None:
            continue
        imported.add(known)
        parent = known.rpartition(".")[0]
        while parent and not (module == parent or module.startswith(parent + ".")):
            imported.add(parent)
            parent = parent.rpartition(".")[0]
    imported.discard(module)
    return imported


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "import_module") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    """No module imports, even inside a function, a module that imports it back (directly or through
    others): a package's `__init__` may re-export its own submodules only when they never import that
    `__init__` back."""
    graph = {module: _imported(module) for module in NAMES}
    assert _cycles(graph) == set()


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, {frozenset({"a", "b"})}),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, {frozenset({"a", "b", "c"})}),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, set()),
    ],
)
def test_the_cycle_finder_finds_what_is_there(
    graph: dict[str, set[str]], expected: set[frozenset[str]]
) -> None:
    assert _cycles(graph) == expected


def test_the_import_reader_sees_imports_inside_functions_and_not_under_type_checking() -> None:
    """The reader sees what runs: `failure_kinds` loads its configuration models inside a function
    (`import_module`), and `_classification` names them under `TYPE_CHECKING` only."""
    assert f"{PACKAGE}._classification_config" in _imported(f"{PACKAGE}.failure_kinds")
    assert f"{PACKAGE}._classification_config" not in _imported(f"{PACKAGE}._classification")
    # The package's own lazy names, read through its table of homes.
    assert f"{PACKAGE}.failures" in _imported(PACKAGE)


def test_a_submodule_import_runs_its_packages_init_except_from_inside_that_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside, inside = tmp_path / "outside.py", tmp_path / "inside.py"
    outside.write_text(  # inside a function: it counts too
        "def f():\n    from gym_failures.client._libraries import library_of\n", encoding="utf-8"
    )
    inside.write_text("from gym_failures.client._libraries import library_of\n", encoding="utf-8")
    monkeypatch.setitem(NAMES, f"{PACKAGE}._outside", outside)
    monkeypatch.setitem(NAMES, f"{PACKAGE}.client._inside", inside)
    libraries, client = f"{PACKAGE}.client._libraries", f"{PACKAGE}.client"
    assert _imported(f"{PACKAGE}._outside") == {libraries, client}
    assert _imported(f"{PACKAGE}.client._inside") == {libraries}


def _crossings(module: str) -> list[str]:
    """The private names (`_x`, not `__x__`) `module` takes from another of the package's modules:
    imported by name, or read as an attribute of an imported module."""
    tree = _tree(module)
    crossing: list[str] = []
    bound: dict[str, str] = {}  # a local name -> the module of ours it is
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _base_of(module, node)
            if _known(base) is None:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in NAMES:
                    bound[alias.asname or alias.name] = submodule
                elif _is_private(alias.name) and base != module:
                    crossing.append(f"{base}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _known(alias.name) is not None:
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.partition(".")[0]] = alias.name.partition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = _dotted(node.value, bound)
            if owner is not None and owner in NAMES and owner != module:
                crossing.append(f"{owner}.{node.attr}")
    return crossing


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    """The module of ours `node` (a name or a chain of attributes) stands for, if it is one."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _dotted(node.value, bound)
        return None if owner is None else f"{owner}.{node.attr}"
    return None


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(SOURCE)))
def test_no_private_name_crosses_a_module(path: Path) -> None:
    """A private name (`_x`) stays in its module, imported by name or read off a module; what other
    modules need is public, even when its module is private (`gym_failures.redaction.redact`,
    `gym_failures._classification.DEFAULT_RULES`). A private module itself may be imported."""
    assert _crossings(_module_name(path)) == []


def test_the_crossing_check_sees_a_private_name_imported_or_read_off_a_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from gym_failures import failure_kinds\n"
        "from gym_failures.failures import _x, NgFailureEvent\n"
        "from gym_failures.client import _reply\n"  # a private module: allowed
        "failure_kinds._y, failure_kinds.__all__\n",
        encoding="utf-8",
    )
    monkeypatch.setitem(NAMES, f"{PACKAGE}._probe", probe)
    assert sorted(_crossings(f"{PACKAGE}._probe")) == [
        f"{PACKAGE}.failure_kinds._y",
        f"{PACKAGE}.failures._x",
    ]


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
