"""The API reference's names, values, fields and signatures exist here as documented.

The reference pages are read from `docs/spec/` (a copy kept in the repository) or, failing that, from
`../shared/spec/`. Each ```python block and each **`member`** line becomes one documented item of
`nemo_gym.core.<module>`, checked against `gym_failures.<module>`:

- every name exists (module names, class members, pydantic fields, dataclass fields, methods);
- a documented value is the actual value: literals exactly, names resolved in the module (or class),
  `Field(...)` / `field(...)` by default, default factory and constraints, `ConfigDict(...)` by key;
- a documented signature has the same parameter names, order, kinds and defaults.

Values the reference truncates (`frozenset({TRANSPORT_UNREACHABLE, ...`) or that describe state
rather than a value cannot be compared; they are listed in `UNCHECKABLE_VALUES`, so a value that
silently stops being checked fails a test.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import enum
import importlib
import inspect
import logging
import re
import types
from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

REPO = Path(__file__).resolve().parents[1]
SPEC_DIRS = (REPO / "docs" / "spec", REPO.parent / "shared" / "spec")
MODULES = ("failure_kinds", "failure_records", "failure_transport")
SPEC_PACKAGE = "nemo_gym.core."
PACKAGE = "gym_failures."

#: Documented values that cannot be compared, with the reason.
UNCHECKABLE_VALUES = {
    # The reference truncates these expressions ("...").
    "failure_kinds.FAILURE_KINDS",
    "failure_kinds.GATE_DERIVED_KINDS",
    "failure_kinds.MODEL_FAULT_KINDS",
    "failure_kinds.PROVIDER_FAILURE_KINDS",
    "failure_kinds.SERVER_FAULT_KINDS",
    "failure_kinds._DEFAULT_CLASSIFICATION",
}


# --- Reading the reference -------------------------------------------------------------------


def spec_page(module: str) -> Path | None:
    for directory in SPEC_DIRS:
        page = directory / f"{module}.md"
        if page.is_file():
            return page
    return None


@dataclass(frozen=True)
class Param:
    name: str
    default: str | None


@dataclass(frozen=True)
class Item:
    """One documented name: a class, function, method, module constant or class member."""

    module: str
    qualname: str
    form: Literal["class", "function", "data", "member"]
    value: str | None = None
    params: tuple[Param, ...] | None = None

    @property
    def id(self) -> str:
        return f"{self.module}.{self.qualname}"


def split_top(text: str, separator: str) -> list[str]:
    """`text` split on `separator` outside brackets and quotes."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    start = index = 0
    while index < len(text):
        char = text[index]
        if quote is not None:
            if char == "\\":
                index += 2
                continue
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(separator, index):
            parts.append(text[start:index])
            index += len(separator)
            start = index
            continue
        index += 1
    parts.append(text[start:])
    return parts


def _matching_paren(text: str, open_index: int) -> int:
    depth = 0
    for index in range(open_index, len(text)):
        if text[index] == "(":
            depth += 1
        elif text[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    raise ValueError(f"unbalanced parentheses in {text!r}")


def _params(text: str) -> tuple[Param, ...]:
    params = []
    for part in split_top(text, ","):
        if not part.strip():
            continue
        head, *default = split_top(part.strip(), " = ")
        params.append(Param(head.split(":", 1)[0].strip(), default[0].strip() if default else None))
    return tuple(params)


_PATH = re.compile(r"(?:class\s+)?nemo_gym\.core\.(?P<module>\w+)\.(?P<qualname>[\w.]+)")
_MEMBER = re.compile(r"\*\*`(?P<name>\w+)`\*\*(?:\s+`(?P<text>.*)`)?\s*")


def _block_item(block: str) -> Item | None:
    match = _PATH.match(block)
    if match is None:
        return None
    module, qualname = match["module"], match["qualname"]
    rest = block[match.end() :]
    if block.startswith("class"):
        params = None
        if rest.startswith("(") and rest[1 : _matching_paren(rest, 0)].strip():
            params = _params(rest[1 : _matching_paren(rest, 0)])
        return Item(module, qualname, "class", params=params)
    if rest.startswith("("):
        return Item(module, qualname, "function", params=_params(rest[1 : _matching_paren(rest, 0)]))
    if rest.startswith(":") or rest.startswith(" ="):
        value = split_top(rest, " = ")
        return Item(module, qualname, "data", value=value[1].strip() if len(value) > 1 else None)
    return None


def _member_item(module: str, owner: str, text: str | None, name: str) -> Item:
    value: str | None = None
    if text is not None:
        if text.startswith("= "):
            value = text[2:].strip()
        else:
            parts = split_top(text, " = ")
            value = parts[1].strip() if len(parts) > 1 else None
    return Item(module, f"{owner}.{name}", "member", value=value)


@dataclass(frozen=True)
class Page:
    items: tuple[Item, ...]
    listed: frozenset[str]
    unread_blocks: tuple[str, ...]
    unread_members: tuple[str, ...]


def read_page(module: str, text: str) -> Page:
    items: list[Item] = []
    unread_blocks: list[str] = []
    unread_members: list[str] = []
    owner: str | None = None
    for match in re.finditer(r"```python\n(.*?)\n```|^(\*\*`[^\n]*)$", text, re.S | re.M):
        block, member = match.group(1), match.group(2)
        if block is not None:
            item = _block_item(block.strip())
            if item is None or item.module != module:
                unread_blocks.append(block)
                continue
            items.append(item)
            if item.form == "class":
                owner = item.qualname
        else:
            member_match = _MEMBER.fullmatch(member)
            if member_match is None or owner is None:
                unread_members.append(member)
                continue
            items.append(_member_item(module, owner, member_match["text"], member_match["name"]))
    listed = frozenset(re.findall(rf"\(#nemo_gym-core-{module}-(\w+)\)", text))
    return Page(tuple(items), listed, tuple(unread_blocks), tuple(unread_members))


def _pages() -> dict[str, Page | None]:
    pages: dict[str, Page | None] = {}
    for module in MODULES:
        path = spec_page(module)
        pages[module] = None if path is None else read_page(module, path.read_text(encoding="utf-8"))
    return pages


PAGES = _pages()


def _missing(module: str) -> Any:
    reason = f"spec page {module}.md is in neither {' nor '.join(str(d) for d in SPEC_DIRS)}"
    return pytest.param(None, id=f"{module}-missing", marks=pytest.mark.skip(reason=reason))


def _params_for(select: Callable[[Page], Iterable[tuple[Any, str]]]) -> list[Any]:
    params: list[Any] = []
    for module, page in PAGES.items():
        if page is None:
            params.append(_missing(module))
            continue
        for value, id_ in select(page):
            params.append(pytest.param(value, id=id_))
    return params


def _page_params() -> list[Any]:
    return [
        _missing(module) if page is None else pytest.param(page, id=module) for module, page in PAGES.items()
    ]


# --- Resolving the implementation ------------------------------------------------------------


_ABSENT = object()


def module_of(item: Item | str) -> types.ModuleType:
    return importlib.import_module(PACKAGE + (item if isinstance(item, str) else item.module))


def resolve(item: Item) -> Any:
    """The implementation's object for `item`; fails the test when it does not exist."""
    module = module_of(item)
    *owners, name = item.qualname.split(".")
    if not owners:
        assert hasattr(module, name), f"{module.__name__} has no {name}"
        return getattr(module, name)
    cls = getattr(module, owners[0])
    for owner in owners[1:]:
        cls = getattr(cls, owner)
    if isinstance(cls, type) and issubclass(cls, BaseModel) and name in cls.model_fields:
        return cls.model_fields[name]
    if dataclasses.is_dataclass(cls):
        for field in dataclasses.fields(cls):
            if field.name == name:
                return field
    static = inspect.getattr_static(cls, name, _ABSENT)
    if static is not _ABSENT and not isinstance(static, (types.MemberDescriptorType, property)):
        return getattr(cls, name)
    # An attribute set by __init__ (the reference documents it beside the class attributes).
    instance = cls()
    assert hasattr(instance, name), f"{cls.__name__} has no {name}"
    return getattr(instance, name)


def namespace(item: Item) -> Mapping[str, Any]:
    module = module_of(item)
    scopes: list[dict[str, Any]] = [vars(module), vars(builtins)]
    owner = item.qualname.rsplit(".", 1)[0] if "." in item.qualname else None
    if owner is not None:
        cls = getattr(module, owner.split(".")[0])
        scopes.insert(0, dict(vars(cls)))
    return ChainMap(*scopes)


def evaluate(node: ast.expr, names: Mapping[str, Any]) -> Any:
    """A documented expression's value: literals, names, attributes, `|`, `+` and `Literal[...]`."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        assert node.id in names, f"the documented value names {node.id}, which does not exist"
        return names[node.id]
    if isinstance(node, ast.Attribute):
        return getattr(evaluate(node.value, names), node.attr)
    if isinstance(node, ast.Tuple):
        return tuple(evaluate(element, names) for element in node.elts)
    if isinstance(node, ast.List):
        return [evaluate(element, names) for element in node.elts]
    if isinstance(node, ast.Set):
        return {evaluate(element, names) for element in node.elts}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return evaluate(node.left, names) | evaluate(node.right, names)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return evaluate(node.left, names) + evaluate(node.right, names)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.LShift):
        return evaluate(node.left, names) << evaluate(node.right, names)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
        return Literal[evaluate(node.slice, names)]
    if isinstance(node, ast.Call) and not node.keywords and _plain_call(node.func):
        return evaluate(node.func, names)(*(evaluate(arg, names) for arg in node.args))
    raise NotImplementedError(ast.dump(node))


def _plain_call(func: ast.expr) -> bool:
    """The calls a documented value may make: `len(...)` and `<str>.encode()`."""
    return (isinstance(func, ast.Name) and func.id == "len") or (
        isinstance(func, ast.Attribute) and func.attr == "encode"
    )


# --- Comparing documented values -------------------------------------------------------------


_SPECIAL_CALLS = {"Field", "field", "ConfigDict", "ContextVar", "re.compile", "logging.getLogger"}


def _call_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        return ast.unparse(node.func)
    return None


def _evaluable(node: ast.expr) -> bool:
    try:
        evaluate(node, _AnyNames())
    except NotImplementedError:
        return False
    return True


class _AnyNames(dict[str, Any]):
    """A namespace in which every name exists, to tell evaluable shapes from others."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> Any:
        return _Anything()


class _Anything:
    def __getattr__(self, name: str) -> _Anything:
        return self

    def __or__(self, other: object) -> _Anything:
        return self

    def __add__(self, other: object) -> _Anything:
        return self

    def __lshift__(self, other: object) -> _Anything:
        return self

    def __call__(self, *args: object) -> _Anything:
        return self


def checkable(value: str) -> bool:
    try:
        node = ast.parse(value, mode="eval").body
    except SyntaxError:
        return False
    if _call_name(node) in _SPECIAL_CALLS:
        return True
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        return True  # `set()`, `FailureReport()`: a new value of that type
    return _evaluable(node)


def _kwargs(call: ast.Call, names: Mapping[str, Any]) -> dict[str, Any]:
    return {keyword.arg: evaluate(keyword.value, names) for keyword in call.keywords if keyword.arg}


def check_field(field: FieldInfo | dataclasses.Field[Any], call: ast.Call, names: Mapping[str, Any]) -> None:
    """A documented `Field(...)` / `field(...)`: default, default factory and constraints."""
    kwargs = _kwargs(call, names)
    default = kwargs.pop("default", _ABSENT)
    factory = kwargs.pop("default_factory", _ABSENT)
    actual_factory = field.default_factory
    actual_default = field.default
    if isinstance(field, FieldInfo):
        if default is _ABSENT and factory is _ABSENT:
            assert field.is_required(), "documented without a default, but has one"
        for key, expected in kwargs.items():
            found = [getattr(meta, key) for meta in field.metadata if hasattr(meta, key)]
            assert found == [expected], f"{key}: documented {expected!r}, found {found!r}"
    if default is not _ABSENT:
        assert actual_default == default
    if factory is not _ABSENT:
        assert callable(actual_factory), "documented with a default factory, but has none"
        assert actual_factory() == factory()  # type: ignore[call-arg]


def check_value(item: Item, actual: Any, value: str) -> None:
    names = namespace(item)
    node = ast.parse(value, mode="eval").body
    call = _call_name(node)
    if isinstance(node, ast.Call) and call in ("Field", "field"):
        assert isinstance(actual, (FieldInfo, dataclasses.Field)), f"{item.id} is no field"
        check_field(actual, node, names)
        return
    if isinstance(actual, FieldInfo):
        assert not actual.is_required(), f"{item.id} is documented with a default"
        actual = actual.default
    elif isinstance(actual, dataclasses.Field):
        actual = actual.default
    elif isinstance(actual, enum.Enum):
        actual = actual.value
    if isinstance(node, ast.Call) and call == "ConfigDict":
        for key, expected in _kwargs(node, names).items():
            assert actual.get(key) == expected, f"model_config[{key!r}]"
    elif isinstance(node, ast.Call) and call == "ContextVar":
        assert isinstance(actual, ContextVar)
        assert actual.name == evaluate(node.args[0], names)
    elif isinstance(node, ast.Call) and call == "re.compile":
        assert isinstance(actual, re.Pattern)
        assert actual.pattern == evaluate(node.args[0], names)
    elif isinstance(node, ast.Call) and call == "logging.getLogger":
        assert isinstance(actual, logging.Logger)
        assert actual.name == module_of(item).__name__
    elif isinstance(node, ast.Call) and not node.args and not node.keywords:
        made_by = evaluate(node.func, names)
        if isinstance(made_by, type):  # `set()`, `dict()`, `FailureReport()`: only the type is checkable
            assert isinstance(actual, made_by)
        else:  # a call of a documented value, such as `FailureHeader.STREAM_FIELD.encode()`
            assert actual == made_by()
    else:
        expected = evaluate(node, names)
        if get_args(expected) and not isinstance(expected, (tuple, list, set)):
            assert get_args(actual) == get_args(expected)  # Literal[...] and X | Y aliases
        else:
            assert actual == expected
            assert type(actual) is type(expected)


# --- Comparing signatures --------------------------------------------------------------------

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def actual_params(item: Item, obj: Any) -> list[inspect.Parameter]:
    params = list(inspect.signature(obj).parameters.values())
    # A method reached through its class still lists `self`; the reference leaves it out.
    if "." in item.qualname and params and params[0].name in ("self", "cls") and item.form == "function":
        params = params[1:]
    return params


def check_default(item: Item, param: inspect.Parameter, documented: str) -> None:
    try:
        expected = ast.literal_eval(documented)
    except (ValueError, SyntaxError):
        expected_call = ast.parse(documented, mode="eval").body
        default = param.default
        if isinstance(obj := resolve(item), type) and dataclasses.is_dataclass(obj):
            field = {f.name: f for f in dataclasses.fields(obj)}[param.name]
            default = field.default_factory() if callable(field.default_factory) else field.default
        assert default == evaluate_call(expected_call, namespace(item)), param.name
        return
    assert param.default == expected, f"{param.name}: documented {documented}, found {param.default!r}"
    assert type(param.default) is type(expected), param.name


def evaluate_call(node: ast.expr, names: Mapping[str, Any]) -> Any:
    """A documented default such as `FailureReport()` or `dict()`: a new value of that type."""
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        return evaluate(node.func, names)()
    return evaluate(node, names)


# --- The tests ---------------------------------------------------------------------------------


def _items(page: Page, *forms: str) -> Iterator[tuple[Item, str]]:
    for item in page.items:
        if item.form in forms:
            yield item, item.id


def _listed(page: Page) -> Iterator[tuple[Item, str]]:
    documented = {item.qualname for item in page.items}
    for name in sorted(page.listed - documented):
        module = next(item.module for item in page.items)
        yield Item(module, name, "data"), f"{module}.{name}"


def test_every_spec_page_is_read() -> None:
    """A missing page skips its checks, so its absence must fail here (the pages ship in docs/spec)."""
    assert [module for module, page in PAGES.items() if page is None] == []


@pytest.mark.parametrize("module", sorted(PAGES), ids=str)
def test_every_spec_module_imports(module: str) -> None:
    """A module that fails to import fails the suite here, not only in each of its checks."""
    module_of(module)


@pytest.mark.parametrize("page", _page_params())
def test_every_api_block_is_read(page: Page) -> None:
    """The parser understands every ```python block of the page, so no name goes unchecked."""
    assert page.unread_blocks == ()


@pytest.mark.parametrize("page", _page_params())
def test_every_member_line_is_read(page: Page) -> None:
    assert page.unread_members == ()


@pytest.mark.parametrize("page", _page_params())
def test_every_listed_name_has_an_api_entry(page: Page) -> None:
    """The tables and the Data list name what the API section documents, so both were read."""
    assert page.listed
    assert page.listed == {item.qualname for item in page.items if "." not in item.qualname}


def test_uncheckable_values_are_the_known_ones() -> None:
    uncheckable = {
        item.id
        for page in PAGES.values()
        if page is not None
        for item in page.items
        if item.value is not None and not checkable(item.value)
    }

    assert uncheckable == UNCHECKABLE_VALUES


@pytest.mark.parametrize(
    "item", _params_for(lambda page: (*_items(page, "class", "function", "data", "member"), *_listed(page)))
)
def test_documented_name_exists(item: Item) -> None:
    resolve(item)


@pytest.mark.parametrize(
    "item",
    _params_for(
        lambda page: (
            (item, id_)
            for item, id_ in _items(page, "data", "member")
            if item.value is not None and checkable(item.value)
        )
    ),
)
def test_documented_value(item: Item) -> None:
    assert item.value is not None
    check_value(item, resolve(item), item.value)


@pytest.mark.parametrize(
    "item",
    _params_for(lambda page: ((item, id_) for item, id_ in _items(page, "function", "class") if item.params)),
)
def test_documented_signature(item: Item) -> None:
    assert item.params is not None
    obj = resolve(item)
    params = actual_params(item, obj)

    assert [p.name for p in params] == [p.name for p in item.params]
    for documented, param in zip(item.params, params, strict=True):
        if documented.default == "()" and param.kind is inspect.Parameter.VAR_POSITIONAL:
            # The reference renders `*reports: FailureReport` as `reports: FailureReport = ()`:
            # a default of `()` for a parameter typed as one report only makes sense as varargs.
            continue
        assert param.kind in _POSITIONAL, f"{param.name} is {param.kind.description}, documented positional"
        if documented.default is None:
            assert param.default is inspect.Parameter.empty, f"{param.name} has an undocumented default"
        else:
            assert param.default is not inspect.Parameter.empty, f"{param.name} lacks its default"
            check_default(item, param, documented.default)
