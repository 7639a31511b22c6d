"""Which HTTP library an object comes from, and that library's module here, imported on first use.

An object of aiohttp, httpx or httpx2 can exist only once its library is imported, so an object's own classes
tell its library without importing anything; the library's module here (`_aiohttp`, `_httpx`) is
imported on the first such object, and a caller that uses one library never pays for the other.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping

from gym_failures.client._library_types import HttpLibrary

__all__ = ["MODULE_BY_LIBRARY", "library_of", "reply_library"]

MODULE_BY_LIBRARY: Mapping[str, str] = {
    "aiohttp": "gym_failures.client._aiohttp",
    "httpx": "gym_failures.client._httpx",
    # A separate package with httpx's API, which current OpenAI and Anthropic SDKs are built on.
    "httpx2": "gym_failures.client._httpx2",
}
"""Every HTTP library the client helpers support, by its top-level package, and its module here. A
library added here is added to `_reply.Response` and to the tests' clients (`tests/client/servers.py`)."""


def library_of(obj: object) -> HttpLibrary | None:
    """The library `obj` (a reply or an error) comes from, its module imported now; None for any other.

    The whole class hierarchy is searched, so a subclass defined outside the library is still its own.
    """
    for cls in type(obj).__mro__:
        module = MODULE_BY_LIBRARY.get(cls.__module__.partition(".")[0])
        if module is not None:
            return _loaded(module)
    return None


@functools.cache
def _loaded(module: str) -> HttpLibrary:
    # Cached: every reply passes here, and `import_module` of a loaded module costs about 1 us.
    library: HttpLibrary = importlib.import_module(module).LIBRARY
    return library


def reply_library(response: object) -> HttpLibrary:
    """The library of `response`: an aiohttp `ClientResponse`, an httpx or an httpx2 `Response`."""
    library = library_of(response)
    if library is None or not isinstance(response, library.response_type):
        raise TypeError(f"not an aiohttp, httpx or httpx2 response: {type(response).__name__}")
    return library
