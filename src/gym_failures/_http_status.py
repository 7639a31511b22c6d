"""HTTP status classes: the one place that says which statuses are evidence, errors, client or server errors.

Every check of a status's class in the package goes through these helpers, so "is this a 5xx" means
the same everywhere. Each takes any object and answers only for a real `int` (never a `bool`, a float
or a string: a peer's or a row's odd status is no evidence), so a caller never checks the type first.

- `http_status`: a status at all (100-599), else `None`.
- `error_status`: a failed reply's status (400-599), else `None`.
- `is_success` (2xx), `is_error` (4xx or 5xx), `is_client_error` (4xx), `is_server_error` (5xx).
- `is_failed_reply`: 400 or more, as a library's `raise_for_status` reads a reply (600 and past too).
- `CLIENT_ERRORS` and `SERVER_ERRORS`: the ranges, for a table with one entry per status.
"""

from __future__ import annotations

CLIENT_ERRORS = range(400, 500)
"""Every 4xx status."""
SERVER_ERRORS = range(500, 600)
"""Every 5xx status."""


def http_status(value: object) -> int | None:
    """`value` when it is a real int HTTP status (100-599); anything else is no evidence."""
    return value if type(value) is int and 100 <= value <= 599 else None


def error_status(value: object) -> int | None:
    """`value` when it is a real int HTTP error status (400-599), else `None`."""
    return value if type(value) is int and 400 <= value <= 599 else None


def is_success(value: object) -> bool:
    """Whether `value` is a real int 2xx status."""
    return type(value) is int and 200 <= value <= 299


def is_error(value: object) -> bool:
    """Whether `value` is a real int error status (4xx or 5xx)."""
    return type(value) is int and 400 <= value <= 599


def is_client_error(value: object) -> bool:
    """Whether `value` is a real int 4xx status."""
    return type(value) is int and 400 <= value <= 499


def is_server_error(value: object) -> bool:
    """Whether `value` is a real int 5xx status."""
    return type(value) is int and 500 <= value <= 599


def is_failed_reply(value: object) -> bool:
    """Whether a reply with status `value` failed, as the HTTP libraries' own `raise_for_status` read
    it: any real int status of 400 or more, one past 599 (no HTTP status) included."""
    return type(value) is int and value >= 400
