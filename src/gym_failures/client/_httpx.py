"""httpx's replies and errors, imported on the first httpx object the client helpers see (read by
`_httpx_api.library_for`, as httpx2's are)."""

from __future__ import annotations

import httpx

from gym_failures.client._httpx_api import library_for
from gym_failures.failures import NgFailureEvent

__all__ = ["LIBRARY", "TRANSPORT_ERRORS", "GymHTTPStatusError"]


class GymHTTPStatusError(httpx.HTTPStatusError):
    """`httpx.HTTPStatusError` carrying the rebuilt Gym failure and the reply's content."""

    # Its public home, where `__getattr__` serves it: the type name a failure records for it
    # (`exception_type`) and a traceback shows stays what it was before the package split.
    __module__ = "gym_failures.client"

    def __init__(self, response: httpx.Response, failure: NgFailureEvent, content: bytes):
        url = failure.http_details.url if failure.http_details else ""
        super().__init__(
            f"{response.status_code} {response.reason_phrase} for url {url!r}: {failure}",
            request=response.request,
            response=response,
        )
        self.failure = failure
        self.content = content


LIBRARY = library_for(httpx, GymHTTPStatusError)
TRANSPORT_ERRORS = LIBRARY.transport_errors
