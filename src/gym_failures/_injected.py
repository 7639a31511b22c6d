"""How a failure record says it was injected on purpose (a test's fault), not met for real.

Two marks, both in fields every record has, so a row saved anywhere carries them:

- a failure a fault injector answered with itself (the proxy's `status` fault) has the
  `exception_type` `INJECTED_TYPE`, and its reason starts "[proxy] injected";
- a failure a client met on a reply whose server announced an injected fault
  (`X-Gym-Fault-Injected: <name>`, as `serve model` and `serve proxy` mark every such reply: a cut, a
  drop, a body that is not JSON) ends its reason with `injected_note(name)`, "(an injected fault:
  <name>)".

`is_injected` reads both; `summarize` counts the failure rows whose root is one
(`injected_failure_rows`) and `explain` marks such a link of a chain.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "INJECTED_HEADER",
    "INJECTED_NOTE_PREFIX",
    "INJECTED_TYPE",
    "injected_name",
    "injected_note",
    "is_injected",
]

INJECTED_TYPE = "gym_failures.proxy.InjectedFault"
"""The `exception_type` of every failure a fault injector answers with itself."""
INJECTED_HEADER = "x-gym-fault-injected"
INJECTED_NOTE_PREFIX = " (an injected fault: "
_PROXY_PREFIX = "[proxy] injected"


def injected_name(headers: Any) -> str | None:
    """The injected fault a reply's headers announce, when it is a short printable name."""
    value = headers.get(INJECTED_HEADER) if hasattr(headers, "get") else None
    if isinstance(value, str) and 0 < len(value) <= 64 and value.isascii() and value.isprintable():
        return value
    return None


def injected_note(name: str | None) -> str:
    """The suffix a reason gets when its reply announced the injected fault `name` ("" for none)."""
    return "" if name is None else f"{INJECTED_NOTE_PREFIX}{name})"


def is_injected(exception_type: object, failure_reason: object) -> bool:
    """Whether a record with this `exception_type` and `failure_reason` was injected on purpose."""
    if exception_type == INJECTED_TYPE:
        return True
    if not isinstance(failure_reason, str):
        return False
    return failure_reason.startswith(_PROXY_PREFIX) or (
        INJECTED_NOTE_PREFIX in failure_reason and failure_reason.endswith(")")
    )
