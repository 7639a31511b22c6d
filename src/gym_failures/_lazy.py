"""A package's names loaded on first use: the module `__getattr__` and `__dir__` of a package whose
names live in its submodules (`gym_failures.model_endpoint`, `gym_failures.proxy`), so that importing
the package (as pytest does for a plugin beneath it) imports none of them, nor what they need."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    namespace: dict[str, Any], homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for the package whose globals are `namespace`: a name of `homes`
    is read from its submodule (`homes[name]`, relative to the package) on first use, then kept."""
    package = namespace["__name__"]

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *homes})

    return getattr_, dir_
