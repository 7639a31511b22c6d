"""Relaying a stream: server-sent events passed on unchanged while their failure report is read.

Documented, and reached, as `gym_failures.asgi.relay_stream` and `gym_failures.asgi.sse_event`. A
relay passes a stream on byte for byte with `relay_stream`, which reads the stream's terminal report
(`gym_failures.failure_transport.StreamFailureReportReader`) and observes it into the current request's
log; a server writes one event with `sse_event`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

from gym_failures.failure_records import FailureReport
from gym_failures.failure_transport import StreamFailureReportReader


def sse_event(event: str, data: Mapping[str, Any]) -> bytes:
    """One server-sent event, `event:` and one `data:` line of compact JSON."""
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event}\ndata: {payload}\n\n".encode()


async def relay_stream(
    chunks: AsyncIterable[bytes], *, reader: StreamFailureReportReader | None = None
) -> AsyncIterator[bytes]:
    """Yield `chunks` unchanged while reading the stream's terminal failure report; when the stream
    ends (or the consumer stops), observe that report into the current request's log.

    Pass your own `reader` to know afterwards how the stream ended: `reader.terminal_seen` is whether
    it had its terminal event, and `gym_failures.client.stream_failure(reader)` the failure to raise
    when it was cut or failed."""
    reader = StreamFailureReportReader() if reader is None else reader
    iterator = aiter(chunks)
    observed: FailureReport | None = None
    try:
        async for chunk in iterator:
            reader.feed(chunk)
            if reader.report is not observed:
                # At once: a consumer that stops after the terminal event may close us much later.
                reader.observe()
                observed = reader.report
            yield chunk
    finally:
        reader.finish()
        if reader.report is not observed:
            reader.observe()
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
