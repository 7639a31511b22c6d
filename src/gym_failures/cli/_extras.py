"""The optional dependencies (extras) of the commands: which modules' absence is a missing extra,
and the one line that says so (`needs_extra`, `require_extra`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gym_failures.cli._exits import CommandError

__all__ = ["EXTRA_MODULES", "METRICS_MODULES", "needs_extra", "require_extra"]

EXTRA_MODULES = frozenset({"aiohttp", "duckdb", "rich", "starlette", "uvicorn", "yarl", "multidict", "yaml"})
"""The optional dependencies whose absence is a missing extra, not a bug."""

METRICS_MODULES = ("prometheus_client", "opentelemetry.sdk", "opentelemetry.exporter.prometheus")
"""What `--metrics-port` needs: the `prometheus` extra's modules (`require_extra`)."""


def needs_extra(what: str, extra: str, module: str) -> str:
    """The one line for a missing extra: `what` (`this command`, `--metrics-port`) needs `extra`
    (`cli`, or `aiohttp,cli` as pip spells several), `module` being the one not installed."""
    names = extra.split(",")
    words = (
        f"the {names[0]} extra" if len(names) == 1 else f"the {', '.join(names[:-1])} and {names[-1]} extras"
    )
    return f"{what} needs {words} ({module} is not installed): pip install 'gym-failures[{extra}]'"


def require_extra(what: str, extra: str, modules: Sequence[str]) -> None:
    """Refuse `what` (exit status 2, `needs_extra`'s line) when one of `modules` cannot be imported;
    the modules are found, not imported, so the check costs no start-up."""
    import importlib.util

    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            raise CommandError(needs_extra(what, extra, module))
