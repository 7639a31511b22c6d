"""The event loop a command runs its coroutine on: uvloop's when uvloop is installed, else asyncio's.

`gym-failures collect` and `demo` (its launcher and each of its servers) run on `run`. Ray's async
actors, the `collect --ray` workers, take uvloop by themselves when it is installed (Ray's
`get_new_event_loop`, switched off by Ray's `RAY_USE_UVLOOP=0`). The extras that run these install
uvloop (`cli`, `demo`, `ray`), and httptools for the demo's servers: uvicorn's `--http auto` takes it
when it is installed.

Decisions:
- uvloop when it imports, with no setting needed: it is what the extras install, and the loop is
  the commands' own (no library code depends on which loop runs it). `GYM_FAILURES_LOOP=asyncio`
  keeps asyncio's loop, to debug with asyncio's debug mode or where uvloop misbehaves; any other
  value is the default.
- uvloop's loop is made through `asyncio.Runner(loop_factory=...)`, not by installing its policy,
  so nothing else in the process (a library's own `asyncio.run`) changes loop behind its back.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LOOP_ENV", "loop_factory", "run"]

LOOP_ENV = "GYM_FAILURES_LOOP"
"""`asyncio` keeps asyncio's own event loop even where uvloop is installed."""

_T = TypeVar("_T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's `new_event_loop` when uvloop is installed and not switched off, else `None`."""
    if os.environ.get(LOOP_ENV, "").strip().lower() == "asyncio":
        return None
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """`asyncio.run(main)`, on uvloop's loop when it is installed."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
