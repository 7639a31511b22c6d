"""httpx2's replies and errors, imported on the first httpx2 object the client helpers see.

httpx2 is a package separate from httpx with the same API; current releases of the official OpenAI
and Anthropic SDKs are built on it, so their responses, errors and `DefaultHttpxClient` are httpx2's.
It is read as httpx is (`_httpx_api.library_for`), without importing httpx: the SDKs bring httpx2 alone.
"""

from __future__ import annotations

import httpx2

from gym_failures.client._httpx_api import library_for
from gym_failures.failures import NgFailureEvent

__all__ = ["LIBRARY", "GymHttpx2StatusError"]


class GymHttpx2StatusError(httpx2.HTTPStatusError):
    """`httpx2.HTTPStatusError` carrying the rebuilt Gym failure and the reply's content."""

    __module__ = "gym_failures.client"

    def __init__(self, response: httpx2.Response, failure: NgFailureEvent, content: bytes):
        url = failure.http_details.url if failure.http_details else ""
        super().__init__(
            f"{response.status_code} {response.reason_phrase} for url {url!r}: {failure}",
            request=response.request,
            response=response,
        )
        self.failure = failure
        self.content = content


LIBRARY = library_for(httpx2, GymHttpx2StatusError)
