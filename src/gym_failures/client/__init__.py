"""Caller side: rebuild the failure another Gym server replied with, map transport errors, retry model calls.

Works with an aiohttp `ClientResponse`, an httpx `Response` and an httpx2 `Response` (extras
`gym-failures[aiohttp]`, `gym-failures[httpx]`). Importing this package imports none of them: each
one's module here is imported on the first reply or error of that library the helpers see.

- `raise_boundary_failure(response, boundary=...)` observes the reply's report into the current request
  log (success or failure) and, on a non-2xx reply, raises the rebuilt remote failure (same event id,
  kind, boundary, stage and causes) with the HTTP exchange kept apart in `failure.http_details`. A
  failed reply without a report raises a failure built from the caller's own evidence: the status is
  recorded as `http_status`, never turned into a kind (classification projects it when reporting).
- `raise_for_status(response)` is the compatibility path: on a 4xx/5xx it raises what the library's
  own `raise_for_status` would (`aiohttp.ClientResponseError`, `httpx.HTTPStatusError`; precisely
  their subclasses `GymClientResponseError`, `GymHTTPStatusError`), so existing `except` blocks keep
  working, carrying `.failure` and `.content`.
- `status_error_failure(error)` is the remote failure a library's own status error names, rebuilt
  from the reply's headers it kept: an `aiohttp.ClientResponseError` from `response.raise_for_status()`
  or NeMo Gym's `raise_for_status`, an httpx `HTTPStatusError`. The server middleware applies it to
  a handler's exception, so such call sites keep the cause chain unchanged.
- `map_transport_errors(boundary, ...)` turns connection, reset, timeout and DNS errors into Gym
  failures of the transport kinds, raised `from` the original exception.
- `observe_attempts(http_client)` plugs into the official OpenAI and Anthropic SDKs (their
  `http_client`): every attempt they make is observed, sent with its logical call's headers
  (`gym_failures.calls`), and its outcome kept as its call's (an attempt that got no reply
  included); `sdk_failure(error)` turns an SDK exception
  into the Gym failure it stands for; `observed_failure(stream)` is a stream's cut (see `_sdk`).
- `stream_failure(reader)` is the failure a stream ended in: its failed terminal event's, or its cut
  when it ended without a terminal event.
- `observe_usage(reply)` adds the tokens a model reply reports (its `usage`, in the OpenAI Responses,
  Chat Completions or Anthropic Messages shape) to the request's sums, which the server middleware
  sends with the request's model calls (`X-Gym-Model-Calls`); `observe_attempts` does it for every
  plain JSON reply, a reply counted once however often it is observed (`gym_failures._usage`).
- `retry_model_call(call, ...)` runs a model call with finite attempts and a total time budget,
  recording each failed attempt (`observe_failure`) and the terminal outcome (`observe_model_operation`).

Outside a Gym server request there is no log to observe into; a caller that wants the observations
(collection does) opens one with `RequestFailureLog.capture()`.

Where things live::

    client/__init__.py    the public names; the two library error types load on first use
    client/_reply.py      reply decoding: raise_boundary_failure, raise_for_status, body, Retry-After
    client/_transport.py  map_transport_errors: the table from an error's type to (kind, delivery)
    client/_retry.py      retry_model_call: attempts, time budget, backoff, what may be replayed
    client/_libraries.py  what a library's module provides; which library an object comes from
    client/_aiohttp.py    aiohttp: reply facts, bounded body read, GymClientResponseError, its errors
    client/_httpx.py      httpx: reply facts, bounded body read, GymHTTPStatusError, its errors
    client/_httpx2.py     httpx2 (the OpenAI and Anthropic SDKs' httpx), read as httpx is
    client/_httpx_api.py  library_for: httpx's API read for httpx and httpx2 alike, importing neither
    client/_sdk.py        the official SDKs: observe_attempts, sdk_failure, observed_failure
    client/_calls.py      the logical calls the SDK hook and the helpers see: headers, outcomes
    client/_observed_transport.py  an SDK client's transport: an attempt that got no reply recorded
    client/_stream.py     stream_failure: a failed or cut stream as the failure to raise
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from gym_failures._usage import observe_usage
from gym_failures.client._reply import (
    DEFAULT_KIND_BY_BOUNDARY,
    raise_boundary_failure,
    raise_for_status,
    status_error_failure,
)
from gym_failures.client._retry import retry_model_call
from gym_failures.client._sdk import observe_attempts, observed_failure, sdk_failure
from gym_failures.client._stream import stream_failure
from gym_failures.client._transport import map_transport_errors

if TYPE_CHECKING:
    from gym_failures.client._aiohttp import GymClientResponseError as GymClientResponseError
    from gym_failures.client._httpx import GymHTTPStatusError as GymHTTPStatusError
    from gym_failures.client._httpx2 import GymHttpx2StatusError as GymHttpx2StatusError

# The library error types are left out: each exists only with its extra installed, and `import *`
# must not fail without it. They are reached by name, through `__getattr__`.
__all__ = [
    "DEFAULT_KIND_BY_BOUNDARY",
    "map_transport_errors",
    "observe_attempts",
    "observe_usage",
    "observed_failure",
    "raise_boundary_failure",
    "raise_for_status",
    "retry_model_call",
    "sdk_failure",
    "status_error_failure",
    "stream_failure",
]

_LAZY = {
    "GymClientResponseError": "gym_failures.client._aiohttp",
    "GymHTTPStatusError": "gym_failures.client._httpx",
    "GymHttpx2StatusError": "gym_failures.client._httpx2",
}


def __getattr__(name: str) -> object:
    # PEP 562: a library's module costs that library's import (aiohttp about 70 ms, httpx about 30 ms),
    # so it is loaded on first use; without the library installed, its ModuleNotFoundError names what
    # is missing. The type is not stored in this namespace: it would be a class of this module's own
    # (`__module__`) left out of `__all__` on purpose, which `tests/test_exported_members.py` refuses.
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(importlib.import_module(_LAZY[name]), name)
    return value
