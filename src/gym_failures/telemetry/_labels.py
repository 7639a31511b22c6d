"""Bounded metric labels: what a failure's kind and exception type become as attribute values.

A metric label is a time series per distinct value, so nothing a peer can mint without end becomes
one. A registered kind is itself; a peer's kind this version does not know (`unregistered:<kind>`),
or any other name that is no event kind, is `unregistered`; an environment's own `<server>:<kind>`
is kept up to `MAX_NAMESPACED_KINDS` distinct values per process, then recorded as `other`.
Exception type names are kept the same way (`MAX_FAILURE_TYPES`); one that is no class name, or that
`redaction.redact` would change, is `other`. Reasons, ids and URLs are never labels.
"""

from __future__ import annotations

import re
import threading

from gym_failures.failure_kinds import UNREGISTERED_KIND_PREFIX, is_namespaced, is_registered
from gym_failures.redaction import redact

__all__ = [
    "MAX_FAILURE_TYPES",
    "MAX_NAMESPACED_KINDS",
    "OTHER",
    "UNREGISTERED",
    "BoundedValues",
    "failure_kind_label",
    "failure_type_label",
]

MAX_NAMESPACED_KINDS = 64
"""Distinct `<server>:<kind>` labels kept per process; later ones are recorded as `other`. An
environment declares a handful of its own kinds; 64 leaves room for several environments in one run."""
MAX_FAILURE_TYPES = 64
"""Distinct exception type names kept per process as `nemo.gym.failure_type`; later ones are `other`."""
UNREGISTERED = "unregistered"
OTHER = "other"

# A Python class name, possibly dotted with its module (`exception_type_name`).
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){0,15}")
_MAX_TYPE_NAME = 128


class BoundedValues:
    """Distinct values kept up to `cap` per process; any value past it is `other`."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def label(self, value: str) -> str:
        if value in self._kept:
            return value
        with self._lock:
            if len(self._kept) < self.cap:
                self._kept.add(value)
                return value
        return OTHER


_NAMESPACED_KINDS = BoundedValues(MAX_NAMESPACED_KINDS)
_FAILURE_TYPES = BoundedValues(MAX_FAILURE_TYPES)


def failure_kind_label(kind: str) -> str:
    """`kind` as a metric label: registered kinds as they are, `unregistered` for a kind this version
    does not know, namespaced kinds within the cap, else `other`."""
    if is_registered(kind):
        return kind
    if kind.startswith(UNREGISTERED_KIND_PREFIX) or not is_namespaced(kind):
        return UNREGISTERED
    return _NAMESPACED_KINDS.label(kind)


def failure_type_label(type_name: str) -> str:
    """An exception type name as a metric label: within the cap, else `other` (so is anything that
    is no class name)."""
    if len(type_name) > _MAX_TYPE_NAME or _TYPE_NAME.fullmatch(type_name) is None:
        return OTHER
    if redact(type_name) != type_name:  # a peer's "type" shaped like a credential is no label
        return OTHER
    return _FAILURE_TYPES.label(type_name)
